"""Adaptive probing: every round measured again on its paths, and follow-ups where the evidence is in doubt.

**Repeats.** The job keeps one connection between two hosts, so a pair probed again takes the
path ECMP picked for it before. Every round is measured :data:`SWEEPS` times, each repeat a
share of its probe time, and each direction's median kept: a fault on a probe's path slows
every repeat, while other tenants' traffic, passing, slows some. (Follow-ups measured once
beside repeated first sweeps brought back what the repeats had cleared: their probes that
passing traffic slowed stood out against the medians' spread, tuning seed 1.)

**Follow-ups.** One sweep gives a NIC about ``n`` probes a direction and an uplink that ECMP
shares with others a fraction of its pod's: a 10% fault in 10% noise then leaves its class past
the noise but short of the localizer's threshold. So after the first sweep every class past
:data:`DOUBT` of its threshold but not named, and every suspect named with less than
:data:`CONFIRM` times it, is probed again: the host pairs whose probes may cross it and fell short
there (below), once more each (on the paths they took before; a masked NIC's, more: below), until none is left in doubt,
the extra pairs reach :data:`EXTRA` times the first sweep's, or :data:`PASSES` passes are done.
Where paths are masked (oversubscribed uplinks, :mod:`dpro.anomaly.fabric.localize`), a NIC
weighed on its paths within its leaf alone has a few pairs where an unmasked NIC has every
host: once every pair in doubt has had its probe, a pass probes each of those pairs again as
many times as the NIC's probes over every path ran between more host pairs than those
(``(n - 1) / (L - 1)`` rounded up for ``n`` hosts, ``L`` in its leaf: 5 on a 4x4-host
leaf-spine), so that its evidence grows as an unmasked NIC's would. (Designed on the
oversubscribed analogs of ``benchmarks.health_localization --tune-masked``, tuning seed 1, not on
its held-out fabric; on fabrics whose paths run alike nothing changes.)
Probes measured again through a class that other traffic or chance slowed pull it back under
its threshold; those through a fault push it past; the suspects are then named from every
probe at the stricter :data:`Z_CLASS`. A class every probe of its lengths may cross (both spines of a leaf-spine) is
not followed up: no probe outside it shows what healthy looks like. The rounds keep the pairs
of a round apart as the first sweep's do (:mod:`dpro.anomaly.fabric.schedule`). Doubt is judged
at the localizer's own thresholds (tuned for one sweep), the suspects named at :data:`Z_CLASS`.

**Distilled.** Of the pairs whose probes may cross a class in doubt, only those whose probes
through it fell short (their mean ``z`` above :data:`DISTIL`) are probed again, as in distilled
sensing (Haupt, Castro and Nowak, 2011): a pair keeps its path, so one through a slow link
stays slow, and about half the pairs a fault is not on are left out each pass (a core link
10% slow in 5% noise, six trials, the first pass: 94% of the slow pairs in its class kept,
54% of the rest). One of a fat-tree pod's four links to the cores slows a quarter of its
class's probes; probed again alike, the other three quarters dilute it as much each pass. The
pairs probed again are fresh draws, so other tenants' traffic does not follow them; but a
class's earlier probes, which chance put in doubt, weigh more against fewer new ones, so the
bar after follow-ups rose with it.

**Without a topology** the matrix alone names hosts and paths
(:func:`dpro.anomaly.fabric.probes.analyze`), and :func:`confirm_paths` probes again the pairs of
the paths it names; the matrix then weighs each of their directions at the better of its two
measurements: a slow path stays slow, a moment's load passes. A host is named from its whole row and column,
measured in rounds apart, so it is not probed again (a throttled host's pairs would cost the
most time of any). (On the 4-host namespace cluster of ``tests/test_health.py``, 2026-12-07, a
healthy night named the path ``dh-h0<->dh-h2``: one direction at 43% of the others' rate, the
other pair of its round 24% down, so the round's loss, :func:`dpro.anomaly.fabric.probes.analyze`,
left it named.)

**Settings.** :data:`DOUBT` was tuned on ``benchmarks.health_localization``'s tuning trials
(``--tune``), when its simulator gave every probe a new path; :data:`SWEEPS` later
(``--tune-sweeps``), on the paths a job's connections keep; :data:`DISTIL` and :data:`Z_CLASS`
together (``--tune-distil``: 0.0 and 6.5 of -inf, -0.5, 0.0, 0.5 by 5.5, 6.0, 6.5, the best
mean recall at 10–40% faults within the false-alarm goals, then judged on the two fabrics'
trials pooled; -inf and 5.5 before, every pair probed again); :data:`PASSES` and
:data:`Z_CLASS` again later (``--tune-passes``). :data:`EXTRA` (one more sweep at most: the
check's time) and :data:`CONFIRM` were set, not tuned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import networkx as nx
import numpy as np
import pandas as pd

from dpro.anomaly.fabric.localize import Weighed, has_peers, weigh
from dpro.anomaly.fabric.probes import Probes, analyze
from dpro.anomaly.fabric.routing import Routing
from dpro.anomaly.fabric.schedule import probe_rounds

__all__ = ["CONFIRM", "DISTIL", "DOUBT", "EXTRA", "PASSES", "SWEEPS", "Z_CLASS", "confirm_paths", "follow_up",
           "probe_adaptively", "repeated"]

DOUBT = 0.3
CONFIRM = 2.0
EXTRA = 1.0
PASSES = 8
"""The most follow-up passes; most checks stop sooner, when nothing is left in doubt or the
extra pairs reach :data:`EXTRA` times the first sweep's. A slow link among a fat-tree pod's
four uplinks slows a quarter of its class's probes, and its evidence grows pass by pass, so
three passes left some short of the bar (in an exploratory script, not kept: 40 trials of tuning
seed 1 of a 10% inter-switch fault in 5% noise on the fat tree, 9 missed, the faulty class of 7
of them still gaining at the third pass). Chosen with :data:`Z_CLASS` by ``benchmarks.health_localization
--tune-passes`` (3, 5, 8 passes by bars 6.0, 6.5, 7.0, paired trials): mean recall at 10–40%
faults 0.846 at 3 passes and 6.5 (before), 0.864 at 8 and 7.0, whose light-background false
alarms (0.013) are within 0.02 where 0.028 were not; the rounds a trial 1.98 times the first
sweep's, 1.80–1.83 before."""
SWEEPS = 8
"""How many times each round is measured, each repeat a share of its probe time (see the module
docstring)."""
DISTIL = 0.5
"""A pair whose probes through a class in doubt fell short by no more than this (their mean
``z``) is not probed again for it (see the module docstring); ``-inf``: every pair is. Chosen on
the tuning seed with each fabric's false alarms judged on its own (it was 0.0 when the tuner
pooled the fabrics)."""
Z_CLASS = 7.0
"""The pooled threshold after follow-ups: other tenants' traffic slows a few probes of every
class, and follow-ups add probes to the classes the first sweep's chance picked, fewer of them
where they are distilled; a stricter bar keeps false alarms where the first sweep alone had
them. 6.5 at three passes; 7.0 chosen with :data:`PASSES` (see there)."""

