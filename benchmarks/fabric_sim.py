"""An independent network-fabric simulator, to score dpro's link localizer on.

It shares no code and no path model with dpro: its only interface with dpro is the
topology file format written by :func:`topology_spec`. It uses the standard library and
numpy only.

The model:

* A fabric is hosts (one NIC each) and switches joined by full-duplex cables. A cable is two
  independent directed links ``(a, b)`` and ``(b, a)``, each with its own capacity in Gbit/s.
* Routing is done per switch, as real ECMP switches do: every switch finds its hop distance to
  every host by its own BFS over the cables (hosts do not forward); its next hops toward a
  host are the neighbours one hop closer, and where there are several it picks one by a hash
  of the flow's 5-tuple (src IP, dst IP, proto 6, src port, dst port) keyed by the switch's
  own salt, so the choices of different tiers are not correlated. A host sends on its NIC.
* Faults scale capacities: a ``link`` fault one direction of one cable, a ``switch`` fault
  every link leaving the switch (a slow egress). Several faults multiply.
* Concurrent flows get their max-min fair share of the directed links (progressive filling);
  a flow with a demand (background traffic) is capped at it.
* :func:`measure` runs a probe schedule: in each round, every pair's a->b flow at once, then
  every pair's b->a flow at once, each phase alongside a random set of other tenants'
  flows. Probes and background flows have random ephemeral source ports, so their paths are
  unknown to an observer, unless the prober gives its probes' ports (as ``iperf3 --cport``
  does): then a probe repeated on the same port takes the same path, still unseen. Each
  measured rate is the true rate times exp(N(0, noise)).

Names: hosts are ``h0, h1, ...``, switches ``leaf0``, ``spine0``, ``edge0_1``, ``agg0_1``,
``core0``. dpro models a host with its default NIC as a node ``h0/nic0`` joined to ``h0``, so
the simulator's link ``(h0, leaf0)`` is dpro's ``(h0/nic0, leaf0)`` and ``(leaf0, h0)`` is
dpro's ``(leaf0, h0/nic0)``; switch names are the same in both (see :func:`dpro_name`).
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

Link = tuple[str, str]
PROBE_PORT = 5201  # iperf3's
EPHEMERAL_PORTS = (32768, 61000)  # Linux's default range
TCP = 6
_EPS = 1e-9


class Flow(NamedTuple):
    """A TCP flow from host ``src`` to host ``dst`` (indices into ``Fabric.hosts``)."""

    src: int
    dst: int
    sport: int
    dport: int = PROBE_PORT


@dataclass(frozen=True)
class Fault:
    """Ground truth: ``link`` at ``where=(a, b)`` scales the capacity of a->b only; ``switch``
    at ``where=name`` scales every link leaving that switch. The factor is ``1 - slowdown``."""

    kind: str
    where: str | Link
    slowdown: float


@dataclass(frozen=True)
class Background:
    """Other tenants' traffic: a Poisson number of random host-to-host flows per phase, of mean
    ``flows``, each capped at a uniform random fraction in [0, ``max_demand``) of the rate of
    its source's host link."""

    flows: float = 0.0
    max_demand: float = 0.5


