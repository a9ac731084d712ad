"""What a health check finds: metrics, checks with a status, nodes and the run's verdict."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from dpro.anomaly.suspects import Suspect, to_json

if TYPE_CHECKING:
    from dpro.anomaly.fabric.probes import Probes

__all__ = ["COULD_NOT_RUN", "EXIT_CODES", "JOB", "Check", "HealthReport", "Metric", "Node", "comparable", "report_from_json", "worst"]

# Statuses, mildest first; a node's verdict is that of its worst check.
STATUSES = ("skip", "pass", "warn", "fail")
VERDICT_OF = {"skip": "healthy", "pass": "healthy", "warn": "degraded", "fail": "failed"}
VERDICTS = ("healthy", "degraded", "failed")
EXIT_CODES = {"healthy": 0, "degraded": 1, "failed": 2}
COULD_NOT_RUN = 3
JOB = "job"  # the node name under which job-wide checks (collectives, the fabric) are kept


@dataclass
class Metric:
    """One measured value. ``higher_is_better``: True (bandwidth), False (latency, errors), or
    None for a value that is only recorded (a clock's maximum). ``baseline`` is filled in when
    a rule compared it with one."""

    name: str
    value: float
    unit: str = ""
    higher_is_better: bool | None = None
    baseline: float | None = None

    @property
    def comparable(self) -> bool:
        """Whether a rule compares it with a baseline (:func:`comparable`)."""
        return comparable(self.higher_is_better, self.unit)


def comparable(higher_is_better: bool | None, unit: str) -> bool:
    """A value with a better direction that is not a count: counts (errors, events) are judged
    by their own checks, never against a baseline."""
    return higher_is_better is not None and unit != "count"


@dataclass
class Check:
    """One check of one node (or of the job): ``status`` is skip, pass, warn or fail; ``message``
    says why in a line; ``evidence`` holds what the verdict rests on."""

    name: str
    status: str = "pass"
    message: str = ""
    metrics: list[Metric] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check status {self.status!r} is not one of {STATUSES}")

    def escalate(self, status: str, reason: str) -> None:
        """Raise the status to ``status`` (never lower it) and add ``reason`` to the message."""
        if STATUSES.index(status) > STATUSES.index(self.status):
            self.status = status
        self.message = f"{self.message}; {reason}" if self.message else reason


@dataclass
class Node:
    """A host and its checks (or :data:`JOB` and the job-wide checks)."""

    host: str
    checks: list[Check] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return worst(VERDICT_OF[c.status] for c in self.checks)


def worst(verdicts: Any) -> str:
    """The worst of some verdicts (healthy when there are none)."""
    return max(verdicts, key=VERDICTS.index, default="healthy")


@dataclass
class HealthReport:
    """One run of the health check: its nodes (hosts, then :data:`JOB`), the suspects the
    pairwise matrix points at, and facts about the run."""

    started: str
    finished: str
    nodes: list[Node]
    suspects: list[Suspect] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # world size, backend, hosts, config
    probes: Probes | None = field(default=None, repr=False)  # every pairwise probe, written as probes.csv

    @property
    def verdict(self) -> str:
        return worst(n.verdict for n in self.nodes)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def node(self, host: str) -> Node:
        """The node called ``host`` (added when new)."""
        for n in self.nodes:
            if n.host == host:
                return n
        self.nodes.append(Node(host))
        return self.nodes[-1]

    def to_json(self) -> dict[str, Any]:
        """``{"verdict", "nodes": [{"host", "verdict", "checks"}], "suspects", ...}``."""
        return {"verdict": self.verdict, "started": self.started, "finished": self.finished, **self.facts,
                "nodes": [{"host": n.host, "verdict": n.verdict, "checks": [asdict(c) for c in n.checks]}
                          for n in self.nodes],
                **to_json(self.suspects)}


def report_from_json(data: dict[str, Any]) -> HealthReport:
    """A report back from :meth:`HealthReport.to_json`'s dictionary."""
    nodes = [Node(n["host"], [Check(c["name"], c["status"], c["message"], [Metric(**m) for m in c["metrics"]],
                                    c["evidence"]) for c in n["checks"]]) for n in data["nodes"]]
    suspects = [Suspect(s["kind"], s["name"], s["score"], s.get("rank"), s.get("host"), s.get("evidence", {}))
                for s in data.get("suspects", [])]
    facts = {k: v for k, v in data.items() if k not in ("verdict", "started", "finished", "nodes", "suspects")}
    return HealthReport(data["started"], data["finished"], nodes, suspects, facts)
