"""Every source of suspects, gathered: the recorded run, its nodes' counters, pairwise probes and a topology."""

from __future__ import annotations

from typing import Any

import networkx as nx
import numpy as np

from dpro.anomaly.fabric import probes as probe_analysis
from dpro.anomaly.fabric.localize import localize
from dpro.anomaly.fabric.topology import hosts as topology_hosts
from dpro.anomaly.fabric.topology import read_topology
from dpro.analysis import RunAnalysis
from dpro.anomaly.run import nodes, stragglers
from dpro.anomaly.run.traffic_matrix import connection_suspects
from dpro.anomaly.suspects import Suspect, strongest

__all__ = ["diagnose"]


def diagnose(run: RunAnalysis | None = None, probe_matrix: Any = None, topology: Any = None) -> list[Suspect]:
    """Suspects from every source given, most likely first; empty when nothing stands out.

    ``run``: the run model of a recorded run (:class:`dpro.analysis.RunAnalysis`): compute
    stragglers and slow transfers from the collectives matched across its traces, ranks with
    slow steps from its step times, hosts whose share of the job's own TCP traffic was slow
    (:mod:`dpro.anomaly.run.traffic_matrix`), devices whose fault counters went up, GPUs that
    throttled and hosts whose hypervisor took their CPUs (:mod:`dpro.anomaly.run.nodes`).
    ``probe_matrix``: pairwise probes (:class:`dpro.anomaly.fabric.probes.Probes`, an ``n × n``
    bandwidth matrix whose hosts are the topology's, or a file for
    :func:`dpro.anomaly.fabric.probes.read_probes`).
    ``topology``: a graph or a file for :func:`dpro.anomaly.fabric.topology.read_topology`;
    with probes, the fabric's localizer (:mod:`dpro.anomaly.fabric.localize`) names NICs,
    links and switches one direction at a time, else the probe matrix alone names hosts and
    paths. A NIC or host suspect lists the run's ranks on that host.
    """
    suspects: list[Suspect] = []
    rank_hosts: dict[int, str] = {}
    if run is not None:
        rank_hosts = run.hosts
        if run.has_traces:
            instances = run.collectives
            suspects += stragglers.stragglers(instances, run.profiled_steps, rank_hosts)
            suspects += stragglers.slow_transfers(instances, rank_hosts)
        suspects += stragglers.step_stragglers(run.step_times, rank_hosts)
        suspects += connection_suspects(run.run)
        suspects += nodes.counter_faults(run.run)
        suspects += nodes.throttled_gpus(nodes.gpu_samples(run.run))
        suspects += nodes.stolen_cpu(run.run)
    if topology is not None and not isinstance(topology, nx.Graph):
        topology = read_topology(topology)
    if probe_matrix is not None:
        if isinstance(probe_matrix, np.ndarray):
            names = topology_hosts(topology) if topology is not None else None
            probe_matrix = probe_analysis.from_matrix(probe_matrix, names)
        elif not isinstance(probe_matrix, probe_analysis.Probes):
            probe_matrix = probe_analysis.read_probes(probe_matrix)
        suspects += localize(topology, probe_matrix)
    return [_with_ranks(s, rank_hosts) for s in strongest(suspects)]


def _with_ranks(suspect: Suspect, rank_hosts: dict[int, str]) -> Suspect:
    """A NIC, GPU or host suspect with the ranks that ran on its host, when the run tells."""
    ranks = [r for r, h in sorted(rank_hosts.items()) if h and h == suspect.host]
    if suspect.kind not in ("nic", "gpu", "host") or not ranks or "ranks" in suspect.evidence:
        return suspect
    return Suspect(suspect.kind, suspect.name, suspect.score, suspect.rank, suspect.host,
                   {**suspect.evidence, "ranks": ranks})
