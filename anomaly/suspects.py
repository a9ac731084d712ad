"""What the localization suspects, most likely first, and the API that gathers every source.

Each :class:`Suspect` names a component (``rank``, ``host``, ``nic``, ``link``, ``switch``; or
``path``, the probes between two hosts, when no topology is given to resolve it into links)
with a ``score``: how far it stands out from the noise as a robust z-score (for tomography,
the signed root of its log-likelihood ratio, on the same scale). :func:`to_json` gives::

    {"suspects": [{"kind": "nic", "name": "h17/nic0", "rank": null, "host": "h17",
                   "score": 41.2, "evidence": {...}}, ...]}

most likely first; the list is empty when nothing stands out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["KINDS", "Suspect", "diagnose", "to_json"]

KINDS = ("rank", "host", "nic", "link", "switch", "path")


@dataclass(frozen=True)
class Suspect:
    """A component that may be at fault, with how strongly (``score``) and why (``evidence``)."""

    kind: str
    name: str
    score: float
    rank: int | None = None
    host: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"suspect kind {self.kind!r} is not one of {KINDS}")


def to_json(suspects: list[Suspect]) -> dict[str, list[dict[str, Any]]]:
    """``{"suspects": [...]}``, most likely (highest score) first."""
    ordered = sorted(suspects, key=lambda s: -s.score)
    return {"suspects": [{"kind": s.kind, "name": s.name, "rank": s.rank, "host": s.host,
                          "score": round(float(s.score), 3), "evidence": s.evidence} for s in ordered]}


def diagnose(run: Any = None, probe_matrix: Any = None, topology: Any = None) -> list[Suspect]:
    """Suspects from every source given, most likely first; empty when nothing stands out.

    ``run``: a run directory (path or :class:`dpro.run_format.Run`): compute stragglers and slow
    transfers from its traces, ranks with slow steps from its step times. ``probe_matrix``:
    pairwise probes (:class:`dpro.anomaly.probes.Probes`, an ``n × n`` bandwidth matrix whose
    hosts are the topology's, or a file for :func:`dpro.anomaly.probes.read_probes`).
    ``topology``: a graph or a file for :func:`dpro.anomaly.topology.read_topology`; with
    probes, tomography names NICs, links and switches, else the probe matrix alone names hosts
    and paths. A NIC or host suspect lists the run's ranks on that host.
    """
    import networkx as nx
    import numpy as np

    from dpro.graph.dataflow import clock_offsets, load_run_traces
    from dpro.run_format import Run, open_run

    from . import probes as probe_analysis
    from . import stragglers, tomography
    from .topology import hosts as topology_hosts
    from .topology import read_topology

    suspects: list[Suspect] = []
    rank_hosts: dict[int, str | None] = {}
    if run is not None:
        run = run if isinstance(run, Run) else open_run(run)
        rank_hosts = {r: run.rank_meta(r).get("host") for r in run.ranks}
        if any(run.trace_path(r) is not None for r in run.ranks):
            traces, offsets = load_run_traces(run), clock_offsets(run)
            suspects += stragglers.stragglers(traces, offsets, rank_hosts)
            suspects += stragglers.slow_transfers(traces, offsets, rank_hosts)
        suspects += stragglers.step_stragglers(run)
    if topology is not None and not isinstance(topology, nx.Graph):
        topology = read_topology(topology)
    if probe_matrix is not None:
        if isinstance(probe_matrix, np.ndarray):
            names = topology_hosts(topology) if topology is not None else None
            probe_matrix = probe_analysis.from_matrix(probe_matrix, names)
        elif not isinstance(probe_matrix, probe_analysis.Probes):
            probe_matrix = probe_analysis.read_probes(probe_matrix)
        if topology is not None:
            suspects += tomography.localize(topology, probe_matrix)
        else:
            suspects += probe_analysis.analyze(probe_matrix)
    return [_with_ranks(s, rank_hosts) for s in _strongest(suspects)]


def _strongest(suspects: list[Suspect]) -> list[Suspect]:
    """One suspect per (kind, name), the highest score, most likely first."""
    best: dict[tuple[str, str], Suspect] = {}
    for s in suspects:
        key = (s.kind, s.name)
        if key not in best or s.score > best[key].score:
            best[key] = s
    return sorted(best.values(), key=lambda s: -s.score)


def _with_ranks(suspect: Suspect, rank_hosts: dict[int, str | None]) -> Suspect:
    """A NIC or host suspect with the ranks that ran on its host, when the run tells."""
    ranks = [r for r, h in sorted(rank_hosts.items()) if h is not None and h == suspect.host]
    if suspect.kind not in ("nic", "host") or not ranks or "ranks" in suspect.evidence:
        return suspect
    return Suspect(suspect.kind, suspect.name, suspect.score, suspect.rank, suspect.host,
                   {**suspect.evidence, "ranks": ranks})
