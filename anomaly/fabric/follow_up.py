"""Adaptive probing: after a sweep, probe again where the evidence is in doubt.

One sweep gives a NIC about ``n`` probes a direction and an uplink that ECMP shares with others
a fraction of its pod's: a 10% fault in 10% noise then leaves its class past the noise but short
of the localizer's threshold. So after the first sweep every class past :data:`DOUBT` of its
threshold but not named, and every suspect named with less than :data:`CONFIRM` times it, is
probed again: the host pairs whose probes may cross it, once more each (each probe a new
connection, so ECMP may pick another path), until none is left in doubt, the extra pairs reach
:data:`EXTRA` times the first sweep's, or :data:`PASSES` passes are done. Fresh probes through a
class that stood out by chance pull it back under its threshold; those through a fault push it
past; the suspects are then named from every probe at the stricter :data:`Z_CLASS`. A class
every probe of its lengths may cross (both spines of a leaf-spine) is not followed up: no probe
outside it shows what healthy looks like. The rounds keep the pairs of a round apart as the
first sweep's do (:mod:`dpro.anomaly.fabric.schedule`). Doubt is judged at the
localizer's own thresholds (tuned for one sweep), the suspects named at :data:`Z_CLASS`. Of the
settings, :data:`DOUBT` and :data:`Z_CLASS` were tuned on ``benchmarks.health_localization``'s
tuning trials (``--tune``); :data:`EXTRA` (one more sweep at most: the check's time),
:data:`CONFIRM` and :data:`PASSES` were set, not tuned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import networkx as nx

from dpro.anomaly.fabric.localize import has_peers, weigh
from dpro.anomaly.fabric.probes import Probes
from dpro.anomaly.fabric.routing import Routing
from dpro.anomaly.fabric.schedule import probe_rounds

__all__ = ["CONFIRM", "DOUBT", "EXTRA", "PASSES", "Z_CLASS", "follow_up", "probe_adaptively"]

DOUBT = 0.3
CONFIRM = 2.0
EXTRA = 1.0
PASSES = 3
Z_CLASS = 5.5
"""The pooled threshold after follow-ups: other tenants' traffic slows a few probes of every
class, and follow-ups add probes to the classes the first sweep's chance picked; a stricter bar
keeps false alarms where the first sweep alone had them."""

Measure = Callable[[list[list[tuple[int, int]]], int], Probes]
"""Probes the rounds given, numbering them from the second argument; the probes measured."""
Agree = Callable[[list[tuple[int, int]]], list[tuple[int, int]]]
Schedule = Callable[[list[tuple[int, int]]], list[list[tuple[int, int]]]]
"""The rounds of the host pairs given."""


def follow_up(topology: nx.MultiGraph, probes: Probes, budget: int, doubt: float = DOUBT,
              confirm: float = CONFIRM, routing: Routing | None = None) -> list[tuple[int, int]]:
    """The host pairs (indices, ``a < b``) to probe again, at most ``budget``: those whose
    probes may cross a class in doubt, the class nearest its threshold first (``routing``:
    the known routes, if any)."""
    weighed = weigh(topology, probes, routing=routing)
    targets = [(abs(1.0 - margin), crossing) for _, margin, crossing in weighed.named if margin < confirm]
    targets += [(1.0 - margin, crossing) for crossing, margin in weighed.open if doubt <= margin < 1.0]
    # a class without healthy peers: more probes through it only add to what other traffic slowed
    targets = [(order, crossing) for order, crossing in targets if has_peers(crossing, weighed.hops)]
    pairs: dict[tuple[int, int], None] = {}
    for _, crossing in sorted(targets, key=lambda t: t[0]):
        for s, d in zip(probes.src[crossing], probes.dst[crossing]):
            pairs[min(int(s), int(d)), max(int(s), int(d))] = None
    return list(pairs)[:budget]


def probe_adaptively(measure: Measure, topology: nx.MultiGraph, tiers: Sequence[Sequence[str]],
                     first: list[list[tuple[int, int]]], extra: float = EXTRA, passes: int = PASSES,
                     doubt: float = DOUBT, confirm: float = CONFIRM,
                     agree: Agree = lambda pairs: pairs, schedule: Schedule | None = None,
                     routing: Routing | None = None) -> tuple[Probes, int]:
    """The first sweep's rounds, then up to ``passes`` follow-ups; every probe measured and the
    number of pairs the follow-ups measured. ``agree``: the pairs every prober takes, given this
    one's (a job's ranks take rank 0's: their floats may differ by a last bit). ``schedule``:
    the rounds of the pairs a follow-up probes (default: :func:`probe_rounds` over ``tiers``);
    ``routing``: the known routes the localizer weighs the probes by, if any."""
    probes = measure(first, 0)
    budget = int(extra * sum(len(r) for r in first))
    added = 0
    for _ in range(passes):
        if not len(probes.value):  # the check's time budget ran out before the first round
            break
        pairs = agree(follow_up(topology, probes, budget - added, doubt, confirm, routing))
        if not pairs:
            break
        rounds = schedule(pairs) if schedule is not None else probe_rounds(len(probes.hosts), tiers, pairs)
        more = measure(rounds, int(probes.round.max()) + 1)
        if not len(more.value):  # the check's time budget ran out
            break
        probes = probes.extended(more)
        added += len({(min(a, b), max(a, b)) for a, b in zip(more.src.tolist(), more.dst.tolist())})
    return probes, added
