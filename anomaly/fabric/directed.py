"""Localization of direction-specific faults on a fabric whose ECMP choices are unseen.

A cable can be slow one way only (a bad transmitter, a congested egress queue), so every cable
is two components here, one per direction, and a probe from ``a`` to ``b`` crosses only the
``a``-to-``b`` direction of the cables on its path. The prober cannot see which equal-cost path
a probe took, so a probe *may* cross the directed links on any of its shortest paths and *must*
cross those on all of them.

Directed links that every probe may cross alike (the same slow probes, the same good ones) are
one class: no probe can tell them apart. Greedily, the class that explains the most unexplained
slow probes per good probe that surely crossed it (``1 +`` that count) is taken, while it
explains at least ``min_slow`` of them and more than the good probes that surely crossed it;
its slow probes are then explained. A NIC's access cable stands for the NIC. Meant for the
hundreds of hosts a health check probes; paths come from networkx, not the vectorised routing
of :mod:`dpro.anomaly.fabric.routing`.
"""

from __future__ import annotations

from collections import defaultdict

import networkx as nx
import numpy as np

from dpro.anomaly.fabric.probes import ProbeError, Probes, slow
from dpro.anomaly.fabric.topology import host_nic
from dpro.anomaly.suspects import Suspect

__all__ = ["localize_directed"]

MIN_SLOW = 2


def localize_directed(topology: nx.MultiGraph, probes: Probes, slow_mask: np.ndarray | None = None,
                      min_slow: int = MIN_SLOW) -> list[Suspect]:
    """Suspect directed links (kind ``link``) and NICs (kind ``nic``), most likely first; each
    names the direction (``from``, ``to``) and the directed links no probe tells apart from it
    (``same_as``)."""
    missing = [h for h in probes.hosts if h not in topology]
    if missing:
        raise ProbeError(f"probed host {missing[0]!r} is not in the topology")
    is_slow = slow(probes) if slow_mask is None else np.asarray(slow_mask, bool)
    graph = nx.Graph(topology)
    nics = {h: host_nic(topology, h) for h in probes.hosts}
    may: dict[tuple[str, str], set[int]] = defaultdict(set)
    must_good: dict[tuple[str, str], int] = defaultdict(int)
    for p, (s, d) in enumerate(zip(probes.src, probes.dst)):
        routes = [list(zip(path, path[1:])) for path in nx.all_shortest_paths(graph, nics[probes.hosts[s]],
                                                                              nics[probes.hosts[d]])]
        crossed = set().union(*map(set, routes))
        for edge in crossed:
            may[edge].add(p)
        if not is_slow[p]:
            for edge in set.intersection(*map(set, routes)):
                must_good[edge] += 1
    classes: dict[frozenset[int], list[tuple[str, str]]] = defaultdict(list)
    for edge, crossing in may.items():
        classes[frozenset(crossing)].append(edge)
    unexplained = set(np.flatnonzero(is_slow).tolist())
    suspects = []
    while unexplained:
        best, best_key = None, (0.0, 0)
        for crossing, edges in classes.items():
            explained = len(crossing & unexplained)
            sure_good = min(must_good[e] for e in edges)
            if explained < min_slow or explained <= sure_good:
                continue
            key = (explained / (1 + sure_good), explained)
            if key > best_key:
                best, best_key = crossing, key
        if best is None:
            break
        suspects.append(_suspect(topology, classes[best], best_key[0], len(best & unexplained),
                                 len(best) - len(best & set(np.flatnonzero(is_slow).tolist()))))
        unexplained -= best
    return suspects


def _suspect(topology: nx.MultiGraph, edges: list[tuple[str, str]], score: float, explained: int,
             good_may: int) -> Suspect:
    edges = sorted(edges, key=lambda e: (topology.nodes[e[0]].get("kind") == "switch" and
                                         topology.nodes[e[1]].get("kind") == "switch", e))
    a, b = edges[0]
    nic = next((n for n in (a, b) if topology.nodes[n].get("kind") == "nic"), None)
    evidence = {"from": a, "to": b, "slow_probes_explained": explained, "good_probes_that_may_cross": good_may,
                "same_as": [f"{u}->{v}" for u, v in edges[1:]]}
    if nic is not None:
        host = next(n for n in topology[nic] if topology.nodes[n].get("kind") == "host")
        evidence["direction"] = "sending" if a == nic else "receiving"
        return Suspect("nic", nic, score, host=host, evidence=evidence)
    return Suspect("link", f"{a}->{b}", score, evidence=evidence)
