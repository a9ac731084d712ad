"""The workload space a search walks: the :class:`Workload` features an engine supports, each
with a domain, a benign baseline, and moves that change one feature at a time.

Ordered features (sizes, counts, depths, MTU) move by one or two steps along their domain, which
for sizes and counts is a log scale; categorical ones (opcode, direction, transport, placement)
jump to any other value. A workload the :class:`Workload` rules reject (``batch > queue_depth``,
more SGEs than bytes) or that needs something the engine lacks is never proposed.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from dpro.anomaly.engines.base import TRANSPORTS, Direction, Engine, Opcode, Workload

ORDERED_DOMAINS: dict[str, tuple[Any, ...]] = {
    "message_size": tuple(2**i for i in range(8, 21)),  # 256 B .. 1 MiB
    "connections": (1, 2, 4, 8, 16, 32),
    "batch": (1, 2, 4, 8, 16),
    "queue_depth": (1, 2, 4, 8, 16, 32, 64, 128),
    "sges": (1, 2, 4, 8),
    "mtu": (None, 256, 512, 1024, 2048, 4096),  # None: the engine's default
}
CATEGORICAL = ("opcode", "direction", "transport", "placement")
FEATURES = ("message_size", "connections", "batch", "queue_depth", "sges", "mtu", *CATEGORICAL)
_PROPOSALS = 50  # tries at a valid neighbour or random workload before giving up


@dataclass(frozen=True)
class Feature:
    """One :class:`Workload` field the search varies, with the values it may take."""

    name: str
    values: tuple[Any, ...]
    ordered: bool


def plain(value: Any) -> Any:
    """A feature value as JSON holds it (enums by their value)."""
    return value.value if isinstance(value, Enum) else value


class WorkloadSpace:
    """Workloads made of ``features`` (the rest as in ``baseline``) that ``supported`` allows."""

    def __init__(self, features: Sequence[Feature], baseline: Workload, supported: frozenset[str]) -> None:
        self.features = {f.name: f for f in features}
        self.supported = supported
        if not self.valid(baseline):
            raise ValueError(f"the baseline workload is not valid for this engine: {baseline}")
        self.baseline = baseline

    @classmethod
    def for_engine(cls, engine: Engine, *, only: Iterable[str] | None = None,
                   domains: Mapping[str, Sequence[Any]] | None = None,
                   baseline: Workload | None = None) -> WorkloadSpace:
        """The space of what ``engine`` supports (``supported_features()``): every feature with two or
        more possible values, or just those named in ``only``. ``domains`` replaces default domains
        (``{"message_size": [4096, 65536]}``). ``baseline`` (default: :class:`Workload`'s defaults,
        snapped into the domains) is the benign workload that minimal feature sets are relative to."""
        supported = engine.supported_features()
        domains = dict(domains or {})
        available = {name: _engine_domain(name, supported) for name in FEATURES}
        names = [n for n in FEATURES if len(available[n]) > 1] if only is None else list(dict.fromkeys(only))
        for name in dict.fromkeys([*names, *domains]):
            if name not in FEATURES:
                raise ValueError(f"no workload feature {name!r}; known: {', '.join(FEATURES)}")
            if len(available[name]) < 2:
                raise ValueError(f"the {engine.name} engine cannot vary {name}")
            if name not in names:
                raise ValueError(f"a domain is given for {name}, which is not searched")
        features = []
        for name in names:
            values = tuple(dict.fromkeys(_coerce(name, v) for v in domains.get(name, available[name])))
            if not values:
                raise ValueError(f"the domain of {name} is empty")
            if name in CATEGORICAL and (unsupported := [v for v in values if v not in available[name]]):
                raise ValueError(f"the {engine.name} engine does not support {name} = "
                                 f"{', '.join(str(plain(v)) for v in unsupported)}")
            ordered = name in ORDERED_DOMAINS
            if ordered:
                values = tuple(sorted(values, key=lambda v: -1 if v is None else v))
            features.append(Feature(name, values, ordered))
        if baseline is None:
            try:
                baseline = replace(Workload(), **{f.name: _snap(f, getattr(Workload(), f.name)) for f in features})
            except ValueError as e:
                raise ValueError(f"these domains hold no baseline workload: {e}") from None
        return cls(features, baseline, supported)

    @property
    def names(self) -> list[str]:
        return list(self.features)

    def values(self, workload: Workload) -> dict[str, Any]:
        """The space's features of ``workload``."""
        return {name: getattr(workload, name) for name in self.features}

    def differences(self, workload: Workload) -> dict[str, Any]:
        """The features where ``workload`` differs from the baseline, with its values."""
        return {n: v for n, v in self.values(workload).items() if v != getattr(self.baseline, n)}

    def valid(self, workload: Workload) -> bool:
        """Whether the engine can run ``workload``."""
        return workload.features() <= self.supported

    def with_values(self, workload: Workload, **values: Any) -> Workload | None:
        """``workload`` with some features changed; None when that is not a valid workload."""
        try:
            changed = replace(workload, **values)
        except ValueError:
            return None
        return changed if self.valid(changed) else None

    def neighbour(self, workload: Workload, rng: random.Random,
                  weights: Mapping[str, float] | None = None) -> Workload | None:
        """``workload`` with one feature moved, chosen in proportion to ``weights`` (default: uniformly);
        None when no valid move was found."""
        movable = [f for f in self.features.values() if len(f.values) > 1]
        odds = [weights.get(f.name, 1.0) for f in movable] if weights else None
        for _ in range(_PROPOSALS if movable else 0):
            feature = rng.choices(movable, odds)[0]
            current = getattr(workload, feature.name)
            if feature.ordered:
                i = feature.values.index(_snap(feature, current))
                steps = [s for s in (-2, -1, 1, 2) if 0 <= i + s < len(feature.values)]
                value = feature.values[i + rng.choice(steps)]
            else:
                value = rng.choice([v for v in feature.values if v != current] or [current])
            if value != current and (moved := self.with_values(workload, **{feature.name: value})):
                return moved
        return None

    def random(self, rng: random.Random) -> Workload | None:
        """A valid workload with every feature drawn uniformly from its domain; None if none was found."""
        for _ in range(_PROPOSALS):
            drawn = self.with_values(self.baseline, **{n: rng.choice(f.values) for n, f in self.features.items()})
            if drawn:
                return drawn
        return None

    def to_dict(self) -> dict[str, Any]:
        """The features' domains and the baseline, JSON-ready."""
        return {"features": {n: [plain(v) for v in f.values] for n, f in self.features.items()},
                "baseline": self.baseline.to_dict()}


