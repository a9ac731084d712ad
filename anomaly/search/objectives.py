"""What a workload search drives to an extreme, and when a measurement counts as an anomaly.

Each objective turns a :class:`Result` into a ``score`` (what the report shows), decides whether
that score is anomalous, and into an ``energy`` in [0, 1] that the annealing lowers: 0 is the
most anomalous workload seen, 1 a normal one. Energies are relative to what has been observed so
far (the best throughput at a message size, the highest counter rate), so objectives are
stateful: the search calls :meth:`observe` on every measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from dpro.anomaly.engines.base import Direction, Result, Workload


class Objective(Protocol):
    """A measure of how anomalous a workload's result is."""

    name: str
    threshold: float

    def reference(self, workload: Workload) -> dict[str, Any] | None:
        """Features of the baseline to change to get the workload ``workload`` is compared with
        (measured once before it is scored), None when it needs none."""

    def observe(self, result: Result) -> None:
        """Take a measurement into account (it may raise expectations)."""

    def score(self, result: Result) -> float | None:
        """The measured value of the objective; None when the run failed or did not measure it."""

    def anomalous(self, score: float | None) -> bool:
        """Whether ``score`` crosses the threshold."""

    def energy(self, result: Result) -> float | None:
        """0 (most anomalous seen) to 1 (normal); None when there is no score."""

    def describe(self) -> dict[str, Any]:
        """The objective's settings and what it learned, JSON-ready."""


def per_direction_gbps(result: Result) -> float | None:
    """Throughput per sending direction (``direction=bi`` sends both ways), None when not measured."""
    if not result.ok or result.throughput_gbps is None:
        return None
    return result.throughput_gbps / (2 if result.workload.direction is Direction.BI else 1)


@dataclass
class ThroughputObjective:
    """Throughput per sending direction as a fraction of what the workload's message size should
    get: ``link_gbps`` when given, else the best seen at that size (the search measures the
    baseline at each size it visits, for a start). Anomalous below ``threshold``."""

    threshold: float = 0.5
    link_gbps: float | None = None
    seen_gbps: dict[int, list[float]] = field(default_factory=dict)  # per direction, by message size
    name: str = field(default="throughput", init=False)

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= 1:
            raise ValueError(f"a throughput threshold is a fraction of the expected (0 to 1], not {self.threshold}")
        if self.link_gbps is not None and self.link_gbps <= 0:
            raise ValueError(f"the link rate must be positive, not {self.link_gbps}")

    def reference(self, workload: Workload) -> dict[str, Any] | None:
        return None if self.link_gbps else {"message_size": workload.message_size}

    def observe(self, result: Result) -> None:
        if (gbps := per_direction_gbps(result)) is not None:
            self.seen_gbps.setdefault(result.workload.message_size, []).append(gbps)

    def expected_gbps(self, message_size: int) -> float | None:
        """Throughput per direction a workload with this message size should reach."""
        return self.link_gbps or max(self.seen_gbps.get(message_size, [0.0])) or None

    def score(self, result: Result) -> float | None:
        gbps, expected = per_direction_gbps(result), self.expected_gbps(result.workload.message_size)
        return None if gbps is None or not expected else gbps / expected

    def anomalous(self, score: float | None) -> bool:
        return score is not None and score < self.threshold

    def energy(self, result: Result) -> float | None:
        score = self.score(result)
        if score is None:
            return None
        lowest = min(self.scores(), default=1.0)
        return 1.0 if lowest >= 1 else min(max((score - lowest) / (1 - lowest), 0.0), 1.0)

    def scores(self) -> list[float]:
        """The score of every measurement so far, against what is expected now."""
        return [gbps / expected for size, seen in self.seen_gbps.items()
                if (expected := self.expected_gbps(size)) for gbps in seen]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "threshold": self.threshold, "link_gbps": self.link_gbps,
                "expected_gbps": {str(size): max(seen) for size, seen in sorted(self.seen_gbps.items())}
                if self.link_gbps is None else None}


@dataclass
class CounterObjective:
    """The per-second rate of one counter (raw or canonical name, e.g. ``rx_pause_frames``),
    summed over both endpoints and all their devices. Anomalous above ``threshold``."""

    counter: str
    threshold: float = 0.0
    highest: float = 0.0
    seen: bool = False  # whether any measurement had the counter

    def __post_init__(self) -> None:
        if not self.counter:
            raise ValueError("name the counter: counter:NAME, e.g. counter:rx_pause_frames")
        if self.threshold < 0:
            raise ValueError(f"a counter threshold is a rate per second, at least 0, not {self.threshold}")

    @property
    def name(self) -> str:
        return f"counter:{self.counter}"

    def reference(self, workload: Workload) -> dict[str, Any] | None:
        return None

    def observe(self, result: Result) -> None:
        if (rate := self.score(result)) is not None:
            self.seen = True
            self.highest = max(self.highest, rate)

    def score(self, result: Result) -> float | None:
        if not result.ok:
            return None
        rates = [r.per_s for diff in result.counters.values() for r in diff.find(self.counter) if r.per_s is not None]
        return sum(rates) if rates else None

    def anomalous(self, score: float | None) -> bool:
        return score is not None and score > self.threshold

    def energy(self, result: Result) -> float | None:
        rate = self.score(result)
        if rate is None:
            return None
        return 1.0 - rate / self.highest if self.highest > 0 else 1.0

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "threshold": self.threshold, "counter": self.counter,
                "highest_per_s": self.highest, "counter_seen": self.seen}


def parse_objective(spec: str, threshold: float | None = None, link_gbps: float | None = None) -> Objective:
    """``throughput`` or ``counter:NAME``, with its threshold (default 0.5 of the expected
    throughput; a counter rate above 0)."""
    if spec == "throughput":
        return ThroughputObjective(0.5 if threshold is None else threshold, link_gbps)
    if spec.startswith("counter:"):
        if link_gbps is not None:
            raise ValueError("a link rate only applies to the throughput objective")
        return CounterObjective(spec.removeprefix("counter:").strip(), 0.0 if threshold is None else threshold)
    raise ValueError(f"objective must be 'throughput' or 'counter:NAME', not {spec!r}")
