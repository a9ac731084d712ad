"""The fabric's localizer: the NICs, links and switches the pairwise probes point at, one direction
at a time, on a fabric whose ECMP choices are unseen (used by ``dpro diagnose``, ``dpro health``
and the dashboard; :func:`localize` without a topology falls back on the matrix alone).

A cable can be slow one way only (a bad transmitter, a congested egress queue), so every cable
is two components here, one per direction, and a probe from ``a`` to ``b`` crosses only the
``a``-to-``b`` direction of the cables on its path; a switch is a component too (a slow ASIC
slows every link leaving it). The prober cannot see which equal-cost path a probe took, so a
probe *may* cross the components on any of its shortest paths. Components that every probe may
cross alike are one class: no probe can tell them apart. Where the routes are known (a
:class:`~dpro.anomaly.fabric.routing.Routing` by destination: the fabric's own tables), a probe
crosses the one path they give it. A pair probed both ways at once (``Probes.both_ways``) may
be slowed in both directions by a slow component on either path: each direction's TCP
acknowledgements queue behind the other direction's data (on the routed namespace fabric, the
partners of the probes through a 100 Mbit/s uplink measured 0.09 to 8.0 Gb/s, 6 of 16 below
1.3, against 1.75 to 9.8 Gb/s for every other probe). So such a probe may cross both paths'
components, and a NIC named from them is slow in ``either`` direction.

**Pooled evidence.** A fault of 10% hides in 10% of noise probe by probe, but not across the
dozens of probes that may cross a link. Each probe's shortfall on a log scale is taken against
the typical healthy probe of as many hops, read from the upper quartiles (faults and other
traffic only slow probes, and ECMP may send half of them through a fault) of each direction of
a host pair once, as the median of its probes (the follow-ups probe again the pairs through the
classes in doubt; counted each time, a fault's own probes would set what healthy looks like), in
units of the noise (also from the upper quartiles), and clipped to ``±CLIP`` so that a few probes slowed a
lot by other traffic weigh no more than a few slowed by a fault. A class has two scores:

- *pooled*: the sum of its probes' clipped ``z`` over the square root of their number
  (Stouffer's), which grows with every probe a fault slows a little, whether ECMP sent all of
  them through it (a NIC) or some (an uplink);
- *counted*: how unlikely it is, as a normal ``z``, that so many of its probes are very slow
  (``Z_SLOW`` deviations short) given how often probes of as many hops outside it are: a fault
  that slows a few probes a lot in noisy data.

A class whose probes' lengths no probe outside it has (both spines of a leaf-spine: every probe
between leaves may cross either) has no healthy peers: its typical probe is read from its own
probes, whose lower tail other tenants' traffic skews as a fault through one of its members
would, so its pooled score is judged at ``no_peers`` times ``z_class`` (its counted score has no
rate outside it to go by).

**Masked paths.** Where uplinks are oversubscribed, a probe between leaves runs at the uplinks'
share whatever its NICs, so a NIC's fault smaller than that gap shows only on the paths within
its leaf. A path length whose typical probe is very slow (``Z_SLOW`` deviations) against the
fastest length's is masked, and a class holding a NIC's access link is weighed a second time on
its probes over the paths not masked; either may name it, and the follow-ups re-probe the pairs
of the one in doubt, as often as its probes over every path ran between more host pairs
(:mod:`dpro.anomaly.fabric.follow_up`). (Designed from issue 29's text and checked on synthetic
2:1 and 4:1 leaf-spines, not on the benchmark's held-out fabric; it never applies on the tuned
fabrics, whose lengths run alike.)

Greedily, while a class is past one of its thresholds (``z_class``, ``z_count``) and its probes
fall short by ``min_effect`` on average, one is named: of those past the pooled threshold, the
furthest past it; else the furthest past the counted one. (A switch holds both directions of
its hosts' cables: a NIC slow both ways makes its switch's class hold twice the very slow
probes of either direction's, with many healthy ones beside them, which the pooled score weighs
and the counted one does not.) Its probes are then explained and leave the other classes'
scores. A NIC's access cable stands for the NIC.

**The narrowest class.** A wide class (a switch: every probe through it) that holds a slow
narrower one (one of its uplinks) can score past it on its many probes alone. So before a class
is named, the classes whose probes lie within it and that are past their own thresholds are
tried: if the rest of the wide class's probes, weighed alone, are past neither threshold, though
they are enough to have shown a fault as large (the narrower class's mean clipped ``z`` times
the square root of their number reaches the wide class's bar) or fall short of what it would
have shown by ``clear`` (as a cleared suspect's do, below), the narrower class explains what
the wide one was named for and is named instead: of those that do, the one furthest past its
threshold, and then within it in turn. The rest leaves out the probes whose way back may cross
the narrower class: their acknowledgements queue behind the data of the probes that cross it
in the same round (a probe into ``leaf0`` from another leaf is slowed by ``leaf0``'s slow
uplink that way; probed ``both_ways``, those are already among the narrower class's own). A
switch slowed throughout keeps its name: the rest of its probes are slow too, or too few to
tell. Those acknowledgements may then name the way back on their own (``leaf0``'s downlinks
after its uplink): a suspect half of whose probes may have their acknowledgements behind an
earlier suspect (not its own NIC's other direction) says so (``acks_behind``), for it may be
that suspect's echo rather than a fault of its own. (Of 12 runs of the routed namespace test
with ECMP on 2026-11-28, whose probes' noise was 0.35 to 0.84 on a log scale, 2 named first the
switch ``leaf0`` or the spines' class, ``spine0`` and ``spine1``; the rest of their probes
weighed 1.1 and 4.5 pooled against a bar of 5.5 (the check's then). Their probes, in
``tests/data/fabric``, now name the uplinks; the 12 runs routed by destination name the same
with either rule. With the typical probe read once per pair, run 7 names the uplinks at once,
and run 6's rest, 12 probes, pools to 0.95 where the uplinks' fault would have shown 5.17: under the bar, but short of it by
more than ``clear``, so the uplinks are named.)

**Cleared suspects.** A suspect named for probes that another suspect's path may also explain
is weighed again on its probes that none may: where, alone, they are past neither of its
thresholds and fall short by ``clear`` (pooled ``z``) of what its own mean shortfall would have
pooled to on as many, they show nothing of it, and it is dropped; the suspect that may cross
most of its probes says so (``explains``). One at a time, the furthest short first. A suspect
cleared is not followed up: its probes stay explained. Were its remaining probes past its
threshold, as where a second fault slows them, it would be kept. (From a run of the routed
namespace test with ECMP in which 6 of host ``dfab-h3``'s 8 connections out of ``leaf0`` took the
slow uplink, and its NIC was named first, while every probe set the typical one; read once per
pair, the uplink is named first and the NIC not at all. On tuning seed 1's trials the rule drops
about 1 suspect in 500, each a wrong one, such as a NIC beside a slow core link.)

Meant for the hundreds of hosts a health check probes; paths come from networkx, not the
vectorised routing of :mod:`dpro.anomaly.fabric.routing`. The thresholds were tuned on
``benchmarks.health_localization``'s tuning trials, apart from those it scores.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from math import lgamma
from statistics import NormalDist

import networkx as nx
import numpy as np
import pandas as pd

from dpro.anomaly.fabric.probes import ProbeError, Probes, analyze
from dpro.anomaly.fabric.routing import Routing
from dpro.anomaly.fabric.topology import host_nic
from dpro.anomaly.suspects import Suspect

__all__ = ["Weighed", "has_peers", "localize", "weigh"]

Z_CLASS = 5.0
Z_COUNT = 4.0
MIN_EFFECT = 0.03  # a mean shortfall of 3% (log scale)
CLIP = 2.5
MIN_PROBES = 2
NO_PEERS = 1.0
"""How many times ``z_class`` a class without healthy peers needs (see the module docstring).
``--tune-no-peers`` on the tuning trials chose 1.5 (heavy-background false alarms 0.44 -> 0.33,
mean recall 0.863 -> 0.836), but scored on a fresh seed it lost every spine switch slowed by
40% on the leaf-spine (0 of 20 where 1.0 finds 20): the mean recall hid a whole kind of fault.
So 1.0, as before; the results are kept (``health-localization-no-peers-1.5-seed1916299``)."""
MIN_PEERS = 8  # directions of host pairs of one path length enough to take their own typical value
CLEAR = 3.0
"""How far short (in pooled ``z``) a suspect's probes that no other suspect may explain must fall
of what its fault would have shown on them, for it to be cleared; and a wide class's probes
outside a narrower one, for the narrower to be named in its place though they are too few to
reach the bar (see the module docstring). ``clear <= 0`` turns off both."""
Z_SLOW = 3.0  # a very slow probe: this many deviations of the noise short
Q75, Q90 = 0.6745, 1.2816  # the normal law's 75th and 90th percentiles, in standard deviations

Component = tuple[str, str] | str  # a directed link (from, to), or a switch


def localize(topology: nx.MultiGraph | None, probes: Probes, z_class: float = Z_CLASS,
             min_effect: float = MIN_EFFECT, clip: float = CLIP, z_count: float = Z_COUNT,
             no_peers: float = NO_PEERS, routing: Routing | None = None) -> list[Suspect]:
    """Suspect NICs (kind ``nic``), directed links (``link``) and switches (``switch``), most
    likely first; each names what no probe tells apart from it (``same_as``) and, for a NIC or
    a link, the direction (``from``, ``to``). Without a topology, the hosts and paths the
    matrix alone points at (:func:`dpro.anomaly.fabric.probes.analyze`)."""
    if topology is None:
        return analyze(probes)
    return [suspect for suspect, _, _ in weigh(topology, probes, z_class, min_effect, clip, z_count, no_peers,
                                                 routing).named]


@dataclass
class Weighed:
    """What the probes say: the suspects named, each with its ``margin`` (its score over its
    threshold: 1 just named) and the probes it explains, and per class neither named nor cleared
    (:func:`_clear_explained`), its probes not explained by a suspect and its margin on them;
    each probe's hop count and its shortfall in units of the noise (``z``); and per NIC weighed on
    its paths not masked alone (:func:`_unmasked`; none where no path is masked), those probes and
    how many times as many host pairs its probes over every path ran between (rounded up)."""

    named: list[tuple[Suspect, float, np.ndarray]]
    open: list[tuple[np.ndarray, float]]
    hops: np.ndarray
    z: np.ndarray
    unmasked: list[tuple[np.ndarray, int]]


def weigh(topology: nx.MultiGraph, probes: Probes, z_class: float = Z_CLASS, min_effect: float = MIN_EFFECT,
          clip: float = CLIP, z_count: float = Z_COUNT, no_peers: float = NO_PEERS,
          routing: Routing | None = None, clear: float = CLEAR) -> Weighed:
    """The greedy localization of :func:`localize` (see the module docstring), with the
    margins that adaptive probing reads (:mod:`dpro.anomaly.fabric.follow_up`); ``clear``: see
    :data:`CLEAR`."""
    missing = [h for h in probes.hosts if h not in topology]
    if missing:
        raise ProbeError(f"probed host {missing[0]!r} is not in the topology")
    if not len(probes.value):  # nothing measured (a time budget spent before the first round)
        return Weighed([], [], np.zeros(0, np.int64), np.zeros(0), [])
    classes, hops, back = _classes(topology, probes, routing)
    shortfall, noise, typical = _shortfall(probes, hops)
    masked = _masked(typical, noise) if probes.higher_is_better else np.zeros(0, np.int64)
    copies = _unmasked(topology, classes, hops, masked)
    unmasked = [(keep, -(-_partners(probes, crossing) // _partners(probes, keep))) for crossing, keep, _ in copies]
    classes += [(keep, members) for _, keep, members in copies]
    z = shortfall / noise
    weight = np.clip(z, -clip, clip)
    very_slow = z >= Z_SLOW
    unexplained = np.ones(len(weight), bool)

    bars = [z_class * (1.0 if has_peers(crossing, hops) else no_peers) for crossing, _ in classes]

    def margins(left: np.ndarray, crossing: np.ndarray, bar: float) -> tuple[float, float, float]:
        pooled = float(weight[left].sum()) / np.sqrt(len(left))
        counted = _excess_slow(left, crossing, very_slow, hops, unexplained)
        return pooled / bar, counted / z_count, max(pooled, counted)

    def behind(members: list[Component]) -> np.ndarray:
        """The probes whose way back may cross any of ``members``: their acknowledgements."""
        return np.concatenate([back.get(c, np.zeros(0, np.int64)) for c in members])

    def narrowest(members: list[Component], left: np.ndarray, score: float, margin: float,
                  bar: float) -> tuple[list[Component], np.ndarray, float, float, float]:
        """The class chosen (``bar``: its threshold), or a class within it past its own
        threshold whose probes leave the rest of the chosen class's unremarkable where the rest
        would have shown as much, in turn (see the module docstring)."""
        while True:
            inner = []
            for (crossing, others), other_bar in zip(classes, bars):
                if others is members or tuple(others) in done:
                    continue
                mine = crossing[unexplained[crossing]]
                if not MIN_PROBES <= len(mine) < len(left) or not np.isin(mine, left).all() \
                        or float(shortfall[mine].mean()) < min_effect:
                    continue
                pooled, counted, other_score = margins(mine, crossing, other_bar)
                if max(pooled, counted) < 1.0:
                    continue
                rest = np.setdiff1d(np.setdiff1d(left, mine), behind(others))
                if len(rest) < MIN_PROBES:
                    continue
                expected, short = _short_of(weight, mine, rest)  # a wide fault as large, pooled on them
                if expected < bar and not 0 < clear <= short:
                    continue  # too few to show it, and not far short of it: a wide fault may leave them so
                if max(margins(rest, left, bar)[:2]) < 1.0:
                    inner.append(((pooled >= 1.0, pooled if pooled >= 1.0 else counted), others, mine, other_score,
                                  max(pooled, counted), other_bar))
            if not inner:
                return members, left, score, margin, bar
            _, members, left, score, margin, bar = max(inner, key=lambda c: c[0])

    named: list[tuple[Suspect, float, np.ndarray]] = []
    chosen: list[tuple[list[Component], float]] = []  # per suspect named, its class's members and threshold
    returns: list[np.ndarray] = []  # per suspect named, the probes whose way back may cross it
    done: set[tuple[Component, ...]] = set()  # classes named by one of their probe sets (all, or not masked)
    while True:
        best, best_key, best_probes, best_score, best_margin, best_bar = None, (False, 0.0), None, 0.0, 0.0, 0.0
        for (crossing, members), bar in zip(classes, bars):
            if tuple(members) in done:
                continue
            left = crossing[unexplained[crossing]]
            if len(left) < MIN_PROBES or float(shortfall[left].mean()) < min_effect:
                continue
            pooled, counted, score = margins(left, crossing, bar)
            key = (pooled >= 1.0, pooled if pooled >= 1.0 else counted)  # pooled evidence first
            if max(pooled, counted) >= 1.0 and key > best_key:
                best, best_key, best_probes, best_score, best_margin, best_bar = (members, key, left, score,
                                                                                  max(pooled, counted), bar)
        if best is None:
            break
        best, best_probes, best_score, best_margin, best_bar = narrowest(best, best_probes, best_score, best_margin,
                                                                         best_bar)
        suspect = _suspect(topology, best, best_score, best_probes, shortfall)
        ahead = [_label(s) for (s, _, _), back_probes in zip(named, returns)
                 if not (s.kind == suspect.kind == "nic" and s.name == suspect.name)  # its own other direction
                 and np.isin(best_probes, back_probes).mean() >= 0.5]
        if ahead:
            suspect.evidence["acks_behind"] = ahead
        named.append((suspect, best_margin, best_probes))
        chosen.append((best, best_bar))
        returns.append(behind(best))
        unexplained[best_probes] = False
        done.add(tuple(best))
    _clear_explained(named, chosen, returns, classes, weight, clear,
                     lambda rest, mine, bar: max(margins(rest, mine, bar)[:2]) >= 1.0)
    open_classes = []
    for (crossing, members), bar in zip(classes, bars):
        left = crossing[unexplained[crossing]]
        if tuple(members) in done:  # named from its other probe set: in no doubt
            continue
        if len(left) >= MIN_PROBES:
            open_classes.append((left, max(margins(left, crossing, bar)[:2])))
    return Weighed(named, open_classes, hops, z, unmasked)


def _clear_explained(named: list[tuple[Suspect, float, np.ndarray]], chosen: list[tuple[list[Component], float]],
                     returns: list[np.ndarray], classes: list[tuple[np.ndarray, list[Component]]],
                     weight: np.ndarray, clear: float, past: Callable[[np.ndarray, np.ndarray, float], bool]) -> None:
    """Drop from ``named`` (and ``chosen``, its classes' members and thresholds; ``returns``, per
    suspect the probes whose acknowledgements may cross it, is read in step) each suspect whose
    probes that no other suspect may cross (their paths or acknowledgements) show nothing: weighed
    alone they are past neither of its thresholds (``past(rest, its probes, its bar)``), and their
    pooled clipped ``z`` falls short by ``clear`` or more of what the suspect's own mean would have
    pooled to on as many probes. One at a time, the furthest short first; the suspect that may
    cross the most of the cleared one's probes names it (``explains``, with what the cleared one
    explained), and no suspect keeps it in ``acks_behind``. ``clear`` 0: none is dropped."""
    crossings: dict[tuple[Component, ...], list[np.ndarray]] = defaultdict(list)
    for crossing, members in classes:  # a NIC's class weighed twice (masked paths): both probe sets
        crossings[tuple(members)].append(crossing)
    may = [np.unique(np.concatenate(crossings[tuple(m)] + [acks])) for (m, _), acks in zip(chosen, returns)]
    while clear > 0 and len(named) > 1:
        gaps = []
        for i, ((_, _, mine), (_, bar)) in enumerate(zip(named, chosen)):
            rest = np.setdiff1d(mine, np.concatenate([c for j, c in enumerate(may) if j != i]))
            if MIN_PROBES <= len(rest) < len(mine) and not past(rest, mine, bar):
                gaps.append((_short_of(weight, mine, rest)[1], -i))  # ties: the first
        gap, first = max(gaps, default=(0.0, 0))
        if gap < clear:
            return
        i = -first
        cleared, _, mine = named.pop(i)
        chosen.pop(i)
        del may[i]
        label = _label(cleared)
        for suspect, _, _ in named:
            if label in suspect.evidence.get("acks_behind", []):
                suspect.evidence["acks_behind"].remove(label)
                if not suspect.evidence["acks_behind"]:
                    del suspect.evidence["acks_behind"]
        by = max(range(len(named)), key=lambda j: (np.isin(mine, may[j]).sum(), -j))
        named[by][0].evidence.setdefault("explains", []).extend([label, *cleared.evidence.get("explains", [])])


def _short_of(weight: np.ndarray, mine: np.ndarray, rest: np.ndarray) -> tuple[float, float]:
    """What the mean clipped ``z`` (``weight``) of a suspect's probes ``mine`` would pool to on as
    many probes as ``rest``, and how far the pooled ``z`` of ``rest`` falls short of it."""
    expected = float(weight[mine].mean()) * np.sqrt(len(rest))
    return expected, expected - float(weight[rest].sum()) / np.sqrt(len(rest))


def _masked(typical: dict[int, float], noise: float) -> np.ndarray:
    """The path lengths whose typical probe (``typical``: per length, the log of its bandwidth)
    runs very slow (``Z_SLOW`` deviations of the noise) against the fastest length's: held to a
    narrower link by design (oversubscribed uplinks), so a NIC's fault smaller than the gap does
    not show on them."""
    fastest = max(typical.values(), default=0.0)
    return np.array([length for length, t in typical.items() if fastest - t > Z_SLOW * noise], np.int64)


def _unmasked(topology: nx.MultiGraph, classes: list[tuple[np.ndarray, list[Component]]], hops: np.ndarray,
              masked: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, list[Component]]]:
    """Each class holding a NIC's access link again, with its probes over paths not ``masked``
    only: where uplinks are oversubscribed, a NIC's fault shows on the paths within its leaf,
    and the longer paths' probes would only dilute them. Each as its probes over every path,
    those over the paths not masked, and its members."""
    out = []
    for crossing, members in classes if len(masked) else []:
        if any(_component_kind(topology, c) == "nic" for c in members):
            keep = crossing[~np.isin(hops[crossing], masked)]
            if MIN_PROBES <= len(keep) < len(crossing):
                out.append((crossing, keep, members))
    return out


def _partners(probes: Probes, crossing: np.ndarray) -> int:
    """How many host pairs (either way) the probes ``crossing`` ran between."""
    a, b = probes.src[crossing], probes.dst[crossing]
    return len(set(zip(np.minimum(a, b).tolist(), np.maximum(a, b).tolist())))


def has_peers(crossing: np.ndarray, hops: np.ndarray) -> bool:
    """Whether probes outside the class (``crossing``: its probes) ran as many hops as some of
    its own: healthy peers it can stand out from."""
    outside = np.ones(len(hops), bool)
    outside[crossing] = False
    return bool(np.isin(hops[outside], hops[crossing]).any())


def _excess_slow(left: np.ndarray, crossing: np.ndarray, very_slow: np.ndarray, hops: np.ndarray,
                 unexplained: np.ndarray) -> float:
    """How unlikely so many of ``left`` are very slow, as a normal ``z``: a binomial tail at the
    rate of very slow probes of as many hops outside the class (Jeffreys' half a probe each way)."""
    outside = unexplained.copy()
    outside[crossing] = False
    lengths, counts = np.unique(hops[left], return_counts=True)
    rates = []
    for length in lengths:
        peers = outside & (hops == length)
        rates.append((very_slow[peers].sum() + 0.5) / (peers.sum() + 1))
    n, k = len(left), int(very_slow[left].sum())
    rate = float(np.dot(rates, counts)) / n  # the mean over the class's probes
    if k <= n * rate:
        return 0.0
    i = np.arange(k, n + 1)
    log_choose = lgamma(n + 1) - np.array([lgamma(j + 1) + lgamma(n - j + 1) for j in i])
    return _normal_z(float(np.logaddexp.reduce(log_choose + i * np.log(rate) + (n - i) * np.log1p(-rate))))


def _normal_z(log_tail: float) -> float:
    """The ``z`` whose upper normal tail is ``exp(log_tail)`` (0 past a half), without
    underflow: beyond 1e-300, from the tail's asymptote ``p ≈ φ(z) / z``."""
    if log_tail >= np.log(0.5):
        return 0.0
    if log_tail > np.log(1e-300):
        return -NormalDist().inv_cdf(float(np.exp(log_tail)))
    first = np.sqrt(-2.0 * log_tail)
    return float(np.sqrt(-2.0 * log_tail - 2.0 * np.log(first) - np.log(2 * np.pi)))


def _shortfall(probes: Probes, hops: np.ndarray) -> tuple[np.ndarray, float, dict[int, float]]:
    """Each probe's shortfall on a log scale (``log(typical/value)`` for bandwidth) against the
    typical healthy probe of as many hops (of all probes, for fewer than ``MIN_PEERS`` directions):
    paths of different lengths may differ by design. Faults and other traffic only slow probes,
    and ECMP may send half a hop group through a fault, so the healthy probes are read from the
    upper quartiles: the typical value is the 75th percentile less 0.674 of the spread, read
    from each direction of a host pair once (:func:`_per_pair`). Also the noise (the upper spread
    of every probe's shortfall) and the typical value (log scale) of each length with
    ``MIN_PEERS`` directions or more."""
    logs = np.log(probes.value) if probes.higher_is_better else -np.log(probes.value)
    once, length_of = _per_pair(probes, logs, hops)
    centre = np.full(len(logs), _typical(once))
    typical: dict[int, float] = {}
    for length in np.unique(hops).tolist():
        peers = length_of == length
        if peers.sum() >= MIN_PEERS:
            centre[hops == length] = typical[length] = _typical(once[peers])
    shortfall = centre - logs
    return shortfall, max(_upper_spread(-shortfall), 1e-9), typical


def _per_pair(probes: Probes, logs: np.ndarray, hops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per direction of a host pair, the median of its probes' ``logs``, and its hop count. The
    follow-ups probe again the pairs whose probes may cross a class in doubt: counted each time,
    a fault's own probes would set what healthy looks like (a leaf switch slowed by 10%: 348 of
    the 480 probes kept may cross it, and pulled the typical probe down towards their own)."""
    pairs = pd.DataFrame({"src": probes.src, "dst": probes.dst, "log": logs, "hops": hops}).groupby(["src", "dst"])
    return pairs["log"].median().to_numpy(), pairs["hops"].first().to_numpy()


def _typical(logs: np.ndarray) -> float:
    return float(np.quantile(logs, 0.75)) - Q75 * _upper_spread(logs)


def _upper_spread(logs: np.ndarray) -> float:
    """The noise's standard deviation from the 75th and 90th percentiles, as for a normal law."""
    return float(np.quantile(logs, 0.90) - np.quantile(logs, 0.75)) / (Q90 - Q75)


def _classes(topology: nx.MultiGraph, probes: Probes, routing: Routing | None = None
             ) -> tuple[list[tuple[np.ndarray, list[Component]]], np.ndarray, dict[Component, np.ndarray]]:
    """The components every probe may cross alike, each class with the probes (indices); each
    probe's hop count; and per component, the probes whose way back (their acknowledgements)
    may cross it. With ``routing``, a probe crosses only the path it gives; probed
    ``both_ways``, it may be slowed on its partner's path too (its acknowledgements take it)."""
    graph = nx.Graph(topology)
    switches = {n for n, kind in topology.nodes(data="kind") if kind == "switch"}
    nics = {h: host_nic(topology, h) for h in probes.hosts}
    may: dict[Component, list[int]] = defaultdict(list)
    hops = np.zeros(len(probes.src), np.int64)
    back: dict[Component, list[int]] = defaultdict(list)
    routed: dict[bool, list[list[str]]] = {}  # forward or back: each probe's switches
    if routing is not None:
        routed[True] = _routed_switches(routing, probes.hosts, probes.src, probes.dst)
        routed[False] = _routed_switches(routing, probes.hosts, probes.dst, probes.src)

    def paths(p: int, s: int, d: int, forward: bool) -> list[list[str]]:
        ends = nics[probes.hosts[s]], nics[probes.hosts[d]]
        if not routed:
            return list(nx.all_shortest_paths(graph, *ends))
        return [[ends[0], *routed[forward][p], ends[1]]]

    def components(ways: list[list[str]]) -> set[Component]:
        crossed: set[Component] = set()
        for path in ways:
            crossed.update(zip(path, path[1:]))
            crossed.update(n for n in path if n in switches)
        return crossed

    routes: dict[tuple[int, int], tuple[set[Component], set[Component], int]] = {}  # a pair probed again: once
    for p, (s, d) in enumerate(zip(probes.src.tolist(), probes.dst.tolist())):
        if (s, d) not in routes:
            ways = paths(p, s, d, True)
            forward = components(ways)
            # unrouted, the way back takes the same shortest paths reversed
            returns = components(paths(p, d, s, False)) if routed else \
                {c if isinstance(c, str) else (c[1], c[0]) for c in forward}
            routes[s, d] = forward | (returns if probes.both_ways else set()), returns, len(ways[0]) - 1
        crossed, returns, hops[p] = routes[s, d]
        for component in sorted(crossed, key=str):  # not the set's order: it follows the strings' hash seed
            may[component].append(p)
        for component in returns:
            back[component].append(p)
    grouped: dict[tuple[int, ...], list[Component]] = defaultdict(list)
    for component, crossing in may.items():
        grouped[tuple(crossing)].append(component)
    return ([(np.asarray(crossing), members) for crossing, members in grouped.items()], hops,
            {c: np.asarray(ps, np.int64) for c, ps in back.items()})


def _routed_switches(routing: Routing, hosts: list[str], src: np.ndarray, dst: np.ndarray) -> list[list[str]]:
    """Per probe from ``hosts[src[i]]`` to ``hosts[dst[i]]``, the switches ``routing`` takes it
    through, routed all at once."""
    index = {h: i for i, h in enumerate(routing.hosts)}
    ids = np.array([index[h] for h in hosts], np.int64)
    _, switches = routing.route(ids[src], ids[dst])
    return [[routing.switches[k] for k in row if k >= 0] for row in switches.tolist()]


def _label(suspect: Suspect) -> str:
    """A suspect's name, and for a NIC its direction."""
    return f"{suspect.name} ({suspect.evidence['direction']})" if suspect.kind == "nic" else suspect.name


def _component_kind(topology: nx.MultiGraph, c: Component) -> str:
    """``switch``, ``nic`` (a NIC's access link, either way) or ``link``."""
    if isinstance(c, str):
        return "switch"
    return "nic" if any(topology.nodes[n].get("kind") == "nic" for n in c) else "link"


def _suspect(topology: nx.MultiGraph, members: list[Component], score: float, crossing: np.ndarray,
             shortfall: np.ndarray) -> Suspect:
    order = {"nic": 0, "link": 1, "switch": 2}
    members = sorted(members, key=lambda c: (order[_component_kind(topology, c)], c if isinstance(c, tuple) else (c,)))
    first = members[0]
    evidence = {"probes": int(len(crossing)), "mean_shortfall_pct": round(float(-np.expm1(-shortfall[crossing].mean())) * 100, 1),
                "same_as": [c if isinstance(c, str) else f"{c[0]}->{c[1]}" for c in members[1:]]}
    if isinstance(first, str):
        return Suspect("switch", first, score, evidence=evidence)
    a, b = first
    evidence = {"from": a, "to": b, **evidence}
    if _component_kind(topology, first) == "nic":
        nic = a if topology.nodes[a].get("kind") == "nic" else b
        host = next(n for n in topology[nic] if topology.nodes[n].get("kind") == "host")
        if (b, a) in members:  # probed both ways at once: no probe tells its directions apart
            evidence["direction"] = "either"
        else:
            evidence["direction"] = "sending" if a == nic else "receiving"
        return Suspect("nic", nic, score, host=host, evidence=evidence)
    return Suspect("link", f"{a}->{b}", score, evidence=evidence)