Measure = Callable[[list[list[tuple[int, int]]], int], Probes]
"""Probes the rounds given, numbering them from the second argument; the probes measured."""
Agree = Callable[[list[tuple[int, int]]], list[tuple[int, int]]]
Schedule = Callable[[list[tuple[int, int]]], list[list[tuple[int, int]]]]
"""The rounds of the host pairs given; a pair listed twice goes into two rounds."""


def follow_up(topology: nx.MultiGraph, probes: Probes, budget: int, doubt: float = DOUBT,
              confirm: float = CONFIRM, routing: Routing | None = None, distil: float = DISTIL,
              masked_again: bool = True) -> list[tuple[int, int]]:
    """The host pairs (indices, ``a < b``) to probe again, at most ``budget``: those whose
    probes may cross a class in doubt and fell short there by more than ``distil`` (mean
    ``z``), the class nearest its threshold first (``routing``: the known routes, if any); each
    pair once, then a masked NIC's again as many more times as :func:`_as_often_as_unmasked` says
    (a pair listed twice is probed in two rounds; ``masked_again`` False: each pair once)."""
    weighed = weigh(topology, probes, routing=routing)
    targets = [(abs(1.0 - margin), crossing) for _, margin, crossing in weighed.named if margin < confirm]
    targets += [(1.0 - margin, crossing) for crossing, margin in weighed.open if doubt <= margin < 1.0]
    # a class without healthy peers: more probes through it only add to what other traffic slowed
    targets = [(order, crossing) for order, crossing in targets if has_peers(crossing, weighed.hops)]
    once: dict[tuple[int, int], int] = {}  # each pair, how many times to probe it again
    for _, crossing in sorted(targets, key=lambda t: t[0]):
        again = _as_often_as_unmasked(weighed, crossing) if masked_again else 1
        for pair in _slow_pairs(probes, crossing, weighed.z, distil):
            once[pair] = max(once.get(pair, 0), again)
    # every pair once, the classes nearest their threshold first; then the masked NICs' repeats
    return [*once, *(pair for pair, n in once.items() for _ in range(n - 1))][:budget]


def _as_often_as_unmasked(weighed: Weighed, crossing: np.ndarray) -> int:
    """How many times a pass probes again the pairs of a class in doubt whose probes are
    ``crossing``: once, but for a NIC weighed on its paths not masked alone (oversubscribed
    uplinks: its paths within its leaf; ``crossing`` among those probes), as many times as its
    probes over every path ran between more host pairs than those (rounded up), so that the
    probes its fault shows on grow as an unmasked NIC's would."""
    return max((again for keep, again in weighed.unmasked if np.isin(crossing, keep).all()), default=1)


