"""The health check's link localization, scored on a simulator that shares none of its code.

:mod:`benchmarks.fabric_sim` routes every probe by its own per-switch ECMP hash of the
5-tuple (paths the localizer cannot see), slows one direction of a cable or every link
leaving a switch, adds other tenants' flows, shares links max-min fairly and adds
multiplicative measurement noise. The only thing it shares with dpro is the topology file
format. dpro's side is the health check's own path: the probe schedule of
:func:`dpro.anomaly.fabric.schedule.probe_rounds` (one pair per round leaving any edge
switch or pod), the follow-up probes where the first sweep leaves a class in doubt
(:func:`dpro.anomaly.fabric.follow_up.probe_adaptively`), and
:func:`dpro.anomaly.health.network.judge_network`, which localizes with the topology
(:mod:`dpro.anomaly.fabric.localize`).

**Faults.** One per trial: an access link (40%; either direction, i.e. a NIC sending or
receiving), an inter-switch link (40%, either direction) or a switch (20%: every link leaving
it). Sizes 5–40% of the capacity, noise 3–10%. Other tenants: ``LIGHT`` (0.25 flows a phase,
each capped at up to half a host link) in the sweep, ``HEAVY`` (1 flow a phase) at 5% noise;
the case names the share of healthy probes they slow. Fabrics: a 4×4-host leaf–spine with 2
spines and a k=4 fat tree (16 hosts each, 100 Gb/s everywhere), and a fabric no tuning saw:
the leaf–spine with 50 Gb/s uplinks.

**Scoring.** A suspect is right when the directed links it names (its own and its
``same_as``; a switch: every link leaving it) include a faulty one; a fault is found when some
suspect is right. Recall: found faults / faults, with a Wilson 95% interval; precision: right
suspects / suspects, with a bootstrap 95% interval over trials (nan when nothing was named).
Trials without a fault give the false-alarm rate. The baseline is what ``dpro health`` names
without a topology (:func:`matrix_only`) from the first sweep: the hosts its analysis of the
probe matrix flags, each standing for both directions of its access link. Beside it: what the
localizer names from the first sweep alone at its own thresholds (what the check named before it
followed up), and the probes a trial spent.

**Tuning vs scoring.** The localizer's ``clip``, ``z_class`` and ``z_count`` were chosen on the
first sweep alone, on trials of ``TUNING_SEED``; the follow-up's ``doubt`` by :func:`tune` on
trials of the same seed (``python -m benchmarks.health_localization --tune``, every pair in doubt
probed again), its ``distil`` and the pooled threshold after it by :func:`tune_distil`
(``--tune-distil``), the held-out fabric never among them; the masked NICs' repeated follow-ups
were compared on the tuned fabrics and on oversubscribed :func:`analogs` of the held-out fabric
(``--tune-masked``; no constant fitted); the figures come from trials of ``SCORING_SEED``, never
used for tuning.

    python -m benchmarks health_localization [--quick]
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from dpro.anomaly.fabric.follow_up import CONFIRM, DISTIL, DOUBT, EXTRA, PASSES, SWEEPS, probe_adaptively
from dpro.anomaly.fabric.follow_up import Z_CLASS as FOLLOWED_Z_CLASS
from dpro.anomaly.fabric.localize import CLIP, NO_PEERS, Z_CLASS, Z_COUNT, localize
from dpro.anomaly.fabric.probes import Probes, analyze
from dpro.anomaly.fabric.topology import from_spec, probe_tiers
from dpro.anomaly.health.model import HealthReport
from dpro.anomaly.health.network import judge_network
from dpro.anomaly.fabric.schedule import probe_rounds
from dpro.anomaly.suspects import Suspect

from . import fabric_sim as sim

TUNING_SEED = 1
SCORING_SEED = 9041655
"""Drawn at 19:46 UTC on 2026-12-07, after the follow-ups' 8 passes and bar 7.0 (``6121a4b``) were
committed, and committed before its run; scored once
(``docs/results/2026-12-07/health-localization-seed9041655.*``). Earlier: 3481679 (drawn after the
masked NICs' repeated follow-ups in their reviewed form, ``74effe7``;
``docs/results/2026-12-07/health-localization-seed3481679.*``), 4963184 (drawn for their
first form, ``6fa6b25``; its run was stopped before it printed anything, when a cold review found
its repeat count drifting between passes and wrong for uneven leaves), 9529589 (``DISTIL`` 0.5,
chosen on seed 1 by ``--tune-distil`` judging each fabric's false alarms on its own, ``2f09bcc``;
``docs/results/2026-11-29/health-localization-seed9529589.*``), 8101147 (the
distilled follow-ups at distil 0.0, ``fa47d53``;
``docs/results/2026-11-28/health-localization-seed8101147.*``), 3661627 (the typical
healthy probe read from each pair once, ``de2ecb3``, with the clearing's mend ``fadc872``),
8689391 (the clearing of suspects another explains, ``9944f88``), 4788303 (the narrowest-class
rule and its review's mends, ``66fb792``, ``68cd864``), 7421226 (drawn for ``66fb792``; its run was stopped before it printed anything,
when the review found that rule named a slightly slow leaf as its uplinks), 3346315 (the repeated rounds,
:data:`dpro.anomaly.fabric.follow_up.SWEEPS`, and the simulator's one path per host pair's
connection), 8945295 (the masked-paths rule,
`a6a3bcb`; every probe a new path), 4613165 (drawn after the review's fixes; the current
figures until this seed's run), 1916299 (scored no_peers 1.5, rejected: see localize.NO_PEERS)."""
FAULTS_PER_POINT, QUICK_FAULTS_PER_POINT, TUNING_FAULTS = 200, 40, 100
SIZES = (0.05, 0.10, 0.20, 0.40)
NOISES = (0.03, 0.05, 0.10)
LIGHT, HEAVY = sim.Background(flows=0.25, max_demand=0.5), sim.Background(flows=1.0, max_demand=0.5)
HEAVY_NOISE = 0.05
KINDS = (("access", 0.4), ("inter-switch", 0.4), ("switch", 0.2))
GOAL_RECALL, GOAL_PRECISION, GOAL_SIZE = 0.95, 0.90, 0.10
GOAL_ALARMS = {LIGHT: 0.02, HEAVY: 0.05}  # issue 29's goals, by background
TUNE_ALARMS = 0.05  # the bound the tuning kept (226b413), looser than the light goal
DOUBTS, Z_CLASSES = (0.3, 0.5), (5.0, 5.5, 6.0)
NO_PEERS_GRID = (1.0, 1.25, 1.5, 1.75, 2.0)
DISTIL_GRID, DISTIL_Z_CLASSES = (float("-inf"), -0.5, 0.0, 0.5), (5.5, 6.0, 6.5)
SWEEPS_GRID = (1, 3, 5, 8)
PASSES_GRID, PASSES_Z_CLASSES = (3, 5, 8), (6.0, 6.5, 7.0)
HEALTHY_TRIALS = 4
""":func:`tune_passes` runs this many times as many trials without a fault as with one: at 100
a point, a false-alarm rate is judged in steps of 0.01 against a goal of 0.02 (run so first, every
setting was 0.03 or 0.02 at the light goal's worst point, and the tuner's choice turned on one
trial)."""

Localize = Callable[["Case", Probes], list[Suspect]]


@dataclass(frozen=True)
class Follow:
    """The follow-up's settings (:mod:`dpro.anomaly.fabric.follow_up`); ``extra=0``: the first sweep only."""

    doubt: float = DOUBT
    confirm: float = CONFIRM
    extra: float = EXTRA
    passes: int = PASSES
    sweeps: int = SWEEPS
    distil: float = DISTIL
    masked_again: bool = True


@dataclass
class Case:
    """A fabric as the simulator has it, as dpro reads it, and the health check's schedule."""

    name: str
    fabric: sim.Fabric
    topology: nx.MultiGraph = field(init=False)
    tiers: list[list[str]] = field(init=False)
    rounds: list[list[tuple[int, int]]] = field(init=False)

    def __post_init__(self) -> None:
        self.topology = from_spec(sim.topology_spec(self.fabric))
        self.tiers = [[tier[h] for h in self.fabric.hosts] for tier in probe_tiers(self.topology, self.fabric.hosts)]
        self.rounds = probe_rounds(len(self.fabric.hosts), self.tiers)


@dataclass
class Tally:
    """Per trial of one point of the sweep: the fault's kind, whether it was found, suspects
    right and named (and the baseline's), whether the first sweep alone found it, the probes
    spent and the rounds they took (the check's time), and the localizer's seconds."""

    kinds: list[str] = field(default_factory=list)
    found: list[bool] = field(default_factory=list)
    first_found: list[bool] = field(default_factory=list)
    first_named: list[int] = field(default_factory=list)
    probes: list[int] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    right: list[int] = field(default_factory=list)
    named: list[int] = field(default_factory=list)
    baseline_found: list[bool] = field(default_factory=list)
    baseline_right: list[int] = field(default_factory=list)
    baseline_named: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def alarms(self) -> float:
        """The share of trials that named anything (without a fault: false alarms)."""
        return float(np.mean(np.asarray(self.named) > 0))

    def found_by_kind(self) -> dict[str, tuple[int, int]]:
        """Per kind of fault (:data:`KINDS`), the trials that found it and its trials."""
        return {kind: (sum(f for f, k in zip(self.found, self.kinds) if k == kind), self.kinds.count(kind))
                for kind, _ in KINDS}


def cases(held_out: bool = True) -> list[Case]:
    """The fabrics: a 4x4-host leaf-spine with 2 spines and a k=4 fat tree (tuned on and
    scored), and, held out of the tuning, the leaf-spine with 50 Gb/s uplinks (2:1
    oversubscribed: probes between leaves are slower by design)."""
    tuned = [Case("leaf-spine 4x4 hosts, 2 spines", sim.leaf_spine(4, 4, 2)), Case("fat tree k=4, 16 hosts", sim.fat_tree(4))]
    return tuned + [Case("held out: leaf-spine, 50 Gb/s uplinks", sim.leaf_spine(4, 4, 2, uplink_gbps=50.0))] * held_out


def health_check(case: Case, probes: Probes) -> list[Suspect]:
    """What ``dpro health`` names, given the topology."""
    return judge_network(HealthReport("", "", []), probes, case.topology)


def first_sweep_alone(case: Case, probes: Probes) -> list[Suspect]:
    """What ``dpro health`` named from its first sweep before it followed up: the localizer at
    its own thresholds, tuned for one sweep."""
    return localize(case.topology, probes)


def matrix_only(probes: Probes) -> list[Suspect]:
    """The baseline: what ``dpro health`` names without a topology (hosts, from the matrix)."""
    return [s for s in analyze(probes) if s.kind == "host"]


def draw_fault(fabric: sim.Fabric, rng: np.random.Generator, size: float) -> sim.Fault:
    """One fault of ``size``, its kind drawn with the probabilities of ``KINDS``."""
    kind = rng.choice([k for k, _ in KINDS], p=[p for _, p in KINDS])
    if kind == "switch":
        return sim.random_fault(fabric, rng, size, kinds=("switch",))
    return sim.random_fault(fabric, rng, size, kinds=("link",), access_share=1.0 if kind == "access" else 0.0)


def kind_of(fabric: sim.Fabric, fault: sim.Fault) -> str:
    """``access``, ``inter-switch`` or ``switch``."""
    if fault.kind == "switch":
        return "switch"
    return "access" if any(end in fabric.hosts for end in fault.where) else "inter-switch"


def finds(suspect: Suspect, fault: sim.Fault) -> bool:
    """Whether ``suspect`` names ``fault``: a link fault by that direction of that cable among
    the directed links it names (its own and its ``same_as``), a switch fault by that switch
    among the switches it names; a host (no topology) names both directions of its access link.
    Links leaving a faulty switch do not name the switch."""
    names = {suspect.name if suspect.kind in ("switch", "host") else f"{suspect.evidence['from']}->{suspect.evidence['to']}",
             *suspect.evidence.get("same_as", [])}
    if fault.kind == "switch":
        return fault.where in names
    a, b = fault.where
    if suspect.kind == "host":
        return suspect.name in (a, b)
    return f"{sim.dpro_name(a)}->{sim.dpro_name(b)}" in names


def probed(case: Case, rng: np.random.Generator, size: float, noise: float, background: sim.Background,
           follow_up: Follow = Follow()) -> tuple[sim.Fault | None, Probes]:
    """A fault of ``size`` (none for 0), and the probes of the health check's schedule and its
    follow-ups on the fabric with it. As over the check's job: every probe of a host pair one
    way goes over one connection (one source port, drawn for the trial), and a round's repeats
    share its probe time (each ``1/sweeps`` of it: its noise ``sqrt(sweeps)`` times; the
    simulator's noise is of a probe of the whole time)."""
    fault = draw_fault(case.fabric, rng, size) if size > 0 else None
    n = len(case.fabric.hosts)
    ports = rng.integers(*sim.EPHEMERAL_PORTS, size=(n, n))

    def measure(rounds: list[list[tuple[int, int]]], first_round: int) -> Probes:
        rows = np.array(sim.measure(case.fabric, rounds, [fault] if fault else [], noise * np.sqrt(follow_up.sweeps),
                                    background, rng, pair_ports=ports))
        return Probes(case.fabric.hosts, rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64),
                      rows[:, 2].astype(np.int64) + first_round, rows[:, 3])

    probes, _ = probe_adaptively(measure, case.topology, case.tiers, case.rounds, follow_up.extra, follow_up.passes,
                                 follow_up.doubt, follow_up.confirm, sweeps=follow_up.sweeps, distil=follow_up.distil,
                                 masked_again=follow_up.masked_again)
    return fault, probes


def trial(case: Case, rng: np.random.Generator, size: float, noise: float, background: sim.Background,
          tally: Tally, localize: Localize = health_check, follow_up: Follow = Follow()) -> None:
    """Inject a fault of ``size`` (none for 0), probe on the health check's schedule and follow
    up where the evidence is in doubt (:func:`dpro.anomaly.fabric.follow_up.probe_adaptively`),
    localize, and score the suspects, the first sweep's alone and the baseline's into ``tally``."""
    started = time.perf_counter()
    fault, probes = probed(case, rng, size, noise, background, follow_up)
    suspects = localize(case, probes)
    tally.seconds.append(time.perf_counter() - started)
    first = probes.round < len(case.rounds)
    first_sweep = probes.take(first)
    right = [fault is not None and finds(s, fault) for s in suspects]
    tally.kinds.append(kind_of(case.fabric, fault) if fault else "")
    tally.found.append(any(right))
    tally.right.append(sum(right))
    tally.named.append(len(suspects))
    tally.probes.append(len(probes.value))
    tally.rounds.append(len(np.unique(probes.round)))
    tally.rounds.append(len(np.unique(probes.round)))
    alone = first_sweep_alone(case, first_sweep)
    tally.first_found.append(fault is not None and any(finds(s, fault) for s in alone))
    tally.first_named.append(len(alone))
    blamed = matrix_only(first_sweep)
    tally.baseline_found.append(fault is not None and any(finds(s, fault) for s in blamed))
    tally.baseline_right.append(sum(fault is not None and finds(s, fault) for s in blamed))
    tally.baseline_named.append(len(blamed))


def points() -> list[tuple[sim.Background, float, float]]:
    """(background, noise, size) of the sweep; size 0 is a healthy fabric."""
    light = [(LIGHT, noise, size) for noise in NOISES for size in (0.0, *SIZES)]
    return light + [(HEAVY, HEAVY_NOISE, size) for size in (0.0, *SIZES)]


def sweep(seed: int, faults: int, grid: list[tuple[sim.Background, float, float]],
          localize: Localize = health_check, fabrics: list[Case] | None = None, follow_up: Follow = Follow()
          ) -> dict[tuple[str, sim.Background, float, float], Tally]:
    """``faults`` trials of every case at every point of ``grid``."""
    rng = np.random.default_rng(seed)
    out = {}
    for case in fabrics or cases():
        for background, noise, size in grid:
            tally = out[case.name, background, noise, size] = Tally()
            for _ in range(faults):
                trial(case, rng, size, noise, background, tally, localize, follow_up)
    return out


def slowed_by_background(case: Case, background: sim.Background, seed: int, runs: int = 20) -> float:
    """The share of a healthy fabric's probes that other tenants slow by more than 1% (against
    the same schedule alone: its probes never share a link)."""
    rng = np.random.default_rng(seed)
    alone = np.array(sim.measure(case.fabric, case.rounds, [], 0.0, sim.Background(), rng))[:, 3]
    rates = np.stack([np.array(sim.measure(case.fabric, case.rounds, [], 0.0, background, rng))[:, 3]
                      for _ in range(runs)])
    return float(np.mean(rates < 0.99 * alone))


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_ratio(top: list[int], bottom: list[int], rng: np.random.Generator, draws: int = 2000) -> tuple[float, float]:
    """A 95% interval of sum(top) / sum(bottom), resampling trials."""
    top_, bottom_ = np.asarray(top, float), np.asarray(bottom, float)
    picks = rng.integers(len(top_), size=(draws, len(top_)))
    sums = bottom_[picks].sum(axis=1)
    ratios = top_[picks].sum(axis=1)[sums > 0] / sums[sums > 0]
    if not len(ratios):
        return float("nan"), float("nan")
    return float(np.quantile(ratios, 0.025)), float(np.quantile(ratios, 0.975))


def rows_of(results: dict, seed: int, fabrics: list[Case]) -> list[dict]:
    """The benchmark's rows: false alarms, recall (and by fault kind) and precision per point,
    each with its 95% interval and the matrix-only baseline beside it."""
    rng = np.random.default_rng(0)
    by_name = {c.name: c for c in fabrics}
    first_sweep = {c.name: 2 * sum(len(r) for r in c.rounds) for c in fabrics}  # probes: both ways of each pair
    exposure = {(name, bg): slowed_by_background(by_name[name], bg, seed) for name, bg, _, _ in results}
    rows = []
    for (name, background, noise, size), t in results.items():
        case = (f"{name}, others slow {exposure[name, background]:.0%} of probes, noise {noise:.0%}, "
                + (f"fault {size:.0%}" if size else "no fault") + f", {len(t.found)} trials (seed {seed})")
        spent = (f"{np.mean(t.probes):.0f} probes a trial, each the median of {SWEEPS} repeats, "
                 f"{np.mean(t.probes) / first_sweep[name]:.2f}x the first sweep, in {np.mean(t.rounds):.0f} rounds, "
                 f"{np.mean(t.rounds) / len(by_name[name].rounds):.2f}x its")
        if not size:
            alarms, baseline = t.alarms(), np.mean(np.asarray(t.baseline_named) > 0)
            low, high = wilson(int(np.sum(np.asarray(t.named) > 0)), len(t.named))
            rows.append(_row(case, f"false alarms [{low:.2f}, {high:.2f}] (first sweep alone "
                             f"{np.mean(np.asarray(t.first_named) > 0):.3f}; {spent})", alarms, baseline,
                             f"<= {GOAL_ALARMS[background]}", alarms <= GOAL_ALARMS[background]))
            continue
        goal = size >= GOAL_SIZE
        recall = float(np.mean(t.found))
        low, high = wilson(sum(t.found), len(t.found))
        by_kind = ", ".join(f"{kind} {found}/{n}" for kind, (found, n) in t.found_by_kind().items())
        rows.append(_row(case, f"recall [{low:.2f}, {high:.2f}] ({by_kind}; first sweep alone "
                         f"{np.mean(t.first_found):.3f}; {spent})", recall, float(np.mean(t.baseline_found)),
                         f">= {GOAL_RECALL}" if goal else "none (< 10%)", recall >= GOAL_RECALL or not goal))
        precision = sum(t.right) / sum(t.named) if sum(t.named) else float("nan")
        baseline = sum(t.baseline_right) / sum(t.baseline_named) if sum(t.baseline_named) else float("nan")
        plow, phigh = bootstrap_ratio(t.right, t.named, rng)
        rows.append(_row(case, f"precision [{plow:.2f}, {phigh:.2f}]", precision, baseline,
                         f">= {GOAL_PRECISION}" if goal else "none (< 10%)", precision >= GOAL_PRECISION or not goal))
    seconds = [s for t in results.values() for s in t.seconds]
    rows.append(_row(f"all {len(seconds)} trials (seed {seed})", "simulated sweeps, follow-ups and localize s (median; max "
                     f"{max(seconds):.3f})", float(np.median(seconds)), float("nan"), "none", True))
    return rows


def tune(faults: int = TUNING_FAULTS) -> tuple[float, float]:
    """The follow-up's ``doubt`` and the pooled threshold after it (``z_class``) of the grid with
    the best recall at 10–40% faults under ``LIGHT`` background, among those with at most
    ``TUNE_ALARMS`` false alarms there at every noise; at most one more sweep's pairs
    (``extra`` 1, the check's time); trials of ``TUNING_SEED`` on the tuned fabrics only. Prints
    each setting's figures. (The localizer's own thresholds were tuned so before, on the first
    sweep alone.)"""
    grid = [(LIGHT, noise, size) for noise in (0.05, 0.10) for size in (0.0, *SIZES[1:])]
    best, best_recall = (DOUBT, FOLLOWED_Z_CLASS), -1.0
    for doubt, z_class in itertools.product(DOUBTS, Z_CLASSES):

        def tuned(case: Case, probes: Probes) -> list[Suspect]:
            return localize(case.topology, probes, z_class=z_class)

        results = sweep(TUNING_SEED, faults, grid, tuned, cases(held_out=False), Follow(doubt=doubt))
        alarms = max(t.alarms() for (_, _, _, size), t in results.items() if not size)
        recall = float(np.mean([np.mean(t.found) for (_, _, _, size), t in results.items() if size]))
        probes = float(np.mean([p for t in results.values() for p in t.probes]))
        print(f"doubt {doubt}, z_class {z_class}: worst false alarms {alarms:.3f}, mean recall {recall:.3f}, "
              f"{probes:.0f} probes a trial", flush=True)
        if alarms <= TUNE_ALARMS and recall > best_recall:
            best, best_recall = (doubt, z_class), recall
    return best


def tune_no_peers(faults: int = TUNING_FAULTS) -> float:
    """The localizer's ``no_peers`` (:mod:`dpro.anomaly.fabric.localize`), the follow-up's
    settings as tuned: of ``NO_PEERS_GRID``, the best mean recall at 10–40% faults among those
    whose false alarms stay within ``TUNE_ALARMS`` under ``LIGHT`` background and the goal under
    ``HEAVY``; if none does, the fewest false alarms under ``HEAVY``. Every setting judges the
    same trials (of ``TUNING_SEED``, on the tuned fabrics only). Prints each setting's figures."""
    grid = _tuning_grid()
    found = {f: {point: [] for point in grid} for f in NO_PEERS_GRID}
    rng = np.random.default_rng(TUNING_SEED)
    for case in cases(held_out=False):
        for background, noise, size in grid:
            for _ in range(faults):
                fault, probes = probed(case, rng, size, noise, background)
                for f in NO_PEERS_GRID:
                    suspects = localize(case.topology, probes, z_class=FOLLOWED_Z_CLASS, no_peers=f)
                    found[f][background, noise, size].append(_hit(fault, suspects))
    chosen, best = None, (False, -1.0)
    for f in NO_PEERS_GRID:
        light = max(np.mean(v) for (b, _, size), v in found[f].items() if b == LIGHT and not size)
        heavy = float(np.mean(found[f][HEAVY, HEAVY_NOISE, 0.0]))
        recall = float(np.mean([np.mean(v) for (_, _, size), v in found[f].items() if size]))
        print(f"no_peers {f}: false alarms {light:.3f} light (worst noise), {heavy:.3f} heavy; mean recall {recall:.3f}",
              flush=True)
        within = light <= TUNE_ALARMS and heavy <= GOAL_ALARMS[HEAVY]
        key = (within, recall if within else -heavy)
        if key > best:
            chosen, best = f, key
    return chosen


def tune_sweeps(faults: int = TUNING_FAULTS // 2) -> int:
    """Each round's repeats (:data:`dpro.anomaly.fabric.follow_up.SWEEPS`), the rest as tuned:
    of ``SWEEPS_GRID``, the fewest false alarms under ``HEAVY`` background among those whose
    mean recall at 10–40% faults is within 0.02 of the best and whose false alarms under
    ``LIGHT`` stay within ``TUNE_ALARMS``; where none is, the fewest among all. Each setting
    measures its own trials of ``TUNING_SEED`` (the tuned fabrics only), each from a generator
    of that seed drawn on in turn, so the settings do not see the same faults. Prints each
    setting's figures."""
    grid = _tuning_grid()
    figures = {}
    for count in SWEEPS_GRID:
        results = sweep(TUNING_SEED, faults, grid, fabrics=cases(held_out=False), follow_up=Follow(sweeps=count))
        light = max(t.alarms() for (_, b, _, size), t in results.items() if b == LIGHT and not size)
        heavy = max(t.alarms() for (_, b, _, size), t in results.items() if b == HEAVY and not size)
        recall = float(np.mean([np.mean(t.found) for (_, _, _, size), t in results.items() if size]))
        figures[count] = (light, heavy, recall)
        print(f"sweeps {count}: false alarms {light:.3f} light (worst noise), {heavy:.3f} heavy; "
              f"mean recall {recall:.3f}", flush=True)
    best = max(recall for _, _, recall in figures.values())
    within = [c for c, (light, _, recall) in figures.items() if recall >= best - 0.02 and light <= TUNE_ALARMS]
    return min(within or figures, key=lambda c: (figures[c][1], c))


def tune_distil(faults: int = TUNING_FAULTS * 4 // 5) -> tuple[float, float]:
    """The follow-up's ``distil`` (:data:`dpro.anomaly.fabric.follow_up.DISTIL`) and the pooled
    threshold after it (``z_class``): of ``DISTIL_GRID`` by ``DISTIL_Z_CLASSES``, the best mean
    recall at 10–40% faults among those whose false alarms stay within the goals on each
    fabric (``LIGHT`` at both noises of the grid, ``HEAVY``); if none does, the fewest false
    alarms under ``LIGHT``. Each ``distil`` draws its trials of ``TUNING_SEED`` from a generator
    of its own (the tuned fabrics only; the settings' processes run side by side): the same
    draws until its follow-ups first part from another setting's. Its thresholds judge the
    same probes. Prints each setting's figures. (Rerun per fabric, it chose the committed
    distil 0.5 with bar 6.5; pooling the fabrics, it had chosen 0.0, ``fa47d53``.)"""
    with ProcessPoolExecutor() as pool:
        found = dict(zip(DISTIL_GRID, pool.map(_distilled, DISTIL_GRID, [faults] * len(DISTIL_GRID))))
    chosen, best = None, (False, -1.0)
    for distil, z_class in itertools.product(DISTIL_GRID, DISTIL_Z_CLASSES):
        light, heavy, recall, key = _judged(found[distil][z_class])
        print(f"distil {distil}, z_class {z_class}: false alarms {light:.3f} light, {heavy:.3f} heavy "
              f"(worst fabric and noise); mean recall {recall:.3f}", flush=True)
        if key > best:
            chosen, best = (distil, z_class), key
    return chosen


def _distilled(distil: float, faults: int) -> dict[float, dict[tuple[str, sim.Background, float, float], list[bool]]]:
    """Per pooled threshold of ``DISTIL_Z_CLASSES``, per fabric and point of :func:`tune_distil`'s
    grid, whether each trial named the fault (a healthy fabric: named anything), follow-ups
    distilled at ``distil``."""
    grid = _tuning_grid()
    tuned = cases(held_out=False)
    found: dict = {z: {(case.name, *point): [] for case in tuned for point in grid} for z in DISTIL_Z_CLASSES}
    rng = np.random.default_rng(TUNING_SEED)
    for case in tuned:
        for background, noise, size in grid:
            for _ in range(faults):
                fault, probes = probed(case, rng, size, noise, background, Follow(distil=distil))
                for z_class in DISTIL_Z_CLASSES:
                    suspects = localize(case.topology, probes, z_class=z_class)
                    found[z_class][case.name, background, noise, size].append(_hit(fault, suspects))
    return found


def tune_passes(faults: int = TUNING_FAULTS) -> tuple[int, float]:
    """The follow-up's passes (:data:`dpro.anomaly.fabric.follow_up.PASSES`) and the pooled
    threshold after them (``z_class``): of ``PASSES_GRID`` by ``PASSES_Z_CLASSES``, the best mean
    recall at 10–40% faults among those whose false alarms stay within the goals on each fabric
    (``LIGHT`` at both noises of the grid, ``HEAVY``); if none does, the fewest false alarms under
    ``LIGHT``. ``HEALTHY_TRIALS`` times as many trials without a fault. Paired: every setting runs
    the same trials (each trial its own generator, of ``TUNING_SEED`` and the trial's place), so
    they part only where one follows up further; its
    thresholds judge the same probes. Prints each setting's figures with the rounds a trial
    measured (the check's time) against the first sweep's (the tuned fabrics only)."""
    with ProcessPoolExecutor() as pool:
        found = dict(zip(PASSES_GRID, pool.map(_passed, PASSES_GRID, [faults] * len(PASSES_GRID))))
    first = {case.name: len(case.rounds) for case in cases(held_out=False)}
    chosen, best = None, (False, -1.0)
    for passes, z_class in itertools.product(PASSES_GRID, PASSES_Z_CLASSES):
        hits, rounds = found[passes]
        light, heavy, recall, key = _judged(hits[z_class])
        alarms = "; ".join(name.split(",")[0] + " " + ", ".join(
            f"{np.mean(v):.3f}" for (n, _, _, size), v in hits[z_class].items() if n == name and not size)
            for name in first)
        spent = ", ".join(f"{name.split(',')[0]} {np.mean(r) / first[name]:.2f}x" for name, r in rounds.items())
        print(f"passes {passes}, z_class {z_class}: false alarms {light:.3f} light, {heavy:.3f} heavy (worst fabric "
              f"and noise; by fabric, light 5% and 10% noise, heavy: {alarms}); mean recall {recall:.3f}; rounds a trial against "
              f"the first sweep's: {spent}", flush=True)
        if key > best:
            chosen, best = (passes, z_class), key
    return chosen


def _passed(passes: int, faults: int) -> tuple[dict, dict[str, list[int]]]:
    """For :func:`tune_passes`: per pooled threshold of ``PASSES_Z_CLASSES``, per fabric and point
    of its grid, whether each trial named the fault (a healthy fabric: named anything), followed
    up over at most ``passes`` passes; and per fabric, the rounds each trial measured (each
    ``SWEEPS`` times)."""
    grid = _tuning_grid()
    tuned = cases(held_out=False)
    found: dict = {z: {(case.name, *point): [] for case in tuned for point in grid} for z in PASSES_Z_CLASSES}
    rounds: dict[str, list[int]] = {case.name: [] for case in tuned}
    for c, case in enumerate(tuned):
        for g, (background, noise, size) in enumerate(grid):
            for i in range(faults if size else HEALTHY_TRIALS * faults):
                rng = np.random.default_rng([TUNING_SEED, c, g, i])
                fault, probes = probed(case, rng, size, noise, background, Follow(passes=passes))
                rounds[case.name].append(len(np.unique(probes.round)))
                for z_class in PASSES_Z_CLASSES:
                    suspects = localize(case.topology, probes, z_class=z_class)
                    found[z_class][case.name, background, noise, size].append(_hit(fault, suspects))
    return found, rounds


def analogs() -> list[Case]:
    """Oversubscribed leaf-spines that are not the held-out fabric, for :func:`tune_masked`: 4x4
    hosts with 25 Gb/s uplinks to 2 spines (the held-out fabric's shape, at a quarter of the
    NICs' rate where it has half) and to 4 spines, and 3 leaves of 5 hosts whose 83 Gb/s uplinks
    hold a probe between leaves only 17% under its NICs (masked at 3% noise, mostly at 5%, not at 10%)."""
    return [Case("analog: leaf-spine 4x4 hosts, 2 spines, 25 Gb/s uplinks", sim.leaf_spine(4, 4, 2, uplink_gbps=25.0)),
            Case("analog: leaf-spine 4x4 hosts, 4 spines, 25 Gb/s uplinks", sim.leaf_spine(4, 4, 4, uplink_gbps=25.0)),
            Case("analog: leaf-spine 3x5 hosts, 2 spines, 83 Gb/s uplinks",
                 sim.leaf_spine(3, 5, 2, uplink_gbps=250.0 / 3))]


def tune_masked(faults: int = TUNING_FAULTS // 2) -> None:
    """A masked NIC's pairs probed again once a pass against as often as an unmasked NIC's would
    be (``masked_again``, :func:`dpro.anomaly.fabric.follow_up.follow_up`), on trials of
    ``TUNING_SEED`` at every point of the benchmark's grid, on the tuned fabrics and the
    :func:`analogs` (never the held-out fabric). Each setting and fabric draws from a generator
    of that seed, so the two settings see the same trials until their follow-ups first part.
    Prints per point recall (false alarms without a fault), probes a trial and the faults found
    by kind, each setting beside the other."""
    jobs = [(case, masked_again, faults) for case in cases(held_out=False) + analogs() for masked_again in (False, True)]
    with ProcessPoolExecutor() as pool:
        found = pool.map(_masked_sweep, jobs)
    by = {(case.name, masked_again): results for (case, masked_again, _), results in zip(jobs, found)}
    for case in cases(held_out=False) + analogs():
        print(f"\n{case.name}: point: once a pass -> as often as unmasked (recall, or false alarms without a fault; "
              f"probes a trial; found of faults by kind)")
        for point, before in by[case.name, False].items():
            after = by[case.name, True][point]
            print(f"  {point}: {before[0]:.3f} -> {after[0]:.3f}  probes {before[1]:.0f} -> {after[1]:.0f}  "
                  f"{before[2]} -> {after[2]}" + ("" if before == after else "  *"), flush=True)


def _masked_sweep(job: tuple[Case, bool, int]) -> dict[str, tuple[float, float, dict[str, tuple[int, int]]]]:
    """One fabric's :func:`sweep` for :func:`tune_masked`, its figures per point."""
    case, masked_again, faults = job
    results = sweep(TUNING_SEED, faults, points(), fabrics=[case], follow_up=Follow(masked_again=masked_again))
    out = {}
    for (_, background, noise, size), t in results.items():
        value = np.mean(t.found) if size else t.alarms()
        kinds = {kind: counts for kind, counts in sorted(t.found_by_kind().items()) if counts[1]}
        out[f"{'heavy' if background == HEAVY else 'light'}, noise {noise:.0%}, fault {size:.0%}"] = (
            float(value), float(np.mean(t.probes)), kinds)
    return out


def _judged(hits: dict[tuple[str, sim.Background, float, float], list[bool]]
            ) -> tuple[float, float, float, tuple[bool, float]]:
    """A setting's worst false alarms under ``LIGHT`` and ``HEAVY`` (over fabrics and noises),
    its mean recall at the points with a fault, and its rank for :func:`tune_distil` and
    :func:`tune_passes`: within both goals first, then the best recall; outside them, the fewest
    light false alarms."""
    light = max(np.mean(v) for (_, b, _, size), v in hits.items() if b == LIGHT and not size)
    heavy = max(np.mean(v) for (_, b, _, size), v in hits.items() if b == HEAVY and not size)
    recall = float(np.mean([np.mean(v) for (_, _, _, size), v in hits.items() if size]))
    within = light <= GOAL_ALARMS[LIGHT] and heavy <= GOAL_ALARMS[HEAVY]
    return light, heavy, recall, (within, recall if within else -light)


def _tuning_grid() -> list[tuple[sim.Background, float, float]]:
    """The tuners' points: ``LIGHT`` background at 5% and 10% noise, and ``HEAVY``, each without a
    fault and at 10–40% faults."""
    light = [(LIGHT, noise, size) for noise in (0.05, 0.10) for size in (0.0, *SIZES[1:])]
    return light + [(HEAVY, HEAVY_NOISE, size) for size in (0.0, *SIZES[1:])]


def _hit(fault: sim.Fault | None, suspects: list[Suspect]) -> bool:
    """Whether a trial's suspects name its fault; without a fault, whether they name anything."""
    return any(finds(s, fault) for s in suspects) if fault else bool(suspects)


def run(quick: bool = False) -> list[dict]:
    """The sweep on ``SCORING_SEED``'s trials, as rows of the benchmark table."""
    fabrics = cases()
    results = sweep(SCORING_SEED, QUICK_FAULTS_PER_POINT if quick else FAULTS_PER_POINT, points(), fabrics=fabrics)
    return rows_of(results, SCORING_SEED, fabrics)


def _row(case: str, metric: str, value: float, baseline: float, goal: str, met: bool) -> dict:
    return {"benchmark": "health_localization", "case": case, "metric": metric, "dpro": float(value),
            "baseline": float(baseline), "ratio": float(value) / baseline if baseline else float("inf"),
            "goal": goal, "met": bool(met)}


if __name__ == "__main__":
    if "--tune-distil" in sys.argv:
        distil, z_class = tune_distil()
        print(f"chosen on seed {TUNING_SEED}: distil {distil}, z_class after the follow-up {z_class} (the defaults: "
              f"distil {DISTIL}, z_class {FOLLOWED_Z_CLASS})")
    elif "--tune-sweeps" in sys.argv:
        print(f"chosen on seed {TUNING_SEED}: sweeps {tune_sweeps()} (the default: {SWEEPS})")
    elif "--tune-passes" in sys.argv:
        passes, z_class = tune_passes()
        print(f"chosen on seed {TUNING_SEED}: passes {passes}, z_class after the follow-up {z_class} (the defaults: "
              f"passes {PASSES}, z_class {FOLLOWED_Z_CLASS})")
    elif "--tune-masked" in sys.argv:
        tune_masked()
    elif "--tune-no-peers" in sys.argv:
        print(f"chosen on seed {TUNING_SEED}: no_peers {tune_no_peers()} (the default: {NO_PEERS})")
    elif "--tune" in sys.argv:
        doubt, z_class = tune()
        print(f"chosen on seed {TUNING_SEED}: doubt {doubt}, z_class after the follow-up {z_class} (the defaults: "
              f"doubt {DOUBT}, z_class {FOLLOWED_Z_CLASS}; the localizer's own, tuned before on the first sweep: "
              f"clip {CLIP}, z_class {Z_CLASS}, z_count {Z_COUNT})")
    else:
        from .__main__ import format_table

        print(format_table(run(quick="--quick" in sys.argv)))
