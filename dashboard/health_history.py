"""The health check's history as the Health page serves it, read once at start-up: the last
nights' verdicts per node, each node's comparable metrics night by night, the regressions of the
newest night (:func:`dpro.anomaly.health.trends.trends`, as ``dpro health history`` flags
them), and the newest night's pairwise matrix and suspects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dpro.anomaly.health.config import Rules
from dpro.anomaly.health.history import History
from dpro.anomaly.health.model import JOB
from dpro.anomaly.health.trends import newest_trends

__all__ = ["NIGHTS", "HealthView"]

NIGHTS = 30  # the newest runs the page shows
DEFAULT_METRIC = "pairwise/recv_gbps"


@dataclass(frozen=True)
class HealthView:
    """The history (see the module docstring); ``runs`` newest first, as :meth:`History.runs`."""

    name: str
    runs: list[dict[str, Any]]
    regressions: list[dict[str, Any]]

    @classmethod
    def read(cls, url: str, rules: Rules | None = None) -> HealthView:
        """The history at ``url``, opened read-only; the newest night judged against the
        ``rules.nights`` before it, as the nightly check judges it (default: by the rules
        stored with the newest night)."""
        with History.open(url, read_only=True) as history:
            runs, found = newest_trends(history, rules, NIGHTS)
            name = history.engine.url.render_as_string(hide_password=True)
        return cls(name, runs[:NIGHTS], found["regressions"])

    @property
    def nights(self) -> list[str]:
        """A label per run, oldest first."""
        return [f"#{r['id']} {r['started']}" for r in reversed(self.runs)]

    @property
    def hosts(self) -> list[str]:
        """Every node in the runs, the job-wide checks (:data:`JOB`) last."""
        names = {h for r in self.runs for h in r["nodes"]}
        return sorted(names - {JOB}) + ([JOB] if JOB in names else [])

    def verdicts(self) -> list[list[str | None]]:
        """Per run (oldest first): its verdict, then each of :attr:`hosts`' (None: not in it)."""
        return [[r["verdict"], *(r["nodes"][h]["verdict"] if h in r["nodes"] else None for h in self.hosts)]
                for r in reversed(self.runs)]

    @property
    def metrics(self) -> dict[str, bool]:
        """Every metric a rule compares, ``{check/metric: higher_is_better}``, sorted."""
        found = {k: v for r in self.runs for n in r["nodes"].values() for k, v in n["comparable"].items()}
        return dict(sorted(found.items()))

    @property
    def default_metric(self) -> str | None:
        metrics = self.metrics
        return DEFAULT_METRIC if DEFAULT_METRIC in metrics else next(iter(metrics), None)

    def series(self, key: str) -> dict[str, list[float | None]]:
        """``key`` per node that measured it, a value per run oldest first (None: not that night)."""
        out = {h: [r["nodes"].get(h, {}).get("metrics", {}).get(key) for r in reversed(self.runs)] for h in self.hosts}
        return {h: values for h, values in out.items() if any(v is not None for v in values)}

    @property
    def matrix(self) -> tuple[list[str], np.ndarray] | None:
        """The newest night's pairwise matrix in Gb/s (row sends to column; NaN: not measured)."""
        pairwise = self.runs[0]["facts"].get("pairwise") if self.runs else None
        if not pairwise:
            return None
        return pairwise["hosts"], np.array([[np.nan if v is None else v for v in row] for row in pairwise["gbps"]])

    @property
    def suspects(self) -> list[dict[str, Any]]:
        """The newest night's suspects, most likely first."""
        return self.runs[0]["suspects"] if self.runs else []
