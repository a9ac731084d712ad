"""The search: every pass's proposals combined, predicted with the cost model, best first.

1. **Critical-path guidance.** The recorded step is replayed and its critical path split
   (:func:`dpro.replayer.breakdown.breakdown`): where communication is exposed on it for less
   than :data:`MIN_EXPOSED_COMM` of the step, no change to communication can pay off and its
   passes are left out; where compute (and launch-bound time) on it is under
   :data:`MIN_CRITICAL_COMPUTE` of the step, operator fusion is left out likewise (fusing ops
   off the critical path cannot shorten the step). The report says so.
2. **Single changes** first: each proposal of each pass alone.
3. **Combinations** by simulated annealing (:func:`dpro.annealing.anneal`): a state takes one
   option of each pass (or none); a move changes one pass's option at random, and is taken when
   it predicts a faster step, or a slower one with probability ``exp(-Δ / T)``, ``T`` starting at
   :data:`START_TEMPERATURE` of the step and cooling by :data:`COOLING` a move; a walk frozen in
   a minimum restarts from a state not yet predicted. Predictions are cached, so a small space is
   covered whole; the search ends when it is, or when the time budget would be overrun.

Each speed-up trick can be switched on or off (:class:`Tricks`) to measure what it saves:
critical-path guidance, and the cost model's incremental re-replay (a prediction's replays
after the first recompute only the ops at or after the first changed one), both on; and
identical-rank folding, off: every prediction replays the graph folded onto its median rank
(:mod:`dpro.replayer.median_rank`), which is exact only where the ranks are alike (a recorded
run's ranks never quite are: it drops their skew and stragglers) and pays off with many ranks.

A strategy that would fail the job is left out, and the notes say why (DDP's PowerSGD hook on
gloo with more than one bucket: :func:`dpro.optimizer.passes.compression.fails_the_job`).

With a memory budget, a strategy whose memory estimate (:mod:`dpro.optimizer.memory_estimate`) exceeds
it on any rank is not predicted and not proposed (the recorded configuration is still
predicted: the cost model's ratio to its replay anchors every prediction).

Strategies that make the same change to the cost model (settings it keeps as recorded, such
as gradients as bucket views) share one prediction.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dpro.analysis.memory import rank_memory
from dpro.analysis.run import RunAnalysis
from dpro.analysis.whatif import Change, CostModel, Prediction
from dpro.annealing import Landscape, Visit, anneal
from dpro.errors import DproError

from dpro.optimizer.memory_estimate import strategy_memory_bytes
from dpro.optimizer.passes import PASSES
from dpro.optimizer.passes.compression import fails_the_job
from dpro.optimizer.strategy import Strategy

__all__ = ["Evaluated", "SearchResult", "Tricks", "search"]

MIN_EXPOSED_COMM = 0.02
MIN_CRITICAL_COMPUTE = 0.02
COMMUNICATION_PASSES = frozenset({"tensor_fusion", "first_bucket", "compression"})
COMPUTE_PASSES = frozenset({"operator_fusion"})
UNSCORED_PASSES = {"operator_fusion": "its prediction is not scored on measured compiled runs (no held-out case of "
                                      "the fidelity benchmark compiles): `dpro whatif --fuse-ops` predicts it"}
START_TEMPERATURE = 0.05
COOLING = 0.9


@dataclass(frozen=True)
class Tricks:
    """The search's speed-up tricks, each on unless switched off (see the module docstring)."""

    guidance: bool = True
    incremental: bool = True
    fold: bool = False


@dataclass(frozen=True)
class Evaluated:
    """A strategy, the cost model's prediction for it (``replayed``: the changed graph and its
    replay, which the reports draw) and its memory estimate (bytes, the largest rank's; None
    where the run did not measure memory)."""

    strategy: Strategy
    replayed: Prediction
    memory_bytes: int | None = None

    @property
    def prediction(self) -> dict[str, Any]:
        """The prediction's summary (:func:`dpro.analysis.whatif.predict`)."""
        return self.replayed.summary

    @property
    def predicted_step_ms(self) -> float:
        """The predicted step; where the prediction is a range (a pipeline's micro-batches from
        a recording without probe steps), its slow end: the plan errs safe."""
        summary = self.replayed.summary
        return float(max(summary.get("predicted_range_ms") or [summary["predicted_step_ms"]]))


@dataclass
class SearchResult:
    """What the search found: ``evaluated`` best first (the recorded configuration among
    them), ``notes`` on passes left out and predictions that failed, and what the search cost."""

    baseline_step_ms: float
    evaluated: list[Evaluated]
    notes: list[str] = field(default_factory=list)
    space: int = 0
    tried: int = 0  # strategies predicted, whose prediction failed (see notes), or over the memory budget
    elapsed_s: float = 0.0
    exhaustive: bool = False
    exposed_communication_ms: float = 0.0
    memory_budget_bytes: float | None = None
    over_memory_budget: int = 0  # strategies left out by the memory budget
    tricks: Tricks = Tricks()
    would_fail: int = 0  # strategies left out because they would fail the job (see the notes)
    recorded: Evaluated | None = None  # the recorded configuration's prediction (also over a memory budget)


