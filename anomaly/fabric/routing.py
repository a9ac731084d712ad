"""Routes between hosts as integer arrays, for many probes at once.

Hosts, links and switches of a topology get integer ids; :meth:`Routing.route` gives, for
arrays of source and destination hosts, the switch-to-switch links and the switches each probe
crosses. At each switch a probe takes one of the next hops on a shortest path to the
destination's switch, chosen by a hash of (source, destination, switch): per-hop ECMP, with a
choice the analysis can reproduce (InfiniBand's static routing, or probes that pin their path).
Given a random generator, each switch chooses uniformly at random instead: ECMP whose hash the
analysis cannot see (on a fat tree, every equal-cost path is then equally likely).

``Routing.build(topology, by="destination")`` routes by the destination instead, the way
InfiniBand's fat-tree routing fills the switches' forwarding tables (destination-mod-k): the
first hop with a choice takes next hop ``d mod k1`` of its ``k1``, the next ``(d // k1) mod k2``
of its ``k2``, and so on, ``d`` the destination's host index. On a full fat tree whose hosts are
numbered switch by switch (:func:`~dpro.anomaly.fabric.topology.fat_tree`), a link down
carries only probes for the destinations under it whose digits name that link's switch, one
host below the aggregation tier, one per core above it; a link up carries only probes for
destinations with one value of a digit. So a set of probes in which every host sends once and
receives once shares no link if the hosts of any one switch or pod send to destinations that
differ in the digits their uplinks are chosen by: the matchings of
:func:`dpro.anomaly.fabric.schedule.disjoint_rounds` (partners mirrored digit by digit) do.

**Paths** (:func:`paths`): a probe goes from the host's first NIC (by name) up through the
switches along a shortest path and down to the other host. With ``ecmp="all"`` every
equal-cost path is returned (parallel cables are distinct paths); with ``ecmp="hash"`` the one
path the hash picks.

    >>> r = Routing.build(fat_tree(128))
    >>> links, switches = r.route(np.array([0, 5]), np.array([127, 6]))
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import networkx as nx
import numpy as np

from dpro.anomaly.fabric.topology import TopologyError, access_links, edge_switch, host_nic, hosts

__all__ = ["CHUNK", "Routing", "paths"]

CHUNK = 1 << 19
"""Probes routed at a time: memory stays bounded whatever their number."""

_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9))


def _hash(src: np.ndarray, dst: np.ndarray, switch: np.ndarray) -> np.ndarray:
    """A well-mixed 64-bit hash of three integer arrays (splitmix64's finaliser)."""
    x = (src.astype(np.uint64) * _MIX[0]) ^ (dst.astype(np.uint64) * _MIX[1]) ^ (switch.astype(np.uint64) * _MIX[2])
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> np.uint64(33))