def _slow_pairs(probes: Probes, crossing: np.ndarray, z: np.ndarray, distil: float) -> list[tuple[int, int]]:
    """The host pairs (``a < b``, in the order of their first probe) of the probes ``crossing``
    a class whose mean ``z`` over those probes is above ``distil``."""
    src, dst = probes.src[crossing], probes.dst[crossing]
    frame = pd.DataFrame({"a": np.minimum(src, dst), "b": np.maximum(src, dst), "z": z[crossing]})
    means = frame.groupby(["a", "b"], sort=False)["z"].mean()
    return [(int(a), int(b)) for (a, b), mean in means.items() if mean > distil]


def repeated(measure: Measure, rounds: list[list[tuple[int, int]]], sweeps: int, first_round: int = 0) -> Probes:
    """``rounds`` measured ``sweeps`` times (numbered on from ``first_round``), each direction's
    median in the first measurement's rounds; a repeat the check's time budget cut short is
    left out."""
    probes = measure(rounds, first_round)
    repeats = [measure(rounds, first_round + k * len(rounds)) for k in range(1, sweeps)]
    whole = [r for r in repeats if len(r.value) == len(probes.value)]
    return probes.medians(*whole)


def probe_adaptively(measure: Measure, topology: nx.MultiGraph, tiers: Sequence[Sequence[str]],
                     first: list[list[tuple[int, int]]], extra: float = EXTRA, passes: int = PASSES,
                     doubt: float = DOUBT, confirm: float = CONFIRM,
                     agree: Agree = lambda pairs: pairs, schedule: Schedule | None = None,
                     routing: Routing | None = None, sweeps: int = SWEEPS, distil: float = DISTIL,
                     masked_again: bool = True
                     ) -> tuple[Probes, int]:
    """The first sweep's rounds, then up to ``passes`` follow-ups, each measured ``sweeps`` times
    (:func:`repeated`), distilled at ``distil`` (:data:`DISTIL`); every probe kept and the number
    of host-pair probes the follow-ups measured (a pair probed twice in a pass counts twice).
    ``agree``: the pairs every prober takes, given this one's (a job's ranks take rank 0's:
    their floats may differ by a last bit). ``schedule``: the rounds
    of the pairs a follow-up probes (default: :func:`probe_rounds` over ``tiers``);
    ``routing``: the known routes the localizer weighs the probes by, if any; ``masked_again``:
    see :func:`follow_up`."""
    probes = repeated(measure, first, sweeps)
    next_round = sweeps * len(first)
    budget = int(extra * sum(len(r) for r in first))
    added = 0
    for _ in range(passes):
        if not len(probes.value):  # the check's time budget ran out before the first round
            break
        pairs = agree(follow_up(topology, probes, budget - added, doubt, confirm, routing, distil, masked_again))
        if not pairs:
            break
        rounds = schedule(pairs) if schedule is not None else probe_rounds(len(probes.hosts), tiers, pairs)
        more = repeated(measure, rounds, sweeps, next_round)
        if not len(more.value):  # the check's time budget ran out
            break
        next_round += sweeps * len(rounds)
        probes = probes.extended(more)
        added += len({(r, min(a, b), max(a, b)) for r, a, b in zip(more.round.tolist(), more.src.tolist(),
                                                                    more.dst.tolist())})
    return probes, added


def confirm_paths(measure: Measure, probes: Probes, tiers: Sequence[Sequence[str]], sweeps: int, first_round: int,
                  agree: Agree = lambda pairs: pairs) -> tuple[Probes, int]:
    """Without a topology: the host pairs of the paths the matrix names
    (:func:`dpro.anomaly.fabric.probes.analyze`) probed again, ``sweeps`` times as every round
    (rounds numbered on from ``first_round``, past the first sweep's); every probe kept (the matrix
    weighs a direction measured twice at the better of the two, :meth:`Probes.at_best`) and the
    pairs probed again (those the check's time budget left measured). A
    host is named from its whole row and column, measured in rounds apart; a path from a
    direction or two of one round, which one moment's load on the probers can slow as much
    (see the module docstring)."""
    index = {host: i for i, host in enumerate(probes.hosts)}
    pairs = sorted({tuple(sorted(index[h] for h in s.name.split("<->"))) for s in analyze(probes) if s.kind == "path"})
    pairs = agree([(a, b) for a, b in pairs])
    if not pairs:
        return probes, 0
    again = repeated(measure, probe_rounds(len(probes.hosts), tiers, pairs), sweeps, first_round)
    if not len(again.value):  # the check's time budget ran out
        return probes, 0
    return probes.extended(again), len(set(zip(np.minimum(again.src, again.dst).tolist(),
                                               np.maximum(again.src, again.dst).tolist())))
