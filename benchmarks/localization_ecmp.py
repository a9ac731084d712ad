"""Fault localization when the probes' ECMP paths are unknown and probes of a round share links.

The harder variant of :mod:`benchmarks.localization`, on the same fat trees with the same fault
kinds and noise, simulated by :mod:`benchmarks.ecmp_fabric`: every probe takes one of its
equal-cost paths at random, unseen by the analysis, and probes of a round that cross a link the
same way split its capacity. The analysis knows only each probe's set of paths
(:func:`dpro.anomaly.fabric.tomography.localize` with ``ecmp="all"``).

**Schedule.** In the circle schedule, where every host of a leaf probes at once, most probes
that leave their switch share a link with another probe of their round (the ``collided`` rows,
baseline column). Probes run in waves instead (:mod:`dpro.anomaly.fabric.waves`): every host probes one
partner, but at most one pair leaves each edge switch and POD_PAIRS pairs each pod, so probes
can meet only on a pod's core links (dpro column), where the analysis leaves out the slow probes
that may have met. One pair per pod would rule collisions out, but a pod's core links would then
carry too few probes to find a flapping one. A wave carries far fewer probes across the fabric
than a circle round, so there are 1,024 waves (17 minutes at one wave a second) where the
known-path rows probe 256 rounds.

**Scoring.** Probes cannot tell apart links on the same share of the same paths (a leaf's 16
uplinks, a pod's 256 core links; see :mod:`dpro.anomaly.fabric.multipath`), so a suspect is right when
a fault is the component it names or one listed in its ``same_as``; a fault is found when a
suspect is right about it. The baseline is the plain greedy set cover of the known-path rows,
scored the same way, taking each probe to have followed the routing's hash.

**Not held out.** The probes are simulated along the paths of dpro's own routing
(:mod:`dpro.anomaly.fabric.routing`), the model the localizer is built on, so precision and
recall here measure the algorithm on its own assumptions: their rows never count as met (goal
column: "not held out"). The held-out score is ``benchmarks.health_localization``, on a
simulator that shares no code or path model with dpro.

    python -m benchmarks --only localization [--quick]
"""

from __future__ import annotations

import time

import networkx as nx
import numpy as np

from dpro.anomaly.fabric.multipath import classes
from dpro.anomaly.fabric.probes import Probes, round_robin
from dpro.anomaly.fabric.routing import Routing
from dpro.anomaly.fabric.tomography import localize
from dpro.anomaly.fabric.topology import fat_tree
from dpro.anomaly.fabric.waves import edge_groups, waves

from .ecmp_fabric import Degradation, bandwidth
from .localization import (FAULT_KINDS, NOISE, NOT_HELD_OUT, QUICK_SIZES, QUICK_TRIALS, SIZES, TRIALS, _plain_cover,
                           _rates, _row)

WAVES = 1024
POD_PAIRS = 8  # pairs that leave each pod per wave
SECONDS_PER_WAVE = 1.0
MAX_ROUNDS = 256  # of the circle schedule, for the collided row (as in benchmarks.localization)
COLLIDED_GOAL = 0.05  # collided probes are left out: a few percent of the evidence


def _faults(rng: np.random.Generator, kinds: list[str], routing: Routing,
            n_rounds: int) -> list[tuple[str, Degradation]]:
    """Faults of the given kinds on distinct random components, as in :mod:`benchmarks.localization`."""
    n_hosts = len(routing.hosts)
    fabric = n_hosts + np.unique(routing.next_link[routing.next_link >= 0])  # switch-to-switch links
    out: list[tuple[str, Degradation]] = []
    for kind in kinds:
        pool = fabric if kind.endswith("link") else np.arange(n_hosts)
        c = int(rng.choice(np.setdiff1d(pool, [d.component for _, d in out])))
        if kind == "slow host":
            share = rng.uniform(0.3, 0.8, n_rounds)
        elif kind == "flapping link":
            share = np.where(rng.random(n_rounds) < rng.uniform(0.2, 0.6), rng.uniform(0.2, 0.5), 1.0)
        else:
            share = np.full(n_rounds, rng.uniform(0.2, 0.7))
        out.append((str(kind), Degradation(c, share)))
    return out