def search(analysis: RunAnalysis, budget_s: float = 60.0, exact_only: bool = False, seed: int = 0,
           memory_budget_gb: float | None = None, tricks: Tricks = Tricks()) -> SearchResult:
    """Search strategies for the recorded run (see the module docstring) for at most
    ``budget_s`` seconds; ``exact_only``: leave out strategies that change the numerics;
    ``memory_budget_gb``: leave out strategies estimated to need more memory on a rank (GB, 1e9
    bytes); ``tricks``: the speed-up tricks used."""
    started = time.monotonic()
    memory = rank_memory(analysis)
    if memory_budget_gb is not None and not memory:
        raise DproError(f"{analysis.root} holds no memory measurement (recorded before dpro measured memory): "
                        "a memory budget cannot be checked")
    budget_bytes = None if memory_budget_gb is None else memory_budget_gb * 1e9
    layout = analysis.ddp_layout
    parallelism = analysis.parallelism
    if analysis.baseline_step_ns != analysis.baseline_step_ns:
        raise DproError(f"{analysis.root} has no step outside the profiling window to optimize against "
                        "(record more steps than --skip + --warmup + --steps)")
    path = analysis.critical_path_breakdown()
    exposed_ms, step_ms = path["communication"], path["span"]
    compute_ms = path["compute"] + path["launch_bound"]
    notes, axes = [], []
    for name, propose in PASSES.items():
        if name in UNSCORED_PASSES:
            notes.append(f"{name}: left out, {UNSCORED_PASSES[name]}")
            continue
        if tricks.guidance and name in COMMUNICATION_PASSES and exposed_ms < MIN_EXPOSED_COMM * step_ms:
            notes.append(f"{name}: left out, communication is exposed for {exposed_ms:.1f} ms of the "
                         f"{step_ms:.1f} ms step on the critical path (compute-bound)")
            continue
        if tricks.guidance and name in COMPUTE_PASSES and compute_ms < MIN_CRITICAL_COMPUTE * step_ms:
            notes.append(f"{name}: left out, the critical path of the {step_ms:.1f} ms step holds {compute_ms:.1f} ms "
                         "of compute")
            continue
        proposals = propose(analysis)
        options = [s for s in proposals.settings if not (exact_only and Strategy(s).lossy)]
        if not options:
            notes.append(f"{name}: " + (proposals.why or "only lossy proposals, left out by --exact-only"))
            continue
        axes.append((name, options))
    space = math.prod(len(options) + 1 for _, options in axes)
    cache: dict[tuple[int, ...], Evaluated | None] = {}
    over_budget: set[tuple[int, ...]] = set()
    failing: dict[str, int] = {}  # why a strategy would fail the job: strategies left out for it
    predictions: dict[Change, Prediction | None] = {}  # one per change the cost model sees
    clock = _Budget(started, budget_s)
    try:
        cost = CostModel(analysis, incremental=tricks.incremental, fold=tricks.fold)
    except DproError as e:
        raise DproError(f"the cost model cannot replay the recorded configuration: {e}") from None

    def predicted(strategy: Strategy) -> Prediction | None:
        change = strategy.change()
        if change not in predictions:
            predictions[change] = _predict(cost, strategy, notes)
        return predictions[change]

    def evaluate(state: tuple[int, ...], always: bool = False) -> Evaluated | None:
        if state not in cache and (always or clock.allows()):
            strategy = _strategy(axes, state)
            needs = strategy_memory_bytes(strategy.settings, memory, layout, parallelism)
            if not always and budget_bytes is not None and needs is not None and needs > budget_bytes:
                over_budget.add(state)
                cache[state] = None
            else:
                prediction = clock.timed(lambda: predicted(strategy))
                why = None if prediction is None else fails_the_job(analysis, strategy.settings, len(
                    prediction.summary.get("buckets_bytes") or (layout.buckets if layout else ())))
                if why:
                    failing[why] = failing.get(why, 0) + 1
                cache[state] = None if prediction is None or why else Evaluated(strategy, prediction, needs)
        return cache.get(state)

    recorded = evaluate((0,) * len(axes), always=True)  # the baseline every strategy is compared with
    if recorded is None:
        raise DproError(f"the cost model cannot replay the recorded configuration: {notes[-1]}")
    if tricks.fold and not recorded.prediction.get("ranks_folded"):
        notes.append("identical-rank folding: not used, the ranks do not run the same ops (every rank is replayed)")
    singles = [tuple(i + 1 if k == a else 0 for k in range(len(axes)))
               for a, (_, options) in enumerate(axes) for i in range(len(options))]
    for state in singles:
        evaluate(state)
    if len(axes) > 1:
        start = min((s for s in [(0,) * len(axes), *singles] if cache.get(s) is not None),
                    key=lambda s: cache[s].predicted_step_ms)
        combinations = _Combinations(axes, evaluate, cache, clock, space,
                                     START_TEMPERATURE * recorded.predicted_step_ms)
        stuck_after = 4 * sum(len(options) for _, options in axes)  # moves to states predicted already
        anneal(combinations, random.Random(seed), restart_after=stuck_after + 1, position=start)
    found = [e for e in cache.values() if e is not None]
    notes += [f"{count} strategies left out: {why}" for why, count in failing.items()]
    if budget_bytes is not None:
        if recorded.memory_bytes is not None and recorded.memory_bytes > budget_bytes:
            notes.append(f"the recorded configuration needs {recorded.memory_bytes / 1e9:.3g} GB, over the "
                         f"{memory_budget_gb:g} GB budget")
            found.remove(recorded)
        if over_budget:
            notes.append(f"{len(over_budget)} strategies left out: estimated to need more than {memory_budget_gb:g} GB")
        if not found:
            fitting = space - 1 - len(over_budget)  # strategies within the budget, predicted or not
            if fitting:
                raise DproError(f"no strategy within {memory_budget_gb:g} GB could be predicted: {fitting} fit, and "
                                "their predictions failed or the time budget ran out")
            least = min(strategy_memory_bytes(_strategy(axes, s).settings, memory, layout, parallelism) for s in over_budget | {
                (0,) * len(axes)})
            raise DproError(f"no strategy fits in {memory_budget_gb:g} GB: the least any needs is {least / 1e9:.3g} GB")
        unmeasured = sorted(r for r, m in memory.items() if m.added_bytes is None)
        if unmeasured:
            notes.append(f"ranks {unmeasured}: the step's own memory was not recorded (no shapes step): their "
                         "estimates count only the tensors held throughout")
    # equal predictions (a bucket cap that changes nothing): the strategy with fewer changes first
    found.sort(key=lambda e: (round(e.predicted_step_ms, 2), len(e.strategy.settings)))
    return SearchResult(recorded.prediction["baseline_step_ms"], found, notes, space, len(cache),
                        time.monotonic() - started, len(cache) == space, exposed_ms, budget_bytes, len(over_budget), tricks,
                        sum(failing.values()), recorded)


