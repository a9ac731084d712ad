"""Collie-style anomaly search (Kong et al., NSDI 2022): simulated annealing over the workload
space drives an objective (throughput far below what is expected, or a counter rate) to its
extreme; each anomaly found is confirmed by a second measurement and reduced to its minimal
feature set.

The walk (:func:`dpro.annealing.anneal`) starts from a random workload and moves one feature
at a time (:meth:`WorkloadSpace.neighbour`), favouring the features whose moves have changed
the energy most so far; a move is kept when it lowers the objective's energy, or with
probability ``exp(-increase / temperature)``, the temperature falling geometrically from
``start_temperature`` to ``end_temperature`` as the budget is spent. Minimal feature set: from the
anomalous workload, each feature that differs from the benign baseline is reset to the baseline's
value in turn, and the workload re-measured; the reset is kept when the anomaly persists, so
what remains is the set of features needed to trigger it. Workloads that hold a known minimal
feature set are not searched again, and the walk restarts from a random workload.

Every measurement (search, references for the objective, confirmations, minimization) counts
against the budget; an engine's failure or exception is recorded in its trial, never fatal.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dpro.annealing import Ending, Landscape, Visit, anneal

from dpro.anomaly.engines.base import Endpoint, Engine, Result, Workload
from dpro.anomaly.search.objectives import CounterObjective, Objective, ThroughputObjective
from dpro.anomaly.search.space import WorkloadSpace

_FOCUS = 0.75  # the share of moves given to features by their effect so far (the rest: uniformly)
_MIN_WEIGHT = 0.02  # of a feature whose moves have not changed the energy
_RESTART_AFTER = 20  # moves in a row to already-measured or explained workloads before a random restart
_IDLE_PROPOSALS = 200  # ... and before giving up
_FIRST_FAILURES = 5  # this many failures and no success from the start: the hosts are misconfigured, stop
_ENDINGS = {Ending.STOPPED: "budget spent", Ending.IDLE: "no unmeasured workload left",
            Ending.NOWHERE: "no valid workload to move to"}


@dataclass(frozen=True)
class Budget:
    """When the search stops: after ``max_trials`` measurements or once ``max_seconds`` have passed
    (no measurement starts later; one running may end ``duration_s + timeout_s`` after)."""

    max_trials: int | None = 50
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.max_trials is None and self.max_seconds is None:
            raise ValueError("a budget needs a number of trials, a number of seconds, or both")
        if self.max_trials is not None and self.max_trials < 1:
            raise ValueError(f"the trial budget must be at least 1, not {self.max_trials}")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ValueError(f"the time budget must be positive, not {self.max_seconds}")


@dataclass
class Trial:
    """One measurement. ``kind``: ``search`` (a step of the walk; ``accepted`` says whether the
    walk moved there), ``reference`` (what the objective compares with), ``confirm`` (an anomaly
    measured again) or ``minimize`` (a feature reset to the baseline)."""

    index: int
    kind: str
    workload: Workload
    result: Result
    score: float | None
    anomalous: bool
    seconds: float
    temperature: float | None = None
    accepted: bool | None = None


@dataclass
class Reset:
    """Minimization evidence: ``feature`` set back to the baseline's ``value``; ``needed`` when the
    anomaly went away (or the reset could not be measured, ``why``)."""

    feature: str
    value: Any
    trial: int | None
    score: float | None
    needed: bool
    why: str = ""


@dataclass
class Anomaly:
    """A confirmed anomaly: found by search trial ``trial``, confirmed by ``confirm``; ``minimal``
    is its minimal feature set (feature -> value, empty when the baseline itself is anomalous),
    ``workload`` the baseline with just those features, ``complete`` False when the budget ran out
    before every feature was tried."""

    trial: int
    confirm: int
    found: Workload
    minimal: dict[str, Any]
    workload: Workload
    resets: list[Reset]
    complete: bool


@dataclass
class SearchResult:
    """Everything a search measured and found."""

    engine: str
    objective: Objective
    space: WorkloadSpace
    budget: Budget
    seed: int
    trials: list[Trial] = field(default_factory=list)
    anomalies: list[Anomaly] = field(default_factory=list)
    unconfirmed: list[tuple[int, int | None]] = field(default_factory=list)  # (search trial, re-measurement)
    stopped: str = ""
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)


def search(engine: Engine, server: Endpoint, client: Endpoint, *, space: WorkloadSpace | None = None,
           objective: Objective | None = None, budget: Budget = Budget(), seed: int = 0,
           duration_s: float = 2.0, timeout_s: float = 10.0, start_temperature: float = 0.1,
           end_temperature: float = 0.001, clock: Callable[[], float] = time.monotonic,
           on_trial: Callable[[Trial], None] | None = None) -> SearchResult:
    """Search the workloads of ``space`` (default: all ``engine`` supports) between ``server`` and
    ``client`` for anomalies of ``objective`` (default: throughput below half the expected), each
    run lasting ``duration_s`` and giving up after ``timeout_s``. The same ``seed`` walks the same
    way given the same measurements. ``on_trial`` sees each trial as it ends."""
    if not 0 < end_temperature <= start_temperature:
        raise ValueError("temperatures must satisfy 0 < end_temperature <= start_temperature")
    space = space or WorkloadSpace.for_engine(engine)
    objective = objective or ThroughputObjective()
    out = SearchResult(engine.name, objective, space, budget, seed)
    lab = _Lab(engine, server, client, space, objective, budget, duration_s, timeout_s, clock, on_trial, out)
    walk = _Workloads(lab, start_temperature, end_temperature)
    ending = anneal(walk, random.Random(seed), restart_after=_RESTART_AFTER, give_up_after=_IDLE_PROPOSALS)
    out.stopped = out.stopped or _ENDINGS[ending]
    out.elapsed_s = clock() - lab.start
    if isinstance(objective, CounterObjective) and not objective.seen:
        out.notes.append(f"no measurement had the counter {objective.counter!r} on either endpoint")
    return out


class _Lab:
    """Runs measurements within the budget, scores them, and records them as trials."""

    def __init__(self, engine: Engine, server: Endpoint, client: Endpoint, space: WorkloadSpace,
                 objective: Objective, budget: Budget, duration_s: float, timeout_s: float,
                 clock: Callable[[], float], on_trial: Callable[[Trial], None] | None, out: SearchResult) -> None:
        self.engine, self.server, self.client = engine, server, client
        self.space, self.objective, self.budget = space, objective, budget
        self.duration_s, self.timeout_s = duration_s, timeout_s
        self.clock, self.on_trial, self.out = clock, on_trial, out
        self.start = clock()
        self.referenced: set[Workload] = set()
        self.first: dict[Workload, Trial] = {}  # the first measurement of each workload

    def progress(self) -> float:
        """How much of the budget is spent, 0 to 1."""
        spent = [len(self.out.trials) / self.budget.max_trials if self.budget.max_trials else 0.0,
                 (self.clock() - self.start) / self.budget.max_seconds if self.budget.max_seconds else 0.0]
        return min(max(spent), 1.0)

    def exhausted(self) -> bool:
        return self.progress() >= 1.0

    def measure(self, workload: Workload, kind: str, temperature: float | None = None) -> Trial | None:
        """Measure ``workload`` (after its reference, the first time that is needed); None when the
        budget is spent."""
        overrides = self.objective.reference(workload)
        reference = None if overrides is None else self.space.with_values(self.space.baseline, **overrides)
        if reference is not None and reference != workload and reference not in self.referenced:
            if self._run(reference, "reference") is None:
                return None
            self.referenced.add(reference)
        trial = self._run(workload, kind, temperature)
        if trial is not None and workload == reference:
            self.referenced.add(workload)
        return trial

    def _run(self, workload: Workload, kind: str, temperature: float | None = None) -> Trial | None:
        if self.exhausted():
            return None
        began = self.clock()
        try:
            result = self.engine.run(workload, self.server, self.client, duration_s=self.duration_s,
                                     timeout_s=self.timeout_s)
        except Exception as e:  # an engine's bug must not end the search: it is recorded
            result = Result(self.engine.name, workload, errors=[f"the engine raised {type(e).__name__}: {e}"])
        self.objective.observe(result)
        score = self.objective.score(result)
        trial = Trial(len(self.out.trials), kind, workload, result, score, self.objective.anomalous(score),
                      self.clock() - began, temperature)
        self.out.trials.append(trial)
        self.first.setdefault(workload, trial)
        if self.on_trial:
            self.on_trial(trial)
        return trial

    def explained(self, workload: Workload) -> bool:
        """Whether ``workload`` holds the minimal feature set of an anomaly already found."""
        values = self.space.values(workload)
        return any(all(values[n] == v for n, v in a.minimal.items()) for a in self.out.anomalies)


class _Workloads(Landscape[Workload]):
    """The workload space as a landscape to anneal: a walk starts from a random workload, moves one
    feature (favouring those whose moves changed the energy most, :class:`_Effects`), measures each
    workload once, skips those an anomaly found already explains, and restarts after each anomaly;
    the temperature falls geometrically with the budget spent."""

    def __init__(self, lab: _Lab, start_temperature: float, end_temperature: float) -> None:
        self.lab, self.effects = lab, _Effects()
        self.start_temperature, self.end_temperature = start_temperature, end_temperature

    def stop(self) -> bool:
        return bool(self.lab.out.stopped) or self.lab.exhausted()

    def start(self, rng: random.Random) -> Workload | None:
        return self.lab.space.random(rng)

    def neighbour(self, state: Workload, rng: random.Random) -> Workload | None:
        return self.lab.space.neighbour(state, rng, self.effects.weights(self.lab.space.names))

    def visit(self, state: Workload, position: Workload | None) -> Visit:
        """Measure ``state`` if new; settle an anomaly it shows. A restart also ends the walk where
        the budget is spent or the search stopped (:attr:`SearchResult.stopped`)."""
        lab = self.lab
        if lab.explained(state):
            return Visit.SKIPPED
        if state in lab.first:
            return Visit.SEEN
        trial = lab.measure(state, "search", self.temperature(0))
        if trial is None:
            return Visit.RESTART
        if len(lab.out.trials) >= _FIRST_FAILURES and not any(t.result.ok for t in lab.out.trials):
            lab.out.stopped = (f"the first {len(lab.out.trials)} measurements all failed, the last with: "
                               f"{'; '.join(trial.result.errors)}")
            return Visit.RESTART
        if trial.anomalous and _settle(lab, trial):
            if not lab.out.anomalies[-1].minimal:
                lab.out.stopped = "the baseline itself is anomalous"
            return Visit.RESTART
        if position is not None:
            self.effects.record(lab.space, lab.first[position], trial, lab.objective)
        return Visit.NEW

    def energy(self, state: Workload) -> float | None:
        return self.lab.objective.energy(self.lab.first[state].result)

    def temperature(self, moves: int) -> float:
        """The same at any move: ``start_temperature`` to ``end_temperature`` as the budget is spent."""
        return self.start_temperature * (self.end_temperature / self.start_temperature) ** self.lab.progress()

    def weighed(self, state: Workload, accepted: bool) -> None:
        trial = self.lab.first[state]
        if trial.kind == "search" and trial.accepted is None:
            trial.accepted = accepted


class _Effects:
    """How much moving each feature has changed the energy so far: moves favour the features that
    matter, in proportion to their mean change (untried features get the largest weight seen, so
    each is tried; none gets less than :data:`_MIN_WEIGHT`)."""

    def __init__(self) -> None:
        self.changes: dict[str, list[float]] = {}

    def record(self, space: WorkloadSpace, before: Trial, after: Trial, objective: Objective) -> None:
        old, new = objective.energy(before.result), objective.energy(after.result)
        moved = [n for n, v in space.values(after.workload).items() if v != getattr(before.workload, n)]
        if old is not None and new is not None and len(moved) == 1:
            self.changes.setdefault(moved[0], []).append(abs(new - old))

    def weights(self, names: list[str]) -> dict[str, float]:
        means = {name: sum(c) / len(c) for name, c in self.changes.items()}
        untried = max([*means.values(), _MIN_WEIGHT])
        raw = {n: max(means[n], _MIN_WEIGHT) if n in means else untried for n in names}
        total = sum(raw.values())
        return {n: (1 - _FOCUS) / len(names) + _FOCUS * w / total for n, w in raw.items()}


def _settle(lab: _Lab, found: Trial) -> bool:
    """Confirm the anomaly of search trial ``found`` and minimize it; whether it was confirmed."""
    again = lab.measure(found.workload, "confirm")
    if again is None or not again.anomalous:
        lab.out.unconfirmed.append((found.index, None if again is None else again.index))
        return False
    workload, resets, complete = _minimize(lab, found.workload)
    minimal = lab.space.differences(workload)
    lab.out.anomalies.append(Anomaly(found.index, again.index, found.workload, minimal, workload, resets, complete))
    return True


def _minimize(lab: _Lab, anomalous: Workload) -> tuple[Workload, list[Reset], bool]:
    """Reset each feature that differs from the baseline, keeping the resets under which the
    anomaly persists: the workload left, the evidence, and whether every feature was tried."""
    current, resets = anomalous, []
    for name in lab.space.differences(anomalous):
        baseline_value = getattr(lab.space.baseline, name)
        candidate = lab.space.with_values(current, **{name: baseline_value})
        if candidate is None:
            resets.append(Reset(name, baseline_value, None, None, True, "not a valid workload with the rest as is"))
            continue
        trial = lab.measure(candidate, "minimize")
        if trial is None:
            return current, resets, False
        if not trial.result.ok or trial.score is None:
            resets.append(Reset(name, baseline_value, trial.index, None, True, "; ".join(trial.result.errors) or
                                "the objective was not measured"))
            continue
        resets.append(Reset(name, baseline_value, trial.index, trial.score, not trial.anomalous))
        if trial.anomalous:
            current = candidate
    return current, resets, True
