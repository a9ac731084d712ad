"""Two recorded runs side by side (``dpro compare``): step times, the measured speed-up, the
prediction the second run's strategy carried (``dpro record --apply``) against what it measured,
and where the step's time moved (the critical path's breakdown of both replays)."""

from __future__ import annotations

import math
from typing import Any


from dpro.analysis.run import RunAnalysis

__all__ = ["compare"]


def compare(a: RunAnalysis, b: RunAnalysis) -> dict[str, Any]:
    """``{"a", "b", "speedup", "prediction", "breakdown"}``: each run's step time (the mean of
    its ranks' unprofiled medians, ms, as ``dpro whatif`` and ``dpro optimize`` take the baseline)
    and unprofiled steps per rank, ``a``'s step time over ``b``'s; ``prediction``: the strategy ``b``
    was recorded with, its predicted step time and the error against ``b``'s measured one (null
    when ``b`` was recorded without ``--apply``); ``breakdown``: ms per category of the critical
    path, the mean over ranks, for each run."""
    step_a, step_b = _step_ms(a), _step_ms(b)
    strategy = (b.run.manifest.get("options") or {}).get("apply")
    prediction = None
    if strategy:
        predicted = strategy.get("predicted_step_ms")
        prediction = {"strategy": strategy.get("name"), "settings": strategy.get("settings"),
                      "baseline_step_ms": strategy.get("baseline_step_ms"), "predicted_step_ms": predicted,
                      "error_pct": 100 * (predicted / step_b - 1) if predicted and step_b == step_b else None,
                      "applied": _applied(b)}
    return {"a": {"run": str(a.root), "step_ms": step_a, "steps": _count(a)},
            "b": {"run": str(b.root), "step_ms": step_b, "steps": _count(b)},
            "speedup": step_a / step_b if step_b and not math.isnan(step_b) else None,
            "prediction": prediction,
            "breakdown": {"a": _breakdown(a), "b": _breakdown(b)}}


def _step_ms(analysis: RunAnalysis) -> float:
    return analysis.baseline_step_ns / 1e6


def _count(analysis: RunAnalysis) -> int:
    per_rank = analysis.unprofiled_steps.groupby("rank")["dur_ns"].count()
    return int(per_rank.max()) if len(per_rank) else 0


def _applied(analysis: RunAnalysis) -> dict[int, list[str]]:
    return {r: list(m.applied.applied) for r, m in analysis.metas.items()}


def _breakdown(analysis: RunAnalysis) -> dict[str, float] | None:
    return analysis.critical_path_breakdown() if analysis.has_traces else None