@dataclass(frozen=True)
class Routing:
    """Integer-indexed routes of one topology; build it with :meth:`build`.

    ``nics[h]``: the NIC host ``h`` probes through; ``host_links[h]``: ids of host ``h``'s two access links (host--NIC, NIC--switch);
    ``host_switch[h]``: the switch its NIC is cabled to. The next-hop tables are indexed by
    ``target[destination switch]``, the current switch and a choice below ``fanout``.
    """

    hosts: list[str]
    nics: list[str]
    links: list[str]
    switches: list[str]
    host_links: np.ndarray
    host_switch: np.ndarray
    target: np.ndarray
    next_switch: np.ndarray
    next_link: np.ndarray
    fanout: np.ndarray
    max_hops: int
    by: str = "hash"

    @classmethod
    def build(cls, topology: nx.MultiGraph, by: str = "hash") -> Routing:
        """Number the topology's hosts (natural order), links and switches, and compute next
        hops, chosen at each switch ``by`` a hash of the probe or by its ``"destination"``."""
        if by not in ("hash", "destination"):
            raise ValueError(f"routes are chosen by 'hash' or 'destination', not {by!r}")
        host_names = hosts(topology)
        if len(host_names) < 2:
            raise TopologyError("the topology has fewer than two hosts")
        links = [name for _, _, name in topology.edges(data="name")]
        link_id = {name: i for i, name in enumerate(links)}
        switches = sorted(n for n, kind in topology.nodes(data="kind") if kind == "switch")
        switch_id = {s: i for i, s in enumerate(switches)}
        nics = [host_nic(topology, h) for h in host_names]
        host_links = np.array([[link_id[n] for n in access_links(topology, h, nic)] for h, nic in zip(host_names, nics)],
                              np.int32)
        host_switch = np.array([switch_id[edge_switch(topology, nic)] for nic in nics], np.int32)
        fabric = [(switch_id[u], switch_id[v], link_id[name]) for u, v, name in topology.edges(data="name")
                  if u in switch_id and v in switch_id and u != v]
        u, v, lid = (np.array(c, np.int64).reshape(-1) for c in zip(*fabric)) if fabric else (np.zeros(0, np.int64),) * 3
        u, v, lid = np.concatenate([u, v]), np.concatenate([v, u]), np.concatenate([lid, lid])  # both directions
        goals = np.unique(host_switch)
        dist = _distances(len(switches), u, v, goals)
        unreachable = dist[:, goals] < 0
        if unreachable.any():
            t, s = np.argwhere(unreachable)[0]
            raise TopologyError(f"no path between switches {switches[goals[t]]} and {switches[goals[s]]}")
        target = np.full(len(switches), -1, np.int32)
        target[goals] = np.arange(len(goals))
        next_switch, next_link, fanout = _next_hops(dist, u, v, lid)
        return cls(host_names, nics, links, switches, host_links, host_switch, target, next_switch, next_link, fanout,
                   int(dist[:, goals].max()), by)

    def route(self, src: np.ndarray, dst: np.ndarray,
              rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Switch-to-switch links ``(P, max_hops)`` and switches ``(P, max_hops + 1)`` of each
        probe from host ``src[i]`` to host ``dst[i]``, padded with -1; next hops chosen as the
        routing was built to, or uniformly at random with ``rng``."""
        links, switches, _ = self._walk(np.asarray(src, np.int64), np.asarray(dst, np.int64), rng)
        return links, switches

    def choices(self, a: int, b: int) -> list[int]:
        """How many next hops host ``a``'s probe to host ``b`` chose among, at each switch that
        gave it more than one."""
        _, _, ways = self._walk(np.array([a], np.int64), np.array([b], np.int64), None)
        return [int(k) for k in ways[0] if k > 1]

    def _walk(self, src: np.ndarray, dst: np.ndarray,
              rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`route`'s links and switches, and how many next hops each hop chose among."""
        n, width = self.fanout.shape[1], self.next_switch.shape[2]
        cur, goal = self.host_switch[src].astype(np.int64), self.host_switch[dst]
        row = self.target[goal].astype(np.int64) * n
        links = np.full((len(src), self.max_hops), -1, np.int32)
        switches = np.full((len(src), self.max_hops + 1), -1, np.int32)
        ways_taken = np.ones((len(src), self.max_hops), np.int32)
        switches[:, 0] = cur
        fanout, next_switch, next_link = (a.reshape(-1) for a in (self.fanout, self.next_switch, self.next_link))
        digits = dst.copy()  # by destination: what is left of d once the earlier choices took theirs
        for hop in range(self.max_hops):  # at its goal a probe stays put (fanout 1, link -1)
            key = row + cur
            ways = fanout.take(key)
            if rng is not None:
                choice = (rng.random(len(src)) * ways).astype(np.int64)
            elif self.by == "destination":
                choice, digits = digits % ways, digits // ways
            else:
                choice = (_hash(src, dst, cur) % ways.astype(np.uint64)).astype(np.int64)
            at = key * width + choice
            links[:, hop] = next_link.take(at)
            ways_taken[:, hop] = ways
            cur = next_switch.take(at).astype(np.int64)
            switches[:, hop + 1] = np.where(links[:, hop] >= 0, cur, -1)
        return links, switches, ways_taken

    def path_names(self, a: str, b: str) -> list[str]:
        """The names of the links from host ``a`` to host ``b``, access links included."""
        i, j = self.hosts.index(a), self.hosts.index(b)
        links, _ = self.route(np.array([i]), np.array([j]))
        ids = [*self.host_links[i], *links[0][links[0] >= 0], *self.host_links[j][::-1]]
        return [self.links[k] for k in ids]


def _distances(n: int, u: np.ndarray, v: np.ndarray, goals: np.ndarray) -> np.ndarray:
    """Hop counts ``(len(goals), n)`` from each goal switch to every switch, -1 if unreachable
    (a breadth-first search from all goals at once)."""
    adjacency = np.zeros((n, n), np.float32)
    adjacency[u, v] = 1
    dist = np.full((len(goals), n), -1, np.int16)
    frontier = np.zeros((len(goals), n), np.float32)
    frontier[np.arange(len(goals)), goals] = 1
    level = 0
    while frontier.any():
        dist[frontier > 0] = level
        level += 1
        frontier = ((frontier @ adjacency) > 0) & (dist < 0)
        frontier = frontier.astype(np.float32)
    return dist


def _next_hops(dist: np.ndarray, u: np.ndarray, v: np.ndarray, lid: np.ndarray) -> tuple[np.ndarray, ...]:
    """For every target and switch, the equal-cost next switches and links toward the target."""
    targets, n = dist.shape
    order = np.lexsort((lid, u))  # edges by switch, then link id: the order of the choices
    u, v, lid = u[order], v[order], lid[order]
    on_path = (dist[:, u] >= 1) & (dist[:, v] == dist[:, u] - 1)
    t, e = np.nonzero(on_path)  # by target, then edge: grouped by (target, switch)
    group = t * n + u[e]
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    pos = np.arange(len(group)) - np.repeat(starts, np.diff(np.r_[starts, len(group)]))
    width = int(pos.max()) + 1 if len(pos) else 1
    next_switch = np.full((targets, n, width), -1, np.int32)
    next_link = np.full((targets, n, width), -1, np.int32)
    next_switch[t, u[e], pos] = v[e]
    next_link[t, u[e], pos] = lid[e]
    fanout = np.bincount(group, minlength=targets * n).reshape(targets, n).astype(np.int32)
    home = np.argwhere(dist == 0)  # at the target itself: stay there
    next_switch[home[:, 0], home[:, 1], 0] = home[:, 1]
    fanout[home[:, 0], home[:, 1]] = 1
    return next_switch, next_link, np.maximum(fanout, 1)


def paths(topology: nx.MultiGraph, a: str, b: str, ecmp: str = "all") -> list[list[str]]:
    """The names of the links on the path(s) from host ``a`` to host ``b``.

    ``ecmp="all"``: every equal-cost path, sorted; ``ecmp="hash"``: the one path per-hop ECMP
    hashing picks (see the module docstring), as a list of one path.
    """
    for host in (a, b):
        if topology.nodes.get(host, {}).get("kind") != "host":
            raise TopologyError(f"{host!r} is not a host of the topology")
    if ecmp == "hash":
        return [Routing.build(topology).path_names(a, b)]
    if ecmp != "all":
        raise TopologyError(f"ecmp is 'all' or 'hash', not {ecmp!r}")
    nic_a, nic_b = host_nic(topology, a), host_nic(topology, b)
    head, tail = access_links(topology, a, nic_a), access_links(topology, b, nic_b)[::-1]
    sw_a, sw_b = edge_switch(topology, nic_a), edge_switch(topology, nic_b)
    fabric = topology.subgraph(n for n, kind in topology.nodes(data="kind") if kind == "switch")
    out = []
    for route in nx.all_shortest_paths(fabric, sw_a, sw_b):
        hops = [sorted(d["name"] for d in topology.get_edge_data(u, v).values()) for u, v in zip(route, route[1:])]
        out += [[*head, *middle, *tail] for middle in itertools.product(*hops)]
    return sorted(out)
