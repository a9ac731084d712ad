"""Probe rounds: every pair of hosts once, and no two probes of a round on one link.

The one schedule of the pairwise probes (``dpro health``'s over the job's backend, ``dpro anomaly
probe``'s over a traffic engine). :func:`probe_rounds` holds under any ECMP hash: given each
host's edge switch and pod, at most one pair a round leaves any switch or pod, so no two probes
of a round share a link whichever path they take. That costs rounds where pods are many: a k=4
fat tree (16 hosts) takes 52 rounds instead of 15, k=6 (54 hosts) 486, k=8 (128 hosts) 1,799.

:func:`disjoint_rounds`, for fabrics whose routes are known, lets a pod send as many pairs a
round as its uplinks carry apart: every pair once, both directions at once (links are full
duplex), and no two probes of a round on one link in one direction. Each probe's path is the
one the routing picks (:class:`dpro.anomaly.fabric.routing.Routing`: by a hash of the probe, or
by destination as InfiniBand's fat-tree routing does). The pairs come in matchings
(:func:`_mirrored`: a host's partner is its mirror, digit by digit, in the radix of the routes'
choices); a matching whose probes share no link is a round as it is, and the pairs of the others
are placed greedily, a round taking a pair only when none of its two paths' links is already
used in that direction.

**Only under known routes.** The rounds are link-disjoint under the routing's own choices,
which stand for routes the analysis can reproduce (InfiniBand's static routing, probes that pin
their path). Under an ECMP hash the prober cannot see, two probes of a round may share a link;
only the rule without routes is safe there.

**Bound.** Each host probes once a round and each directed link carries one probe a round, so
no schedule needs fewer rounds than :func:`lower_bound`: the larger of ``n - 1`` and the most
probes the routes put on one directed link. Under routes by destination on a full fat tree
(hosts numbered switch by switch) every matching shares no link: ``n`` rounds, one more than the
bound (:mod:`dpro.anomaly.fabric.routing` says why). Under a hash, links' loads are uneven and
the greedy placement takes 1.5 to 2 times the bound (``benchmarks/probe_schedule.py`` measures
both).

    >>> rounds = disjoint_rounds(Routing.build(fat_tree(1024, radix=16), by="destination"))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpro.anomaly.fabric.probes import round_robin
from dpro.anomaly.fabric.routing import CHUNK, Routing

__all__ = ["directed_links", "disjoint_rounds", "lower_bound", "probe_rounds"]


def probe_rounds(n: int, tiers: Sequence[Sequence[str]] = (),
                 pairs: Sequence[tuple[int, int]] | None = None) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs of host indices ``0..n-1`` covering ``pairs`` (default: every
    pair once; a pair listed twice is probed in two rounds). Each of ``tiers`` names every
    host's group at one tier (its edge switch, its pod): at most one pair per round leaves any
    group of any tier."""
    if pairs is None and not tiers:  # the circle method: n - 1 rounds (n for odd n)
        return [[(min(int(a), int(b)), max(int(a), int(b))) for a, b in r] for r in round_robin(n)]
    if pairs is None:
        left = [(a, b) for a in range(n) for b in range(a + 1, n)]
    else:
        left = [(min(a, b), max(a, b)) for a, b in pairs]
    # greedily, in the circle method's order ((a + b) mod n)
    left.sort(key=lambda p: ((p[0] + p[1]) % n, p))
    exits = {(a, b): {(t, g[h]) for t, g in enumerate(tiers) if g[a] != g[b] for h in (a, b)} for a, b in left}
    rounds = []
    while left:
        busy_hosts: set[int] = set()
        leaving: set[tuple[int, str]] = set()  # (tier, group)
        chosen: list[int] = []
        for i, (a, b) in enumerate(left):
            if a in busy_hosts or b in busy_hosts or exits[a, b] & leaving:
                continue
            chosen.append(i)
            busy_hosts |= {a, b}
            leaving |= exits[a, b]
        rounds.append([left[i] for i in chosen])
        taken = set(chosen)
        left = [p for i, p in enumerate(left) if i not in taken]
    return rounds


