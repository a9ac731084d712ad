"""A run as the dashboard serves it: the run model and what the pages derive from it, computed
once (at start-up, :meth:`RunView.prepare`) and kept, so that opening a page decodes no trace.

A run that lacks a part still loads: :attr:`RunView.missing` says what is missing (no traces,
so no timeline, replay or breakdown; no GPU samples; no connection samples...) and each page
shows it where the part would be.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pandas as pd

from dpro.analysis.run import RunAnalysis, undecodable_trace
from dpro.analysis.whatif import Change, CostModel, Prediction
from dpro.analysis.window import window_check
from dpro.anomaly.diagnose import diagnose
from dpro.anomaly.fabric.probes import Probes, read_probes
from dpro.anomaly.fabric.topology import read_topology
from dpro.anomaly.run.traffic_matrix import connection_rates, host_rates
from dpro.anomaly.run.nodes import gpu_samples
from dpro.anomaly.suspects import Suspect
from dpro.errors import DproError
from dpro.replayer.breakdown import breakdown

from dpro.dashboard.overlays import collective_links, critical_ops, occurrences
from dpro.dashboard.timeline_data import Lanes, build_lanes

__all__ = ["NO_REPORT", "Extras", "RunView"]

PREDICTIONS_KEPT = 32
NO_REPORT = "optimizer report: none given (dpro optimize RUN -o DIR, then --report DIR)"


@dataclass(frozen=True)
class Extras:
    """What the dashboard shows beside the runs: ``report`` (``dpro optimize -o DIR``'s DIR),
    pairwise ``probes`` and a fabric ``topology`` (files, as ``dpro diagnose`` takes them)."""

    report: Path | None = None
    probes: Path | None = None
    topology: Path | None = None


@dataclass
class RunView:
    """One run (see the module docstring)."""

    analysis: RunAnalysis
    extras: Extras = field(default_factory=Extras)
    missing: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)  # what a partial run lacks (Run.gaps, undecodable traces)
    no_replay: str | None = None  # why there is no timeline, replay or what-if (None: there is)
    _predictions: OrderedDict = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.analysis.root.name

    def prepare(self) -> "RunView":
        """Compute what the pages show (a part that cannot be had is noted in :attr:`missing`)."""
        self.gaps = self.analysis.run.gaps
        if not self.analysis.has_traces:
            self.no_replay = (f"traces: none ({self.analysis.run.why_no_traces()}), so there is no timeline, replay, "
                              "breakdown or what-if")
        else:
            try:
                _ = self.lanes, self.critical, self.occurrence, self.breakdowns
            except DproError as e:
                self.no_replay = f"replay: {e}"
            else:
                self.gaps = self.gaps + [undecodable_trace(r, why) for r, why in self.analysis.undecodable.items()]
        if self.no_replay is not None:
            self.missing.append(self.no_replay)
        if self.analysis.step_times.empty:
            self.missing.append("step times: no rank timed a step")
        if gpu_samples(self.analysis.run).empty:
            self.missing.append("GPU samples: none recorded (no GPU, or NVML unavailable)")
        if self.host_rates[0] == []:
            self.missing.append("host-to-host rates: the run has no connection samples between hosts")
        if self.report is None:
            self.missing.append(NO_REPORT)
        _ = self.suspects
        return self

    def label(self, rank: int) -> str:
        """``rank 3 (host)``, with its place in the device mesh where the job has one (``dp 1 · tp 1``)."""
        host = self.analysis.hosts.get(rank)
        where = self.analysis.parallelism.coordinate(rank)
        return f"rank {rank}" + (f" ({host})" if host else "") + (f" {where}" if where else "")

    @property
    def has_replay(self) -> bool:
        return self.no_replay is None

    @cached_property
    def lanes(self) -> Lanes:
        return build_lanes(self.analysis)

    @cached_property
    def links(self) -> pd.DataFrame:
        return collective_links(self.analysis, self.lanes)

    @cached_property
    def critical(self) -> pd.DataFrame:
        return critical_ops(self.analysis, self.lanes, self.links)

    @cached_property
    def occurrence(self) -> np.ndarray:
        return occurrences(self.lanes)

    @cached_property
    def breakdowns(self) -> dict[int, dict[str, float]]:
        """Per rank, ms of each category of its critical path in the replay of the recorded step."""
        graph, result = self.analysis.graph, self.analysis.replay()
        return {r: {k[:-3]: v for k, v in breakdown(graph, result, r).items() if k.endswith("_ms")}
                for r in sorted(graph.step_ns)}

    @cached_property
    def window(self) -> dict[str, Any]:
        """Whether the profiling window ran like the other steps (:func:`dpro.analysis.window.window_check`)."""
        return window_check(self.analysis)

    @cached_property
    def replayed_step_ms(self) -> dict[int, float]:
        """The replay's step time per rank (the recorded configuration, unanchored)."""
        return {int(r): v / 1e6 for r, v in self.analysis.replay().step_ns.items()} if self.has_replay else {}

    @cached_property
    def cost_model(self) -> CostModel:
        """The run's cost model, built once for every prediction the session asks for."""
        return CostModel(self.analysis)

    def predict(self, change: Change) -> Prediction:
        """The run's job under ``change`` (the last :data:`PREDICTIONS_KEPT` are kept)."""
        with self._lock:
            if change in self._predictions:
                self._predictions.move_to_end(change)
                return self._predictions[change]
        prediction = self.cost_model.predict(change)
        with self._lock:
            self._predictions[change] = prediction
            while len(self._predictions) > PREDICTIONS_KEPT:
                self._predictions.popitem(last=False)
        return prediction

    @cached_property
    def report(self) -> dict[str, Any] | None:
        """``report.json`` of the optimizer's report given, or None."""
        if self.extras.report is None:
            return None
        path = self.extras.report / "report.json" if self.extras.report.is_dir() else self.extras.report
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise DproError(f"cannot read the optimizer report {path}: {e}") from None

    @cached_property
    def probes(self) -> Probes | None:
        """The pairwise probes given, read once."""
        return None if self.extras.probes is None else read_probes(self.extras.probes)

    @cached_property
    def topology(self) -> nx.MultiGraph | None:
        """The fabric topology given, read once."""
        return None if self.extras.topology is None else read_topology(self.extras.topology)

    @cached_property
    def suspects(self) -> list[Suspect]:
        return diagnose(self.analysis, self.probes, self.topology)

    @cached_property
    def host_rates(self) -> tuple[list[str], np.ndarray]:
        """Hosts and the job's own host-to-host sending rates (bit/s), from its connection samples."""
        return host_rates(connection_rates(self.analysis.run))