class Fabric:
    """Hosts and switches joined by full-duplex cables ``(a, b, gbps)``; see the module doc."""

    def __init__(self, hosts: Sequence[str], switches: Sequence[str],
                 cables: Sequence[tuple[str, str, float]]) -> None:
        self.hosts = list(hosts)
        self.switches = list(switches)
        self.cables: list[Link] = [(a, b) for a, b, _ in cables]
        self.links: list[Link] = [link for a, b in self.cables for link in ((a, b), (b, a))]
        self.link_id = {link: i for i, link in enumerate(self.links)}
        self.capacity = np.repeat([float(gbps) for *_, gbps in cables], 2)
        neighbours: dict[str, list[str]] = {node: [] for node in self.hosts + self.switches}
        for a, b in self.cables:
            neighbours[a].append(b)
            neighbours[b].append(a)
        if any(len(neighbours[h]) != 1 for h in self.hosts):
            raise ValueError("every host needs exactly one cable (its NIC)")
        self._nic = [self.link_id[h, neighbours[h][0]] for h in self.hosts]
        self._salt = {s: s.encode() for s in self.switches}
        self._next = self._next_hops(neighbours)

    def _next_hops(self, neighbours: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        """Per switch and destination host index: the links to the neighbours one hop closer."""
        dist = {s: _bfs(s, neighbours, set(self.switches)) for s in self.switches}
        return {s: [[self.link_id[s, n] for n in neighbours[s]
                     if n == h or (n in dist and dist[n].get(h) == dist[s][h] - 1)]
                    for h in self.hosts] for s in self.switches}

    @property
    def access_links(self) -> list[Link]:
        """Directed links with a host at one end (both directions)."""
        hosts = set(self.hosts)
        return [(a, b) for a, b in self.links if a in hosts or b in hosts]

    @property
    def inter_switch_links(self) -> list[Link]:
        """Directed links between two switches (both directions)."""
        hosts = set(self.hosts)
        return [(a, b) for a, b in self.links if a not in hosts and b not in hosts]

    def route(self, flow: Flow) -> list[int]:
        """The ids (into ``links``) of the directed links ``flow`` crosses, in order."""
        key = struct.pack("!IIBHH", _ip(flow.src), _ip(flow.dst), TCP, flow.sport, flow.dport)
        ids = [self._nic[flow.src]]
        node = self.links[ids[-1]][1]
        while node != self.hosts[flow.dst]:
            choices = self._next[node][flow.dst]
            if len(choices) > 1:
                digest = hashlib.blake2b(key, digest_size=8, key=self._salt[node]).digest()
                ids.append(choices[int.from_bytes(digest, "big") % len(choices)])
            else:
                ids.append(choices[0])
            node = self.links[ids[-1]][1]
        return ids

    def path(self, flow: Flow) -> list[Link]:
        """The directed links ``flow`` crosses, from its source's NIC to its destination's."""
        return [self.links[i] for i in self.route(flow)]

    def capacities(self, faults: Iterable[Fault] = ()) -> np.ndarray:
        """The capacity of every directed link (in ``links`` order) under ``faults``."""
        capacity = self.capacity.copy()
        for fault in faults:
            capacity[self._fault_links(fault)] *= 1.0 - fault.slowdown
        return capacity

    def _fault_links(self, fault: Fault) -> list[int]:
        """The ids of the links ``fault`` slows; a ValueError if it is not in this fabric."""
        if fault.kind == "link" and tuple(fault.where) in self.link_id:
            return [self.link_id[tuple(fault.where)]]
        if fault.kind == "switch" and fault.where in self._salt:
            return [i for i, (a, _) in enumerate(self.links) if a == fault.where]
        raise ValueError(f"no {fault.kind} {fault.where!r} in this fabric")


def _bfs(source: str, neighbours: dict[str, list[str]], switches: set[str]) -> dict[str, int]:
    """Hop distances from ``source`` to every node it reaches, forwarding through switches only."""
    dist = {source: 0}
    queue = deque([source])
    while queue:
        node = queue.popleft()
        for n in neighbours[node]:
            if n not in dist:
                dist[n] = dist[node] + 1
                if n in switches:
                    queue.append(n)
    return dist


def _ip(host: int) -> int:
    """Host ``i``'s IPv4 address, 10.0.0.0 + i + 1, as an integer."""
    return 0x0A000001 + host


def leaf_spine(leaves: int, hosts_per_leaf: int, spines: int, host_gbps: float = 100.0,
               uplink_gbps: float = 100.0) -> Fabric:
    """A two-tier fabric: host ``h(l*hosts_per_leaf + i)`` on ``leaf<l>``, every leaf cabled
    to every ``spine<s>``."""
    hosts = [f"h{i}" for i in range(leaves * hosts_per_leaf)]
    leaf_names = [f"leaf{i}" for i in range(leaves)]
    spine_names = [f"spine{i}" for i in range(spines)]
    cables = [(h, leaf_names[i // hosts_per_leaf], host_gbps) for i, h in enumerate(hosts)]
    cables += [(leaf, spine, uplink_gbps) for leaf in leaf_names for spine in spine_names]
    return Fabric(hosts, leaf_names + spine_names, cables)


def fat_tree(k: int, host_gbps: float = 100.0, uplink_gbps: float = 100.0) -> Fabric:
    """The 3-tier k-ary fat tree: k pods of k/2 ``edge<p>_<i>`` and k/2 ``agg<p>_<j>`` switches,
    k/2 hosts per edge switch, and (k/2)^2 cores; ``agg<p>_<j>`` is cabled to the cores
    ``core<j*k/2>`` to ``core<j*k/2 + k/2 - 1>``."""
    if k < 2 or k % 2:
        raise ValueError(f"k must be even and at least 2, not {k}")
    half = k // 2
    edges = [f"edge{p}_{i}" for p in range(k) for i in range(half)]
    aggs = [f"agg{p}_{j}" for p in range(k) for j in range(half)]
    cores = [f"core{c}" for c in range(half * half)]
    hosts = [f"h{i}" for i in range(k * half * half)]
    cables = [(h, edges[i // half], host_gbps) for i, h in enumerate(hosts)]
    cables += [(f"edge{p}_{i}", f"agg{p}_{j}", uplink_gbps)
               for p in range(k) for i in range(half) for j in range(half)]
    cables += [(f"agg{p}_{j}", f"core{j * half + c}", uplink_gbps)
               for p in range(k) for j in range(half) for c in range(half)]
    return Fabric(hosts, edges + aggs + cores, cables)


def random_fault(fabric: Fabric, rng: np.random.Generator, slowdown: float,
                 kinds: Sequence[str] = ("link", "switch"), access_share: float = 0.5) -> Fault:
    """One fault: a kind drawn uniformly from ``kinds``, then, for a link, an access link with
    probability ``access_share`` or else an inter-switch link, uniformly among those (both
    directions); for a switch, one uniformly among all switches."""
    kind = kinds[rng.integers(len(kinds))]
    if kind == "switch":
        return Fault("switch", fabric.switches[rng.integers(len(fabric.switches))], slowdown)
    if kind != "link":
        raise ValueError(f"unknown fault kind {kind!r}")
    pool = fabric.access_links if rng.random() < access_share else fabric.inter_switch_links
    return Fault("link", pool[rng.integers(len(pool))], slowdown)


def flow_rates(fabric: Fabric, flows: Sequence[Flow], faults: Iterable[Fault] = (),
               demands: Sequence[float] | None = None) -> np.ndarray:
    """The max-min fair rates (Gbit/s) of ``flows`` running at once, each capped at its demand
    (none by default)."""
    demand = np.full(len(flows), np.inf) if demands is None else np.asarray(demands, float)
    return _max_min([fabric.route(f) for f in flows], np.zeros(len(flows), int),
                    fabric.capacities(faults), demand, 1)


def _max_min(routes: list[list[int]], group: np.ndarray, capacity: np.ndarray,
             demand: np.ndarray, groups: int) -> np.ndarray:
    """Progressive filling of ``groups`` independent copies of the fabric at once (flow i runs
    in copy ``group[i]``). The unfrozen flows of a copy share one rate; in each round, ``level``
    is the raise that fills the copy's first link if none of them were capped. Each flow rises
    by that or up to its demand, whichever is less (no link overflows: a capped flow takes
    less than ``level``), and the flows on a full link or at their demand freeze. So all the
    flows capped below a link's level freeze in one round."""
    n = len(capacity)
    dummy = groups * n  # pads short routes; never full
    width = max(map(len, routes), default=1)
    paths = np.array([route + [-1] * (width - len(route)) for route in routes], dtype=int)
    paths = np.where(paths < 0, dummy, paths + group[:, None] * n).reshape(len(routes), width)
    residual = np.tile(capacity, groups)
    rate = np.zeros(len(routes))
    active = demand > _EPS
    while active.any():
        counts = np.bincount(paths[active].ravel(), minlength=dummy + 1)[:dummy]
        share = np.full(dummy, np.inf)
        np.divide(residual, counts, out=share, where=counts > 0)
        level = share.reshape(groups, n).min(axis=1)
        step = np.where(active, np.minimum(demand - rate, level[group]), 0.0)
        rate += step
        used = np.bincount(paths.ravel(), np.repeat(step, width), minlength=dummy + 1)
        residual -= used[:dummy]
        full = np.append(residual <= _EPS, False)
        active &= ~full[paths].any(axis=1) & (demand - rate > _EPS)
    return rate


def measure(fabric: Fabric, rounds: Sequence[Sequence[tuple[int, int]]],
            faults: Iterable[Fault] = (), noise: float = 0.0,
            background: Background | float = 0.0,
            rng: np.random.Generator | int | None = None,
            sports: Sequence[int] | None = None,
            pair_ports: np.ndarray | None = None) -> list[tuple[int, int, int, float]]:
    """Run a probe schedule; rows ``(src, dst, round, gbps)``, two per pair (a->b, then b->a).

    Each round runs in two phases, every pair's a->b flow at once, then every pair's b->a;
    each phase also carries ``background`` flows (a float ``x`` is ``Background(flows=x *
    number of hosts)``). Each rate is its max-min fair share times exp(N(0, noise)).
    ``sports``: the probes' source ports, one per row in the rows' order; or ``pair_ports``,
    an ``n x n`` table of each directed host pair's source port (a job's backend keeps one
    connection per pair, so every probe of a pair takes its path); random ephemeral ports
    where neither is given.
    """
    rng = np.random.default_rng(rng)
    if not isinstance(background, Background):
        background = Background(flows=background * len(fabric.hosts))
    phases = [list(pairs) if forward else [(b, a) for a, b in pairs]
              for pairs in rounds for forward in (True, False)]
    probes = [(a, b, p) for p, pairs in enumerate(phases) for a, b in pairs]
    if pair_ports is not None:
        sports = [pair_ports[a, b] for a, b, _ in probes]
    elif sports is None:
        sports = rng.integers(*EPHEMERAL_PORTS, size=len(probes))
    elif len(sports) != len(probes):
        raise ValueError(f"{len(sports)} source ports for {len(probes)} probes")
    flows = [Flow(a, b, int(port)) for (a, b, _), port in zip(probes, sports)]
    extra, extra_phase, extra_demand = _background(fabric, background, len(phases), rng)
    group = np.concatenate([[p for *_, p in probes], extra_phase]).astype(int)
    demand = np.concatenate([np.full(len(probes), np.inf), extra_demand])
    routes = [fabric.route(f) for f in flows + extra]
    rates = _max_min(routes, group, fabric.capacities(faults), demand, len(phases))[:len(probes)]
    if noise:
        rates = rates * np.exp(rng.normal(0.0, noise, size=len(probes)))
    return [(a, b, p // 2, float(r)) for (a, b, p), r in zip(probes, rates)]


def _background(fabric: Fabric, background: Background, phases: int,
                rng: np.random.Generator) -> tuple[list[Flow], np.ndarray, np.ndarray]:
    """Random other tenants' flows: the flows, their phases, and their demands."""
    counts = rng.poisson(background.flows, size=phases)
    total = int(counts.sum())
    hosts = len(fabric.hosts)
    src = rng.integers(hosts, size=total)
    dst = (src + rng.integers(1, hosts, size=total)) % hosts
    ports = rng.integers(*EPHEMERAL_PORTS, size=(total, 2))
    link_rate = fabric.capacity[np.asarray(fabric._nic, dtype=int)[src]]
    demand = rng.uniform(0.0, background.max_demand, size=total) * link_rate
    flows = [Flow(int(s), int(d), int(sp), int(dp)) for s, d, (sp, dp) in zip(src, dst, ports)]
    return flows, np.repeat(np.arange(phases), counts), demand


def topology_spec(fabric: Fabric) -> dict:
    """The fabric in dpro's topology file format: switches, hosts (each with the default single
    NIC, ``[]``) and every cable once as ``[a, b]``."""
    return {"switches": list(fabric.switches), "hosts": {h: [] for h in fabric.hosts},
            "links": [[a, b] for a, b in fabric.cables]}


def dpro_name(node: str) -> str:
    """dpro's name for a node: host ``h3`` is its default NIC ``h3/nic0``; switches keep theirs."""
    return f"{node}/nic0" if re.fullmatch(r"h\d+", node) else node