def _engine_domain(name: str, supported: frozenset[str]) -> tuple[Any, ...]:
    """The values of feature ``name`` an engine with ``supported`` features can run."""
    if name == "message_size":
        return ORDERED_DOMAINS[name]
    if name in ("connections", "batch", "queue_depth", "sges", "mtu"):
        return ORDERED_DOMAINS[name] if name in supported else ORDERED_DOMAINS[name][:1]
    if name == "opcode":
        return tuple(o for o in Opcode if f"opcode:{o.value}" in supported)
    if name == "direction":
        return tuple(d for d in Direction if f"direction:{d.value}" in supported)
    if name == "transport":
        return (None, *(t for t in TRANSPORTS if f"transport:{t}" in supported))
    return ("host", *(["cuda:0"] if "placement:cuda" in supported else []))  # placement


def _coerce(name: str, value: Any) -> Any:
    """A domain value given as text or JSON in the type of the :class:`Workload` field."""
    if name in ("opcode", "direction"):
        kind = Opcode if name == "opcode" else Direction
        try:
            return kind(plain(value))
        except ValueError:
            raise ValueError(f"{name} is one of {', '.join(k.value for k in kind)}, not {value!r}") from None
    if name in ("transport", "mtu") and value in (None, "", "none", "default"):
        return None
    if name in ORDERED_DOMAINS:
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} values are whole numbers, not {value!r}") from None
        if number < 1:
            raise ValueError(f"{name} values must be positive, not {value!r}")
        return number
    return str(value)


def _snap(feature: Feature, value: Any) -> Any:
    """``value`` if in the feature's domain, else the nearest value (ordered) or the first one."""
    if value in feature.values:
        return value
    if not feature.ordered or value is None:
        return feature.values[0]
    numbers = [v for v in feature.values if v is not None] or [feature.values[0]]
    return min(numbers, key=lambda v: abs(v - value))

