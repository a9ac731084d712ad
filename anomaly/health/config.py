"""``health.yaml``: what ``dpro health`` measures and how it judges. Every key is optional::

    backend: gloo                 # default: nccl where a GPU is, else gloo
    time_budget_s: 600            # the check's measuring stops here (what is left is cut, and said)
    collectives:
      ops: [all_reduce, all_gather, reduce_scatter, broadcast, all_to_all]
      sizes_mb: [1, 16]           # message sizes (nccl-tests' S: the whole buffer)
      iterations: 5               # timed, after one warm-up (fewer where they would pass seconds)
      seconds: 1.0                # each size's timed calls stop here; a size one call of which would take longer is cut
    pairwise:
      megabytes: 1                # per message
      seconds: 0.4                # of traffic per direction of each pair
      sweeps: 8                   # each round's repeats, sharing its seconds: each direction's
                                  # median is judged (over the job's connection a repeat takes the
                                  # same path: a fault slows each, other tenants' traffic some)
      routes: unknown             # or destination: the fabric routes by destination (InfiniBand's
                                  # fat-tree routing, host d over uplink d mod k, d the host's place
                                  # in the topology's natural order), so with the topology a round
                                  # carries as many pairs out of a pod as its uplinks, each pair both
                                  # ways at once, and the localizer trusts those paths
    topology: fabric.yaml         # the fabric (dpro diagnose's format): localize links, schedule probes
    baseline: baseline.yaml       # expected values; without it, learned from the history
    rules:
      degraded_pct: 10            # worse than the baseline by this much: degraded
      failed_pct: 50              # ... by this much: failed
      nights: 14                  # earlier runs the learned baseline looks at
      min_nights: 3               # fewer usable runs than this: no learned baseline
      line_rate_pct: 1            # with no baseline: a host's probes or the job's bus bandwidth
                                  # below this share of the NICs' line rate is degraded (0: off)

A baseline file maps ``check/metric`` to a value, for every host, and per host under ``hosts``::

    pairwise/send_gbps: 9.5
    hosts: {node7: {gpu0.clocks/sm_max_mhz: 1410}}
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from dpro.anomaly.fabric.follow_up import SWEEPS
from dpro.errors import DproError

__all__ = ["ALL_OPS", "HealthConfig", "HealthConfigError", "load_config"]

ALL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
ROUTES = ("unknown", "destination")


class HealthConfigError(DproError, ValueError):
    """A configuration or baseline file that cannot be used; names the file and the key."""


@dataclass(frozen=True)
class Collectives:
    ops: tuple[str, ...] = ALL_OPS
    sizes_mb: tuple[float, ...] = (1.0, 16.0)
    iterations: int = 5
    seconds: float = 1.0


@dataclass(frozen=True)
class Pairwise:
    megabytes: float = 1.0
    seconds: float = 0.4
    sweeps: int = SWEEPS
    routes: str = "unknown"


@dataclass(frozen=True)
class Rules:
    degraded_pct: float = 10.0
    failed_pct: float = 50.0
    nights: int = 14
    min_nights: int = 3
    line_rate_pct: float = 1.0


@dataclass(frozen=True)
class HealthConfig:
    """The parsed ``health.yaml`` (see the module docstring); paths are absolute."""

    backend: str | None = None
    time_budget_s: float = 600.0
    collectives: Collectives = field(default_factory=Collectives)
    pairwise: Pairwise = field(default_factory=Pairwise)
    rules: Rules = field(default_factory=Rules)
    topology: Path | None = None
    baseline: dict[str, dict[str, float]] = field(default_factory=dict)  # host ("*": all) -> key -> value

    def expected(self, host: str, key: str) -> float | None:
        """The baseline file's value of ``key`` (``check/metric``) on ``host``, if it has one."""
        return self.baseline.get(host, {}).get(key, self.baseline.get("*", {}).get(key))


