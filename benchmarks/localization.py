"""Fault localization on simulated fat trees: precision, recall and time of the tomography.

Each trial builds a fat tree (:func:`dpro.anomaly.fabric.topology.fat_tree`), injects 0 to 4 random
faults and simulates the round-robin probes (both directions of every pair of a round):

- slow link: a switch-to-switch link carries 20-70% of its bandwidth;
- slow NIC: every probe to or from the host gets 20-70% of the bandwidth;
- slow host: the same with a share drawn anew each round in 30-80% (contention varies);
- flapping link: a link at 20-50% in a random 20-60% of the rounds, full speed in the others.

A probe gets the bandwidth of its slowest faulty component, times lognormal noise
(sigma 3%). Probes follow the per-hop ECMP hash that :mod:`dpro.anomaly.fabric.routing` also uses:
the analysis knows each probe's path, as it would with static routing or path-pinned probes.
At most 256 rounds are probed (all n - 1 rounds up to 257 hosts; at one round a second, 256
rounds take four minutes of probing whatever the cluster's size).

A suspect is right when it names a faulty component; a slow NIC or host is found by a suspect
naming that host's NIC (its access links and the NIC cannot be told apart by probes, and with one
NIC per host neither can a slow host). Precision: right suspects over all suspects; recall:
faults found over faults injected, both over all trials of a size. Their baseline is plain
greedy set cover on the same slow probes (the component crossed by most unexplained slow probes
first, until all are explained; no weighting by good probes, no significance test). Time:
building the routes and localizing (classifying the probes and tomography), the slowest trial;
its baseline is the 10 s goal.

The rows that follow are the harder variant, with ECMP paths unknown to the analysis and probes
that share links (:mod:`benchmarks.localization_ecmp`).

**Not held out.** The probes are simulated along the paths of dpro's own routing
(:mod:`dpro.anomaly.fabric.routing`), the model the localizer is built on, so precision and
recall here measure the algorithm on its own assumptions: their rows never count as met (goal
column: "not held out"). The held-out score is ``benchmarks.health_localization``, on a
simulator that shares no code or path model with dpro.

    python -m benchmarks --only localization [--quick]
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from dpro.anomaly.fabric.probes import Probes, round_robin, slow
from dpro.anomaly.fabric.routing import Routing
from dpro.anomaly.suspects import Suspect
from dpro.anomaly.fabric.routing import components
from dpro.anomaly.fabric.tomography import localize
from dpro.anomaly.fabric.topology import fat_tree

SIZES, QUICK_SIZES = (128, 512, 1024, 4096), (128, 1024)
TRIALS, QUICK_TRIALS = 10, 4
MAX_ROUNDS = 256
NOISE = 0.03
FAULT_KINDS = ("slow link", "slow NIC", "slow host", "flapping link")


@dataclass(frozen=True)
class Fault:
    """An injected fault: its kind and component id (see :func:`dpro.anomaly.fabric.tomography.components`)."""

    kind: str
    component: int


def _schedule(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source, destination and round of every probe of up to MAX_ROUNDS random rounds."""
    pairs = round_robin(n)
    pairs = pairs[np.sort(rng.choice(len(pairs), min(len(pairs), MAX_ROUNDS), replace=False))]
    rounds = np.repeat(np.arange(len(pairs)), pairs.shape[1])
    a, b = pairs[..., 0].ravel(), pairs[..., 1].ravel()
    return np.concatenate([a, b]), np.concatenate([b, a]), np.concatenate([rounds, rounds])


def _measure(rng: np.random.Generator, routing: Routing, n_faults: int) -> tuple[Probes, list[Fault]]:
    """Probes of one trial, with ``n_faults`` random faults on distinct components."""
    n = len(routing.hosts)
    src, dst, rounds = _schedule(rng, n)
    comp = components(routing, src, dst)
    fabric = np.unique(comp[:, 2:2 + routing.max_hops])
    fabric = fabric[fabric >= 0]
    share = np.ones(len(src))
    faults: list[Fault] = []
    n_rounds = rounds.max() + 1
    for kind in rng.choice(FAULT_KINDS, n_faults):
        pool = fabric if kind.endswith("link") else np.arange(n)
        c = int(rng.choice(np.setdiff1d(pool, [f.component for f in faults])))
        through = (comp == c).any(axis=1)
        if kind == "slow host":
            per_round = rng.uniform(0.3, 0.8, n_rounds)
            share[through] = np.minimum(share[through], per_round[rounds[through]])
            faults.append(Fault(str(kind), c))
            continue
        if kind == "flapping link":
            bad_rounds = rng.random(n_rounds) < rng.uniform(0.2, 0.6)
            through &= bad_rounds[rounds]
        share[through] = np.minimum(share[through], rng.uniform(0.2, 0.5 if kind == "flapping link" else 0.7))
        faults.append(Fault(str(kind), c))
    value = 100.0 * share * rng.lognormal(0.0, NOISE, len(src))
    return Probes(routing.hosts, src, dst, rounds, value), faults


