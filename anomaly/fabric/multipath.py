"""Tomography when the ECMP path of each probe is unknown: only its set of equal-cost paths is.

With ECMP on Ethernet or RoCE a switch hashes a flow's header (its source port among others) to
choose a next hop; the prober cannot see the hash, so a probe may have taken any of its
equal-cost paths, each as likely (:meth:`dpro.anomaly.fabric.routing.Routing.route` with a random
generator simulates that). A component ``c`` lies on a share ``f_ic`` of the paths of probe
``i``: 1 for its NICs and the switches at both ends, ``1/16`` for one of the 16 uplinks of a
leaf, ``1/256`` for one of the 256 core links of a pod.

**What probes can tell apart.** Components whose shares are equal on every probe explain any
outcome equally well: swapping two spines maps every path onto one as likely, so a fault on
``leaf3--spine5`` and one on ``leaf3--spine6`` slow the same probes with the same odds. Such
components form a *class* (a leaf's uplinks, a pod's core links, all spines); a suspect names
one member and lists the others as ``same_as``, as a NIC lists its access links. Only knowing a
slow probe's path (a traceroute with its header, static routing) or the switches' port counters
narrows a class down to its link. Classes are found with a random projection: each component's
sum, over the probes, of a random weight times its share, computed by spreading every probe
evenly over the next hops (per-hop ECMP) from its source switch to its destination switch; equal
sums, equal classes. A probe crosses, on each of its paths, as many members of a class; so one
path of it (the hash's) gives its share of every member: hits / class size.

**Collisions.** Probes of a round that hash onto the same link share it and both slow down,
which says nothing of a fault: slow probes that may have met another slow probe of their round
(same class of links crossed in the same direction, or the same NIC port) are left out.

**Likelihood** (boolean tomography over paths, as in Flock, CoNEXT 2023). A probe is slow with a
background probability ``eps`` (noise, contention), or because it crossed a faulty member of a
class ``K``, which slows a probe through it with probability ``theta`` (1 when always slow, the
share of bad rounds when flapping): ``P(slow) = 1 - (1 - eps) · prod(1 - theta_K · f_iK)``. A
class is judged against the background *outside* it: the share of slow probes, among those of
the same path length (equally long paths see similar contention) that do not cross it, that no
picked class explains; so its own slow probes do not raise the bar it must clear. Stepwise
selection adds the class whose best ``theta`` raises the log-likelihood most, while that gain
(``LLR``) exceeds ``log(classes / alpha)`` and it explains at least ``min_slow`` slow probes (the
expected number it caused); after each pick every ``theta`` is fitted again, picks that no
longer pass given the others are dropped, and a pick is swapped for a class that does better in
its place. The score is ``sqrt(2 · LLR)``, the class's gain given the other picks, and
``confidence`` is ``theta``. A class that every probe of a path length crosses (all spines) is
judged against that length's own rate, which absorbs it: a fault there slows a fixed share of
those probes, as uniform contention would.

Each probe contributes one path's entries (about ten), so memory and time grow as with known
paths; the spreading is per destination switch, not per probe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx
import numpy as np

from dpro.anomaly.fabric.routing import Routing, component_chunks, components
from dpro.anomaly.suspects import Suspect

__all__ = ["Classes", "classes", "localize_multipath", "met", "spread"]

BISECTIONS = 40
REFITS = 3
PRIOR = 100  # probes at the path length's rate added to each background outside a class


def spread(routing: Routing, src: np.ndarray, dst: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Per component (NICs, links, switches as in :func:`dpro.anomaly.fabric.routing.components`):
    the sum over probes ``src[i] -> dst[i]`` of ``weight[i]`` times the share of the probe's
    equal-cost paths (per-hop ECMP, each next hop as likely) through it."""
    n_hosts, n_links, n_sw = len(routing.hosts), len(routing.links), len(routing.switches)
    goals = np.flatnonzero(routing.target >= 0)[np.argsort(routing.target[routing.target >= 0])]
    t = routing.target[routing.host_switch[dst]].astype(np.int64)
    mass = np.bincount(t * n_sw + routing.host_switch[src], weight, minlength=len(goals) * n_sw)
    links, switches = np.zeros(n_links), mass.reshape(len(goals), n_sw).sum(axis=0)
    width = routing.next_switch.shape[2]
    for _ in range(routing.max_hops):
        key = np.flatnonzero(mass)
        tt, u = np.divmod(key, n_sw)
        moving = u != goals[tt]
        key, tt, u = key[moving], tt[moving], u[moving]
        if not len(key):
            break
        ways = routing.fanout[tt, u]
        each = np.repeat(np.arange(len(key)), ways)
        choice = np.arange(len(each)) - np.repeat(np.cumsum(ways) - ways, ways)
        at = (tt[each] * n_sw + u[each]) * width + choice
        share = (mass[key] / ways)[each]
        nxt = routing.next_switch.reshape(-1)[at]
        links += np.bincount(routing.next_link.reshape(-1)[at], share, minlength=n_links)
        switches += np.bincount(nxt, share, minlength=n_sw)
        mass = np.bincount(tt[each] * n_sw + nxt, share, minlength=len(goals) * n_sw)
    nics = np.bincount(src, weight, minlength=n_hosts) + np.bincount(dst, weight, minlength=n_hosts)
    return np.concatenate([nics, links, switches])