def load_config(path: str | os.PathLike | None) -> HealthConfig:
    """The configuration in ``path`` (defaults when None); :class:`HealthConfigError` when it
    cannot be read or a key is unknown or of the wrong type."""
    if path is None:
        return HealthConfig()
    path = Path(path)
    spec = _read_yaml(path, "configuration")
    known = {"backend", "time_budget_s", "collectives", "pairwise", "rules", "topology", "baseline"}
    _no_unknown(spec, known, path, "")
    backend = spec.get("backend")
    if backend is not None and backend not in ("gloo", "nccl", "mpi", "ucc"):
        raise HealthConfigError(f"{path}: backend is gloo, nccl, mpi or ucc, not {backend!r}")
    budget = spec.get("time_budget_s", HealthConfig.time_budget_s)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0:
        raise HealthConfigError(f"{path}: time_budget_s is a positive number of seconds, not {budget!r}")
    collectives = _section(spec, "collectives", Collectives, path)
    unknown_ops = sorted(set(collectives.ops) - set(ALL_OPS))
    if unknown_ops:
        raise HealthConfigError(f"{path}: collectives.ops: unknown {unknown_ops[0]!r} (known: {', '.join(ALL_OPS)})")
    if any(s <= 0 for s in collectives.sizes_mb) or collectives.iterations < 1 or collectives.seconds <= 0:
        raise HealthConfigError(f"{path}: collectives.sizes_mb and seconds must be positive and iterations at least 1")
    pairwise = _section(spec, "pairwise", Pairwise, path)
    if pairwise.megabytes <= 0 or pairwise.seconds <= 0:
        raise HealthConfigError(f"{path}: pairwise.megabytes and pairwise.seconds must be positive")
    if pairwise.sweeps < 1:
        raise HealthConfigError(f"{path}: pairwise.sweeps must be at least 1, not {pairwise.sweeps}")
    if pairwise.routes not in ROUTES:
        raise HealthConfigError(f"{path}: pairwise.routes is one of {', '.join(ROUTES)}, not {pairwise.routes!r}")
    if pairwise.routes == "destination" and spec.get("topology") is None:
        raise HealthConfigError(f"{path}: pairwise.routes: destination needs the topology (the routes come from it)")
    rules = _section(spec, "rules", Rules, path)
    if not 0 < rules.degraded_pct <= rules.failed_pct or rules.min_nights < 1 or rules.nights < rules.min_nights \
            or not 0 <= rules.line_rate_pct < 100:
        raise HealthConfigError(f"{path}: rules: need 0 < degraded_pct <= failed_pct, 1 <= min_nights <= nights "
                                "and 0 <= line_rate_pct < 100")
    topology = _relative(path, spec.get("topology"), "topology")
    baseline_path = _relative(path, spec.get("baseline"), "baseline")
    return HealthConfig(backend, float(budget), collectives, pairwise, rules, topology,
                        read_baseline(baseline_path) if baseline_path else {})


def read_baseline(path: Path) -> dict[str, dict[str, float]]:
    """A baseline file (see the module docstring) as ``{host or "*": {check/metric: value}}``."""
    spec = _read_yaml(path, "baseline")
    per_host = spec.pop("hosts", {}) or {}
    if not isinstance(per_host, dict) or not all(isinstance(v, dict) for v in per_host.values()):
        raise HealthConfigError(f"{path}: hosts maps each host to {{check/metric: value}}")
    out = {"*": _values(spec, path)}
    out.update({str(h): _values(v, path) for h, v in per_host.items()})
    return out


def _values(spec: dict[str, Any], path: Path) -> dict[str, float]:
    out = {}
    for key, value in spec.items():
        if "/" not in str(key) or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise HealthConfigError(f"{path}: {key!r}: a baseline entry is check/metric: number")
        out[str(key)] = float(value)
    return out


def _read_yaml(path: Path, what: str) -> dict[str, Any]:
    import yaml

    try:
        spec = yaml.safe_load(path.read_text())
    except OSError as e:
        raise HealthConfigError(f"cannot read {what} {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise HealthConfigError(f"{path} is not YAML: {str(e).splitlines()[0]}") from None
    if spec is None:
        return {}
    if not isinstance(spec, dict):
        raise HealthConfigError(f"{path}: the {what} is a mapping of keys to values")
    return spec


def _no_unknown(spec: dict[str, Any], known: set[str], path: Path, where: str) -> None:
    unknown = sorted(set(map(str, spec)) - known)
    if unknown:
        raise HealthConfigError(f"{path}: unknown key {where}{unknown[0]!r} (known: {', '.join(sorted(known))})")


def _section(spec: dict[str, Any], name: str, cls: type, path: Path) -> Any:
    values = spec.get(name) or {}
    if not isinstance(values, dict):
        raise HealthConfigError(f"{path}: {name} is a mapping")
    defaults = cls()
    _no_unknown(values, {f.name for f in fields(cls)}, path, f"{name}.")
    out = {}
    for f in fields(cls):
        if f.name not in values:
            continue
        default, value = getattr(defaults, f.name), values[f.name]
        try:
            if isinstance(default, tuple):
                if not isinstance(value, list) or any(isinstance(v, bool) for v in value):
                    raise TypeError
                out[f.name] = tuple(type(default[0])(v) for v in value)
            elif isinstance(default, str):
                if not isinstance(value, str):
                    raise TypeError
                out[f.name] = value
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError
            else:
                out[f.name] = type(default)(value)
        except (TypeError, ValueError):
            raise HealthConfigError(f"{path}: {name}.{f.name} should be like {default!r}, not {value!r}") from None
    return cls(**out)


def _relative(config: Path, value: Any, key: str) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise HealthConfigError(f"{config}: {key} is a file path")
    path = (config.parent / value).resolve()
    if not path.is_file():
        raise HealthConfigError(f"{config}: {key} file {path} does not exist")
    return path