def schedule(topology: nx.MultiGraph, routing: Routing, n_waves: int,
             rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Waves in which up to POD_PAIRS pairs leave each pod and one each edge switch."""
    levels = edge_groups(topology, routing)
    return waves(levels, n_waves, rng, [POD_PAIRS, 1][-len(levels):])


def measure(rng: np.random.Generator, topology: nx.MultiGraph, routing: Routing, kinds: list[str],
            n_waves: int = WAVES) -> tuple[Probes, list[tuple[str, Degradation]]]:
    """Probes of ``n_waves`` random waves with faults of the given kinds."""
    pairs, wave = schedule(topology, routing, n_waves, rng)
    src, dst, rounds = np.r_[pairs[:, 0], pairs[:, 1]], np.r_[pairs[:, 1], pairs[:, 0]], np.r_[wave, wave]
    faults = _faults(rng, kinds, routing, n_waves)
    share, _ = bandwidth(routing, src, dst, rounds, [d for _, d in faults], rng)
    value = 100.0 * share * rng.lognormal(0.0, NOISE, len(src))
    return Probes(routing.hosts, src, dst, rounds, value), faults


def collided(rng: np.random.Generator, topology: nx.MultiGraph, routing: Routing) -> tuple[float, float]:
    """Share of the probes leaving their switch, on a healthy fabric, that share a link with
    another probe of their round: in waves, and in the circle schedule (up to MAX_ROUNDS rounds)."""
    circle = round_robin(len(routing.hosts))[:MAX_ROUNDS]
    rounds = np.repeat(np.arange(len(circle)), circle.shape[1])
    shares = []
    for pairs, rounds in (schedule(topology, routing, MAX_ROUNDS, rng), (circle.reshape(-1, 2), rounds)):
        src, dst = np.r_[pairs[:, 0], pairs[:, 1]], np.r_[pairs[:, 1], pairs[:, 0]]
        _, met = bandwidth(routing, src, dst, np.r_[rounds, rounds], [], rng)
        shares.append(float(met[routing.host_switch[src] != routing.host_switch[dst]].mean()))
    return shares[0], shares[1]


def _named(routing: Routing, name: str) -> int:
    """The component id (see :func:`dpro.anomaly.fabric.tomography.components`) of a NIC, link or switch."""
    if name in routing.nics:
        return routing.nics.index(name)
    if name in routing.links:
        return len(routing.hosts) + routing.links.index(name)
    return len(routing.hosts) + len(routing.links) + routing.switches.index(name)


def _counts(named: list[set[int]], injected: set[int]) -> np.ndarray:
    """Suspects, right suspects, faults, faults found (``named``: each suspect's class)."""
    return np.array([len(named), sum(bool(c & injected) for c in named), len(injected),
                     sum(any(f in c for c in named) for f in injected)])


def trial(rng: np.random.Generator, topology: nx.MultiGraph, n_faults: int) -> tuple[np.ndarray, np.ndarray, float,
                                                                                         dict[str, np.ndarray]]:
    """One trial: counts (see :func:`_counts`) of dpro and of the baseline, dpro's seconds, and
    per fault kind, faults injected and found."""
    probes, faults = measure(rng, topology, Routing.build(topology), list(rng.choice(FAULT_KINDS, n_faults)))
    start = time.perf_counter()
    routing = Routing.build(topology)
    suspects = localize(topology, probes, routing=routing, ecmp="all")
    seconds = time.perf_counter() - start
    cls = classes(routing, probes.src, probes.dst)

    def members(c: int) -> set[int]:
        return set(cls.members(cls.of[c]).tolist()) if cls.of[c] >= 0 else {c}

    named = [members(_named(routing, s.name)) for s in suspects]
    injected = {d.component for _, d in faults}
    by_kind: dict[str, np.ndarray] = {}
    for kind, d in faults:
        by_kind[kind] = by_kind.get(kind, np.zeros(2, np.int64)) + [1, any(d.component in c for c in named)]
    baseline = [members(c) for c in _plain_cover(routing, probes)]
    return _counts(named, injected), _counts(baseline, injected), seconds, by_kind


def rows(quick: bool = False) -> list[dict]:
    """The benchmark rows of this variant, per size: collided probes, precision, recall, time."""
    out = []
    rng = np.random.default_rng(20240612)
    for n in QUICK_SIZES if quick else SIZES:
        topology = fat_tree(n)
        waves_collided, circle_collided = collided(rng, topology, Routing.build(topology))
        ours, plain = np.zeros(4, np.int64), np.zeros(4, np.int64)
        by_kind: dict[str, np.ndarray] = {}
        slowest = 0.0
        n_trials = QUICK_TRIALS if quick else TRIALS
        for _ in range(n_trials):
            counts, baseline, seconds, kinds = trial(rng, topology, int(rng.integers(0, 5)))
            ours, plain, slowest = ours + counts, plain + baseline, max(slowest, seconds)
            for kind, found in kinds.items():
                by_kind[kind] = by_kind.get(kind, np.zeros(2, np.int64)) + found
        missed = ", ".join(f"{kind} {f}/{i}" for kind, (i, f) in sorted(by_kind.items()) if f < i)
        minutes = WAVES * SECONDS_PER_WAVE / 60
        case = (f"ECMP paths unknown, shared links, {n} hosts, {WAVES} waves ({minutes:.0f} min), "
                f"{n_trials} trials, {ours[2]} faults" + (f" (found: {missed})" if missed else ""))
        (precision, recall), (plain_precision, plain_recall) = _rates(ours), _rates(plain)
        out += [
            _row(f"healthy fabric, {n} hosts, probes leaving their switch: waves vs circle schedule",
                 "collided probes", waves_collided, circle_collided, f"<= {COLLIDED_GOAL}",
                 waves_collided <= COLLIDED_GOAL),
            _row(case, "precision", precision, plain_precision, NOT_HELD_OUT, False),
            _row(case, "recall", recall, plain_recall, NOT_HELD_OUT, False),
            _row(case, "localize s (slowest)", slowest, 10.0, "<= 10 s", slowest <= 10),
        ]
    return out