@dataclass(frozen=True)
class Classes:
    """Components no probe can tell apart: ``of[c]`` is the class of component ``c`` (-1 if no
    probe can cross it), ``size[k]`` the number of members of class ``k``."""

    of: np.ndarray
    size: np.ndarray

    def members(self, k: int) -> np.ndarray:
        return np.flatnonzero(self.of == k)


def classes(routing: Routing, src: np.ndarray, dst: np.ndarray, seed: int = 0) -> Classes:
    """The classes of the components under probes ``src -> dst`` (see the module docstring)."""
    signature = spread(routing, src, dst, np.random.default_rng(seed).uniform(1.0, 2.0, len(src)))
    crossed = np.flatnonzero(signature > 0)
    order = crossed[np.argsort(signature[crossed], kind="stable")]
    values = signature[order]
    new = np.r_[True, np.diff(values) > 1e-9 * values[1:]] if len(values) else np.zeros(0, bool)
    of = np.full(len(signature), -1, np.int64)
    of[order] = np.cumsum(new) - 1
    return Classes(of, np.bincount(of[order]) if len(order) else np.zeros(0, np.int64))


def localize_multipath(topology: nx.MultiGraph, routing: Routing, src: np.ndarray, dst: np.ndarray,
                       rounds: np.ndarray, is_slow: np.ndarray, alpha: float, min_slow: int) -> list[Suspect]:
    """Suspects from probes whose ECMP paths are unknown, most likely first (host indices of the
    routing; see :func:`dpro.anomaly.fabric.tomography.localize` with ``ecmp="all"``)."""
    cls = classes(routing, src, dst)
    kept = ~met(routing, cls, src, dst, rounds, is_slow)
    src, dst, is_slow = src[kept], dst[kept], is_slow[kept]
    n_cls = len(cls.size)
    if not is_slow.any() or not n_cls:
        return []
    lengths = np.zeros(routing.max_hops * 2 + 2, np.int64)  # background groups: number of fabric components
    crossing = np.zeros((n_cls, len(lengths)), np.int64)  # entries of every probe, by class and group
    slow_entry, slow_class, slow_length = [], [], []
    n_slow = 0
    for part, comp in component_chunks(routing, src, dst):
        k = np.where(comp >= 0, cls.of[np.maximum(comp, 0)], -1)
        length = (comp[:, 2:] >= 0).sum(axis=1)
        lengths += np.bincount(length, minlength=len(lengths))
        key = k * len(lengths) + length[:, None]
        crossing += np.bincount(key[k >= 0], minlength=crossing.size).reshape(crossing.shape)
        s = is_slow[part]
        rows, cols = np.nonzero(k[s] >= 0)
        slow_entry.append(rows + n_slow)
        slow_class.append(k[s][rows, cols])
        slow_length.append(length[s])
        n_slow += int(s.sum())
    present = np.flatnonzero(lengths)
    model = _Model(np.concatenate(slow_entry), np.concatenate(slow_class),
                   np.searchsorted(present, np.concatenate(slow_length)), lengths[present], crossing[:, present],
                   cls.size)
    picks = model.select(math.log(n_cls / alpha), min_slow)
    return [_suspect(topology, routing, cls, model, k) for k in picks]


def met(routing: Routing, cls: Classes, src: np.ndarray, dst: np.ndarray, rounds: np.ndarray,
        is_slow: np.ndarray) -> np.ndarray:
    """Mask of the slow probes that may have shared a NIC port or a link one way with another
    slow probe of their round: probes that meet on a link both slow down, so neither says
    anything about a fault. Two probes may meet where their paths cross the same class of links
    in the same direction (up or down the fabric, from the switches' hops to an edge switch)."""
    out = np.zeros(len(src), bool)
    candidates = np.flatnonzero(is_slow & (rounds >= 0))
    if len(candidates) < 2:
        return out
    cls_of = cls.of
    s, d = src[candidates], dst[candidates]
    hops = components(routing, s, d)[:, 2:2 + routing.max_hops]
    _, switches = routing.route(s, d)
    level = _levels(routing)
    up = (level[switches[:, :-1]] < level[switches[:, 1:]]).astype(np.int64)
    directed = np.concatenate([2 * cls_of[s][:, None], 2 * cls_of[d][:, None] + 1,
                               np.where(hops >= 0, 2 * cls_of[np.maximum(hops, 0)] + up, -1)], axis=1)
    key = np.where(directed >= 0, rounds[candidates, None] * (2 * int(cls_of.max()) + 2) + directed, -1)
    _, inverse, counts = np.unique(key[key >= 0], return_inverse=True, return_counts=True)
    shared = np.zeros(key.shape, bool)
    shared[key >= 0] = counts[inverse] > 1
    out[candidates[shared.any(axis=1)]] = True
    return out


