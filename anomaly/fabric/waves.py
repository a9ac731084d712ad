"""Probe rounds with few ECMP collisions: at most one pair leaves each switch, a few each pod.

With ECMP whose hash the prober cannot see, probes that leave one switch at once may hash onto
the same uplink and share it: in the circle schedule (:func:`dpro.anomaly.fabric.probes.round_robin`),
where all the hosts of a leaf probe at once, most probes of a round collide somewhere on a fat
tree. In a *wave* every host still probes one partner (both ways), but at most one pair leaves
each edge switch and at most ``leaving`` pairs each pod (edge switches cabled to the same
switches); the other hosts pair within their switch, or their pod. On a two-level fat tree no
link then carries two probes of a wave one way, whatever paths the hashes pick; on a three-level
one, neither with one pair per pod, while ``k`` pairs per pod meet on a pod's core links with
odds of about ``k / (radix / 2) ** 2`` each.

    >>> pairs, wave = waves(edge_groups(fat_tree(1024)), 512, np.random.default_rng(0), [8, 1])
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from dpro.anomaly.fabric.routing import Routing

__all__ = ["edge_groups", "waves"]


def edge_groups(topology: nx.MultiGraph, routing: Routing | None = None) -> list[np.ndarray]:
    """Per host (the routing's order): its pod, then its edge switch, as integer ids; the pod
    level is left out when there is a single pod (a two-level fat tree)."""
    routing = routing or Routing.build(topology)
    edge = routing.host_switch.astype(np.int64)
    kind = dict(topology.nodes(data="kind"))
    uplinks = {s: frozenset(n for n in topology[routing.switches[s]] if kind[n] == "switch") for s in np.unique(edge)}
    pod_ids = {key: i for i, key in enumerate(sorted(set(uplinks.values()), key=sorted))}
    pod = np.array([pod_ids[uplinks[s]] for s in edge], np.int64)
    return [edge] if len(pod_ids) == 1 else [pod, edge]


def waves(levels: list[np.ndarray], n_waves: int, rng: np.random.Generator,
          leaving: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Pairs ``(P, 2)`` of host indices and the wave of each: ``n_waves`` random waves (see the
    module docstring); ``levels`` gives each host's group, coarsest first (:func:`edge_groups`),
    and ``leaving`` how many pairs may leave a group of each level per wave (default 1 each)."""
    n = len(levels[0])
    leaving = leaving or [1] * len(levels)
    pairs, wave = [], []
    for w in range(n_waves):
        order = rng.permutation(n)
        free = np.ones(n, bool)
        busy = [np.zeros(int(g.max()) + 1, bool) for g in levels]  # groups no more pairs may leave
        parent = np.zeros(n, np.int64)
        chosen = []
        for depth, group in enumerate(levels):
            for _ in range(leaving[depth]):
                can = [~busy[d][levels[d][order]] for d in range(depth, len(levels))]
                hosts = order[free[order] & np.logical_and.reduce(can)]
                _, first = np.unique(group[hosts], return_index=True)
                out = hosts[first][rng.permutation(len(first))]  # one random host of each group
                matched = _pair_up(out[np.argsort(parent[out], kind="stable")], parent)
                chosen.append(matched)
                free[matched.ravel()] = False
                for finer in range(depth + 1, len(levels)):
                    busy[finer][levels[finer][matched.ravel()]] = True
            parent = group
        rest = order[free[order]]
        chosen.append(_pair_up(rest[np.argsort(parent[rest], kind="stable")], parent))
        pairs.append(np.concatenate(chosen))
        wave.append(np.full(len(pairs[-1]), w, np.int64))
    return np.concatenate(pairs), np.concatenate(wave)


def _pair_up(hosts: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Pairs of consecutive hosts of the same group (hosts sorted by group), ``(P, 2)``."""
    g = group[hosts]
    start = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    pos = np.arange(len(hosts)) - np.repeat(start, np.diff(np.r_[start, len(hosts)]))
    first = np.flatnonzero((pos % 2 == 0) & (np.r_[g[1:], -1] == g))
    return np.stack([hosts[first], hosts[first + 1]], axis=1)