def _component(routing: Routing, suspect: Suspect) -> int:
    n_hosts, n_links = len(routing.hosts), len(routing.links)
    if suspect.kind in ("nic", "host"):
        return routing.hosts.index(suspect.host)
    if suspect.kind == "link":
        return n_hosts + routing.links.index(suspect.name)
    return n_hosts + n_links + routing.switches.index(suspect.name)


def _plain_cover(routing: Routing, probes: Probes) -> set[int]:
    """The baseline: greedy set cover of the slow probes, most slow probes first."""
    is_slow = slow(probes)
    comp = components(routing, probes.src[is_slow], probes.dst[is_slow])
    remaining, picked = np.ones(len(comp), bool), set()
    while remaining.any():
        rows = comp[remaining]
        best = int(np.bincount(rows[rows >= 0]).argmax())
        picked.add(best)
        remaining[np.flatnonzero(remaining)[(rows == best).any(axis=1)]] = False
    return picked


def _counts(named: set[int], injected: set[int]) -> np.ndarray:
    """Suspects, right suspects, faults, faults found."""
    return np.array([len(named), len(named & injected), len(injected), len(injected & named)])


def trial(rng: np.random.Generator, n_hosts: int, n_faults: int) -> tuple[np.ndarray, np.ndarray, float]:
    """One trial: counts (see :func:`_counts`) of dpro and of the baseline, and dpro's seconds."""
    topology = fat_tree(n_hosts)
    probes, faults = _measure(rng, Routing.build(topology), n_faults)
    start = time.perf_counter()
    routing = Routing.build(topology)
    suspects = localize(topology, probes, routing=routing)
    seconds = time.perf_counter() - start
    injected = {f.component for f in faults}
    return (_counts({_component(routing, s) for s in suspects}, injected),
            _counts(_plain_cover(routing, probes), injected), seconds)


def run(quick: bool = False) -> list[dict]:
    from .localization_ecmp import rows as ecmp_rows

    rows = []
    rng = np.random.default_rng(20240611)
    for n in QUICK_SIZES if quick else SIZES:
        ours, plain = np.zeros(4, np.int64), np.zeros(4, np.int64)
        slowest = 0.0
        for _ in range(QUICK_TRIALS if quick else TRIALS):
            counts, baseline, seconds = trial(rng, n, int(rng.integers(0, 5)))
            ours, plain = ours + counts, plain + baseline
            slowest = max(slowest, seconds)
        case = f"fat tree, {n} hosts, {TRIALS if not quick else QUICK_TRIALS} trials, {ours[2]} faults"
        (precision, recall), (plain_precision, plain_recall) = _rates(ours), _rates(plain)
        rows += [
            _row(case, "precision", precision, plain_precision, NOT_HELD_OUT, False),
            _row(case, "recall", recall, plain_recall, NOT_HELD_OUT, False),
            _row(case, "localize s (slowest)", slowest, 10.0, "<= 10 s", slowest <= 10),
        ]
    return rows + ecmp_rows(quick)


NOT_HELD_OUT = "not held out (dpro's own routing simulated the probes)"


def _rates(counts: np.ndarray) -> tuple[float, float]:
    """Precision and recall from summed counts (1 where nothing was named or injected)."""
    return (counts[1] / counts[0] if counts[0] else 1.0), (counts[3] / counts[2] if counts[2] else 1.0)


def _row(case: str, metric: str, value: float, baseline: float, goal: str, met: bool) -> dict:
    return {"benchmark": "localization", "case": case, "metric": metric, "dpro": float(value),
            "baseline": float(baseline), "ratio": float(value) / baseline if baseline else float("inf"),
            "goal": goal, "met": bool(met)}