def _levels(routing: Routing) -> np.ndarray:
    """Each switch's hop count to the nearest edge switch (0 for edge switches), from the
    next-hop tables."""
    goals = np.flatnonzero(routing.target >= 0)[np.argsort(routing.target[routing.target >= 0])]
    step = routing.next_switch[:, :, 0].astype(np.int64)  # one next hop toward each goal
    rows = np.arange(len(goals))[:, None]
    at_goal = step == np.arange(step.shape[1])[None, :]
    dist = np.where(at_goal, 0, len(routing.switches))
    for _ in range(routing.max_hops):
        dist = np.where(at_goal, 0, np.minimum(dist, 1 + dist[rows, np.maximum(step, 0)]))
    return np.where(step >= 0, dist, len(routing.switches)).min(axis=0)


class _Model:
    """The noisy-OR likelihood of the slow probes and its greedy maximisation.

    Slow probes are kept as entries (slow probe, class); all probes only as counts of entries by
    class and background group, since the log-likelihood of a good probe is a sum over classes.
    A class is judged against the background *outside* it (the slow probes of its group that do
    not cross it, plus ``PRIOR`` probes at the group's rate), so that its own slow probes do not
    raise the bar it must clear; a class that every probe of a group crosses is judged against
    the group's rate, which then absorbs it.
    """

    def __init__(self, entry: np.ndarray, cls: np.ndarray, group: np.ndarray, group_n: np.ndarray,
                 crossing: np.ndarray, size: np.ndarray) -> None:
        self.entry, self.cls, self.f = entry, cls, 1.0 / size[cls]  # per entry: its slow probe, class, share
        self.group, self.entry_group = group, group[entry]  # of each slow probe, of each entry
        self.group_n, self.crossing, self.size = group_n.astype(np.float64), crossing.astype(np.float64), size
        self.good = self.crossing.sum(axis=1) - np.bincount(cls, minlength=len(size))
        self.theta, self.llr, self.explained = np.zeros(len(size)), np.zeros(len(size)), np.zeros(len(size))
        self.picked: list[int] = []

    def _miss(self, skip: int | None = None) -> np.ndarray:
        """log P(no picked class slowed it) of each slow probe, leaving out class ``skip``."""
        on = np.isin(self.cls, [k for k in self.picked if k != skip])
        terms = np.log1p(-self.theta[self.cls[on]] * self.f[on])
        return np.bincount(self.entry[on], terms, minlength=len(self.group))

    def _background(self, skip: int | None = None) -> np.ndarray:
        """Per entry: the background rate in its group outside its class, from the slow probes
        that cross no pick (but ``skip``), with ``PRIOR`` probes at the group's such rate."""
        picks = [k for k in self.picked if k != skip]
        touched = np.bincount(self.entry, np.isin(self.cls, picks), minlength=len(self.group)) > 0
        free = ~touched
        total = np.bincount(self.group, free, minlength=len(self.group_n))
        n_groups = len(self.group_n)
        inside = np.bincount(self.cls * n_groups + self.entry_group, free[self.entry],
                             minlength=self.crossing.size).reshape(self.crossing.shape)
        rate = np.maximum(total, 0.5) / self.group_n
        outside = (total - inside + PRIOR * rate) / (self.group_n - self.crossing + PRIOR)
        return outside[self.cls, self.entry_group]

    def _fit(self, q: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Best ``theta`` of every class (concave: bisect on the derivative) given the others,
        its log-likelihood gain and the slow probes it explains; ``q``: each entry's slow
        probability without its class; only entries in ``mask`` count."""
        n = len(self.size)
        cls, f, qe = self.cls[mask], self.f[mask], q[mask]
        fk = 1.0 / self.size

        def slope(theta: np.ndarray) -> np.ndarray:
            slow = np.bincount(cls, (1 - qe) * f / (qe + (1 - qe) * theta[cls] * f), minlength=n)
            return slow - self.good * fk / (1 - theta * fk)

        lo, hi = np.zeros(n), np.full(n, 1 - 1e-9)
        for _ in range(BISECTIONS):
            mid = (lo + hi) / 2
            up = slope(mid) > 0
            lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
        theta = np.where(slope(hi) > 0, hi, lo)
        fired = theta[cls] * f
        gain = np.bincount(cls, np.log1p((1 - qe) * fired / qe), minlength=n) + self.good * np.log1p(-theta * fk)
        explained = np.bincount(cls, fired / (qe + (1 - qe) * fired), minlength=n)
        return theta, gain, explained

    def _q(self, background: np.ndarray, miss: np.ndarray) -> np.ndarray:
        """Each entry's slow probability from the background and the picks in ``miss``."""
        return -np.expm1(np.log1p(-background) + miss[self.entry])

    def _refit(self) -> None:
        """The theta of every picked class given the others, in turn."""
        for _ in range(REFITS):
            for k in self.picked:
                mask = self.cls == k
                theta, gain, explained = self._fit(self._q(self._background(skip=k), self._miss(skip=k)), mask)
                self.theta[k], self.llr[k], self.explained[k] = theta[k], gain[k], explained[k]

    def _gains(self, skip: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every class's best theta, gain and slow probes explained, given the picks but ``skip``."""
        return self._fit(self._q(self._background(skip), self._miss(skip)), np.ones(len(self.cls), bool))

    def _take(self, k: int, theta: np.ndarray, gain: np.ndarray, explained: np.ndarray) -> None:
        self.picked.append(k)
        self.theta[k], self.llr[k], self.explained[k] = theta[k], gain[k], explained[k]

    def _drop(self, k: int) -> None:
        self.picked.remove(k)
        self.theta[k] = 0.0

    def select(self, threshold: float, min_slow: int) -> list[int]:
        """Stepwise selection of classes (see the module docstring). Add the best class while one
        passes; then drop picks that no longer pass given the others, and swap a pick for the
        class that does better given the others (a coarse class picked first on the evidence of
        two finer faults gives way to them). A class dropped or swapped out is not picked again."""
        out: set[int] = set()
        while True:
            theta, gain, explained = self._gains()
            gain[self.picked + sorted(out)] = -np.inf
            ok = (gain >= threshold) & (explained >= min_slow)
            if not ok.any():
                return sorted(self.picked, key=lambda k: -self.llr[k])
            self._take(int(np.argmax(np.where(ok, gain, -np.inf))), theta, gain, explained)
            self._refit()
            while self._improve(threshold, min_slow, out):
                self._refit()

    def _improve(self, threshold: float, min_slow: int, out: set[int]) -> bool:
        """Drop the weakest pick that no longer passes, or else make the first improving swap:
        a class that cannot be added beside a pick but does better than it in its place."""
        weak = [k for k in self.picked if self.llr[k] < threshold or self.explained[k] < min_slow]
        if weak:
            worst = min(weak, key=lambda k: self.llr[k])
            self._drop(worst)
            out.add(worst)
            return True
        _, beside, beside_explained = self._gains()
        blocked = (beside >= threshold) & (beside_explained >= min_slow)  # the next forward step takes these
        blocked[self.picked + sorted(out)] = True
        for k in list(self.picked):
            theta, gain, explained = self._gains(skip=k)
            better = ~blocked & (gain > gain[k] + 1e-6) & (explained >= min_slow)
            if better.any():
                best = int(np.argmax(np.where(better, gain, -np.inf)))
                self._drop(k)
                out.add(k)
                self._take(best, theta, gain, explained)
                return True
        return False


def _suspect(topology: nx.MultiGraph, routing: Routing, cls: Classes, model: _Model, k: int) -> Suspect:
    n_hosts, n_links = len(routing.hosts), len(routing.links)
    members = cls.members(k)  # NICs, then links, then switches, each by id
    names = [routing.nics[c] if c < n_hosts else routing.links[c - n_hosts] if c < n_hosts + n_links
             else routing.switches[c - n_hosts - n_links] for c in members]
    first = int(members[0])
    access = [routing.links[i] for i in routing.host_links[first]] if first < n_hosts else []
    evidence = {"slow_probes_explained": int(round(model.explained[k])), "confidence": round(float(model.theta[k]), 3),
                "path_share": round(1.0 / cls.size[k], 4), "same_as": access + names[1:]}
    score = math.sqrt(2 * max(model.llr[k], 0.0))
    if first < n_hosts:
        return Suspect("nic", names[0], score, host=routing.hosts[first], evidence=evidence)
    if first < n_hosts + n_links:
        u, v = next((u, v) for u, v, n in topology.edges(data="name") if n == names[0])
        return Suspect("link", names[0], score, evidence={**evidence, "ends": [u, v]})
    return Suspect("switch", names[0], score, evidence=evidence)