def _strategy(axes: list[tuple[str, list[dict[str, Any]]]], state: tuple[int, ...]) -> Strategy:
    settings: dict[str, Any] = {}
    passes = []
    for (name, options), i in zip(axes, state):
        if i:
            settings.update(options[i - 1])
            passes.append(name)
    return Strategy(settings, tuple(passes))


def _predict(cost: CostModel, strategy: Strategy, notes: list[str]) -> Prediction | None:
    try:
        return cost.predict(strategy.change())
    except DproError as e:
        notes.append(f"{strategy.name}: not predicted: {e}")
        return None


@dataclass
class _Combinations(Landscape[tuple[int, ...]]):
    """The passes' combinations as a landscape to anneal: a state takes one option of each pass (0:
    none), a move changes one pass's option, a restart goes to a state not predicted yet, the
    energy is the predicted step (ms) and the temperature cools by :data:`COOLING` a move."""

    axes: list[tuple[str, list[dict[str, Any]]]]
    evaluate: Callable[[tuple[int, ...]], Evaluated | None]
    cache: dict[tuple[int, ...], Evaluated | None]
    clock: _Budget
    space: int
    start_temperature: float

    def stop(self) -> bool:
        return not self.clock.allows() or len(self.cache) >= self.space

    def start(self, rng: random.Random) -> tuple[int, ...]:
        states = itertools.product(*(range(len(options) + 1) for _, options in self.axes))
        return rng.choice([s for s in states if s not in self.cache])

    def neighbour(self, state: tuple[int, ...], rng: random.Random) -> tuple[int, ...]:
        axis = rng.randrange(len(self.axes))
        return state[:axis] + (rng.randrange(len(self.axes[axis][1]) + 1),) + state[axis + 1:]

    def visit(self, state: tuple[int, ...], position: tuple[int, ...] | None) -> Visit:
        seen = state in self.cache
        self.evaluate(state)
        return Visit.SEEN if seen else Visit.NEW

    def energy(self, state: tuple[int, ...]) -> float | None:
        found = self.cache.get(state)
        return None if found is None else found.predicted_step_ms

    def temperature(self, moves: int) -> float:
        return max(self.start_temperature * COOLING ** moves, 1e-6)


class _Budget:
    """The search's time budget: another evaluation is allowed while the time spent plus the
    slowest evaluation so far stays within it."""

    def __init__(self, started: float, budget_s: float) -> None:
        self.started, self.budget_s = started, budget_s
        self.slowest = 0.0

    def allows(self) -> bool:
        return time.monotonic() - self.started + self.slowest <= self.budget_s

    def timed(self, call: Any) -> Any:
        begin = time.monotonic()
        try:
            return call()
        finally:
            self.slowest = max(self.slowest, time.monotonic() - begin)
