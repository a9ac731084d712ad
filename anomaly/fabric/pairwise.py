"""Measure a pairwise bandwidth matrix between hosts with a traffic engine.

The rounds are the pairwise probes' one schedule (:func:`dpro.anomaly.fabric.schedule.probe_rounds`):
every pair once, in ``n - 1`` rounds (``n`` for odd ``n``) where no topology is given; given each
host's edge switch and pod, at most one pair a round leaves any of them, so that no two probes
of a round share a link. A round's pairs run at once, each one direction and then the other.

    >>> hosts = read_hosts("hosts.yaml")                                 # doctest: +SKIP
    >>> probes, results = measure(get_engine("tcp"), hosts, seconds=2)   # doctest: +SKIP
    >>> write_probes(probes, "probes.json")                              # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from dpro.errors import DproError

from dpro.anomaly.engines.base import Endpoint, Engine, Result, Workload
from dpro.anomaly.fabric.probes import Probes, to_matrix
from dpro.anomaly.fabric.schedule import probe_rounds


class PairwiseError(DproError):
    """A hosts file that cannot be used, or probes that all failed."""


def read_hosts(path: str | os.PathLike) -> dict[str, Endpoint]:
    """Hosts to probe from a YAML or JSON file::

        h0: {address: 10.0.0.1, prefix: [ssh, h0]}      # prefix: runs a command there
        h1: {address: 10.0.0.2, interface: eth0}
    """
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise PairwiseError(f"cannot read hosts {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict) or len(data) < 2:
        raise PairwiseError(f"{path}: expected a mapping of at least two hosts to {{address: ...}}")
    hosts = {}
    for name, spec in data.items():
        if not isinstance(spec, dict) or "address" not in spec:
            raise PairwiseError(f"{path}: host {name!r} has no address")
        prefix = spec.get("prefix") or []
        if isinstance(prefix, str):
            prefix = shlex.split(prefix)
        if not isinstance(prefix, list) or not all(isinstance(p, str) for p in prefix):
            raise PairwiseError(f"{path}: host {name!r}: prefix is a command line or a list of words, not {prefix!r}")
        hosts[str(name)] = Endpoint(str(spec["address"]), tuple(prefix), spec.get("interface"))
    return hosts


def measure(engine: Engine, hosts: dict[str, Endpoint], workload: Workload | None = None, seconds: float = 2.0,
            timeout_s: float = 20.0, rounds: int | None = None, tiers: Sequence[dict[str, str]] = ()
            ) -> tuple[Probes, list[dict[str, Any]]]:
    """Probe every ordered pair of ``hosts`` (the first ``rounds`` rounds only, if given);
    the bandwidth matrix (Gb/s) and every run's result. A failed probe is left out of the
    matrix and kept in the results with its errors. ``tiers``: host -> edge switch, host ->
    pod (:func:`dpro.anomaly.fabric.topology.probe_tiers`), to keep probes of a round apart."""
    names = list(hosts)
    workload = workload or Workload(message_size=1 << 20, connections=1)
    schedule = probe_rounds(len(names), [[tier.get(h, h) for h in names] for tier in tiers])[:rounds]
    src, dst, round_of, value, results = [], [], [], [], []

    def probe_pair(pair: tuple[int, int], k: int) -> list[tuple[int, int, int, Result]]:
        a, b = int(pair[0]), int(pair[1])
        return [(s, d, k, engine.run(workload, hosts[names[d]], hosts[names[s]], seconds, timeout_s))
                for s, d in ((a, b), (b, a))]

    with ThreadPoolExecutor(max_workers=max(1, len(names) // 2)) as pool:
        for k, pairs in enumerate(schedule):
            for done in pool.map(lambda p: probe_pair(p, k), pairs):
                for s, d, r, result in done:
                    results.append({"src": names[s], "dst": names[d], "round": r, **result.to_dict()})
                    if result.ok and result.throughput_gbps:
                        src.append(s), dst.append(d), round_of.append(r), value.append(result.throughput_gbps)
    if not value:
        errors = {e for r in results for e in r["errors"]}
        raise PairwiseError(f"every probe failed: {'; '.join(sorted(errors))[:300]}")
    probes = Probes(names, np.asarray(src), np.asarray(dst), np.asarray(round_of), np.asarray(value, np.float64))
    return probes, results


def write_probes(probes: Probes, path: str | os.PathLike) -> None:
    """Write the matrix as JSON (``{"hosts": [...], "bandwidth": [[...]]}``, null where not
    measured), the form :func:`dpro.anomaly.fabric.probes.read_probes` reads."""
    matrix = to_matrix(probes)
    cells = [[None if np.isnan(v) else float(v) for v in row] for row in matrix]
    Path(path).write_text(json.dumps({"hosts": probes.hosts, "bandwidth": cells, "unit": "Gb/s"}, indent=1))
