"""The run model (:class:`~dpro.analysis.run.RunAnalysis`): a run opened once, its per-rank stage
fanned out (:mod:`dpro.analysis.fanout`), its derived tables stored; and summaries of runs and
traces (:mod:`dpro.analysis.summary`)."""

from __future__ import annotations

from dpro.analysis.run import RunAnalysis

__all__ = ["RunAnalysis"]