WINDOW = 4
"""Candidates a round considers, in hosts: ``WINDOW * n`` pairs from the front of those left."""


def directed_links(routing: Routing, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Per probe, the switch-to-switch links it crosses as directed ids ``2 * link + way``
    (``way`` 1 from the lower-numbered switch to the higher), ``(P, max_hops)``, -1 padded."""
    links, switches = routing.route(src, dst)
    way = (switches[:, :-1] < switches[:, 1:]).astype(np.int32)
    return np.where(links >= 0, 2 * links + way, -1)


def _pairs(n: int) -> np.ndarray:
    """Every pair ``a < b`` of ``0..n-1``, round after round of the circle method
    (:func:`dpro.anomaly.fabric.probes.round_robin`)."""
    return np.sort(round_robin(n).reshape(-1, 2), axis=1)


def _mirrored(routing: Routing, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every pair ``a < b`` of positions in ``members`` once, grouped into matchings, and each
    pair's matching. Written in the mixed radix of the routes' choices (``k1``, ``k2``, ... as
    :meth:`Routing.choices` sees them from the first host to the last, then what is left), a
    host's partner in matching ``s`` has, digit by digit, ``s - digit`` (mod the digit's base).
    Under routes by destination on a full fat tree no two probes of a matching share a directed
    link (:mod:`dpro.anomaly.fabric.routing`). Where the routes make no choice (one switch),
    the circle method's ``n - 1`` perfect matchings instead."""
    bases = routing.choices(0, len(routing.hosts) - 1)
    if not bases:
        pairs = _pairs(len(members))
        return pairs, np.arange(len(pairs)) // (len(members) // 2)
    bases.append(-(-len(routing.hosts) // int(np.prod(bases, dtype=np.int64))))
    hosts = members.astype(np.int64)
    key, scale = np.zeros((len(members), len(members)), np.int64), 1
    for base in bases:
        digit = hosts % base
        key += (digit[:, None] + digit[None, :]) % base * scale
        hosts, scale = hosts // base, scale * base
    a, b = np.triu_indices(len(members), 1)
    matching = key[a, b]
    order = np.argsort(matching, kind="stable")
    return np.stack([a[order], b[order]], axis=1), matching[order]


def _clashing(held: np.ndarray, matching: np.ndarray, pad: int) -> np.ndarray:
    """Per pair, whether its matching (pairs sorted by it) holds a resource twice."""
    ids, starts = np.unique(matching, return_index=True)
    bounds = np.r_[starts, len(matching)]
    clash = np.zeros(len(ids), bool)
    per_chunk = max(1, (1 << 24) // (pad + 1))  # matchings counted at a time: bounded memory
    for first in range(0, len(ids), per_chunk):
        last = min(first + per_chunk, len(ids))
        rows = slice(bounds[first], bounds[last])
        local = np.repeat(np.arange(last - first), np.diff(bounds[first:last + 1]))
        counts = np.bincount((local[:, None] * (pad + 1) + held[rows]).ravel(), minlength=(last - first) * (pad + 1))
        counts = counts.reshape(last - first, pad + 1)[:, :pad]
        clash[first:last] = counts.max(axis=1) > 1
    return np.repeat(clash, np.diff(bounds))


def _resources(routing: Routing, members: np.ndarray, pairs: np.ndarray) -> tuple[np.ndarray, int]:
    """Per pair, what it holds for a round: its two hosts and both paths' directed links; and
    how many resource ids there are."""
    a, b = members[pairs[:, 0]], members[pairs[:, 1]]
    parts = [slice(start, start + CHUNK) for start in range(0, len(a), CHUNK)]  # bounded memory
    ways = [directed_links(routing, a[s], b[s]) for s in parts]
    back = [directed_links(routing, b[s], a[s]) for s in parts]
    n_links = 2 * len(routing.links)
    hosts = pairs.astype(np.int32) + n_links
    held = np.concatenate([hosts, np.concatenate(ways), np.concatenate(back)], axis=1)
    return held, n_links + len(members)


def disjoint_rounds(routing: Routing, members: np.ndarray | None = None,
                    pairs: Sequence[tuple[int, int]] | None = None) -> list[np.ndarray]:
    """Rounds covering ``pairs`` of positions in ``members`` (host indices of ``routing``;
    default all; a pair listed twice is probed in two rounds) or, by default, every pair once;
    each pair both ways at once, no directed link used twice in a round (see the module
    docstring). Each round is ``(P, 2)`` of positions in ``members``, ``a < b``."""
    members = np.arange(len(routing.hosts)) if members is None else np.asarray(members, np.int64)
    n = len(members)
    if n < 2 or (pairs is not None and not len(pairs)):
        return []
    if pairs is None:
        pairs, matching = _mirrored(routing, members)
    else:  # placed greedily, in the order given
        pairs, matching = np.sort(np.asarray(pairs, np.int64).reshape(-1, 2), axis=1), None
    held, n_ids = _resources(routing, members, pairs)
    held = np.where(held >= 0, held, n_ids)  # the last id stands for the padding
    if matching is None:
        return _placed(pairs, held, n_ids, n)
    # a matching that holds no resource twice is a round as it is; the others' pairs are placed
    # greedily, in their matchings' order
    clash = _clashing(held, matching, n_ids)
    whole = np.flatnonzero(~clash)
    rounds = np.split(pairs[whole], np.flatnonzero(np.diff(matching[whole])) + 1) if len(whole) else []
    return rounds + _placed(pairs[clash], held[clash], n_ids, n)


def _placed(pairs: np.ndarray, held: np.ndarray, n_ids: int, n: int) -> list[np.ndarray]:
    """Rounds of ``pairs`` placed greedily: each round takes, from the front of those left
    (``WINDOW * n`` at a time), the pairs whose resources are still free."""
    rounds = []
    owner = np.zeros(n_ids + 1, np.int64)
    left = np.zeros(0, np.int64)  # pairs tried and not placed, oldest first
    cursor = 0
    while len(left) or cursor < len(pairs):
        take = max(0, WINDOW * n - len(left))
        candidates = np.r_[left, np.arange(cursor, min(cursor + take, len(pairs)))]
        cursor = min(cursor + take, len(pairs))
        placed = _fill(held[candidates], owner, n_ids)
        rounds.append(pairs[candidates[placed]])
        left = candidates[~placed]
    return rounds


def _fill(held: np.ndarray, owner: np.ndarray, pad: int) -> np.ndarray:
    """Which candidates (in priority order) a round takes: repeatedly, every candidate that is
    first in line for all it holds, among those whose resources are still free."""
    placed = np.zeros(len(held), bool)
    used = np.zeros(len(owner), bool)
    alive = np.arange(len(held))
    while len(alive):
        flat = held[alive]
        owner[flat] = len(held)  # the first in line for each resource
        np.minimum.at(owner, flat.ravel(), np.repeat(alive, flat.shape[1]))
        first = (owner[flat] == alive[:, None]) | (flat == pad)
        won = alive[first.all(axis=1)]
        placed[won] = True
        used[held[won].ravel()] = True
        used[pad] = False
        alive = alive[~placed[alive] & ~used[held[alive]].any(axis=1)]
    return placed


def lower_bound(routing: Routing, members: np.ndarray | None = None) -> int:
    """A bound no schedule of every pair (both ways at once, one probe per directed link a
    round) beats: the larger of ``n - 1`` and the most probes on one directed link. Not always
    reached: odd ``n`` needs ``n`` rounds, and the links' loads need not line up."""
    members = np.arange(len(routing.hosts)) if members is None else np.asarray(members, np.int64)
    n = len(members)
    if n < 2:
        return 0
    pairs = _pairs(n)
    held, n_ids = _resources(routing, members, pairs)
    links = held[:, 2:]
    load = np.bincount(links[links >= 0].ravel(), minlength=n_ids)
    return int(max(n - 1, load.max(initial=0)))
