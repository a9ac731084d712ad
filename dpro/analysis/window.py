"""Whether the profiling window ran like the job's other steps.

The graph, and so every replay and prediction, is built from the profiled window's steps: a
window that something disturbed (another job on the host, a burst of the machine, a slow
storage write) makes the model follow that disturbance. :func:`window_check` compares the
window's steps, less what the profiler itself cost them, with the steps users run (outside the
window), and flags a window that ran far slower than them: by more than :data:`DISTURBED_PCT`
and more than :data:`SPREADS` robust spreads of the unprofiled steps.

The profiler's cost per step is its calibrated cost per event (``calibration.json``, the mean of
its two classes) times the events the rank recorded per profiled step: by default those of the
graph's CPU ops (the events the replay takes the profiler's cost out of, read from the stored
analysis), or those the caller counted in the traces. Without a calibration nothing is taken out.

    >>> window_check(RunAnalysis.open("run1"))           # doctest: +SKIP
    {'profiled_step_ms': 418.2, 'unprofiled_step_ms': 385.9, 'profiler_ms': 1.2, 'slowdown_pct': 8.1, ...}
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpro.stats import robust_spread

from dpro.analysis.run import RunAnalysis

__all__ = ["DISTURBED_PCT", "SPREADS", "window_check"]

DISTURBED_PCT = 10.0
SPREADS = 3.0


def window_check(analysis: RunAnalysis, events_per_step: dict[int, float] | None = None) -> dict[str, Any]:
    """The profiled window against the unprofiled steps, the mean over ranks of each rank's
    medians: ``profiled_step_ms``, ``unprofiled_step_ms``, ``profiler_ms`` (its calibrated cost
    per step), ``slowdown_pct`` (of the window less that cost), ``spread_pct`` (of the
    unprofiled steps, robust), ``disturbed`` and ``message`` (one line; None when the window is
    not flagged or cannot be judged). ``events_per_step``: each rank's profiler events per
    profiled step (default: the graph's)."""
    out: dict[str, Any] = {"profiled_step_ms": None, "unprofiled_step_ms": None, "profiler_ms": None,
                           "slowdown_pct": None, "spread_pct": None, "disturbed": False, "message": None}
    profiled, plain = analysis.profiled_step_ns, analysis.unprofiled_step_ns
    ranks = [r for r in analysis.ranks if profiled[r] == profiled[r] and plain[r] == plain[r]]
    if not ranks:
        return out
    steps = analysis.unprofiled_steps
    p = float(np.mean([profiled[r] for r in ranks]))
    u = float(np.mean([plain[r] for r in ranks]))
    events = _graph_events(analysis) if events_per_step is None else events_per_step
    costs = analysis.profiler_cost_ns()
    cost = float(np.mean([events.get(r, 0.0) * (costs[r]["forward"] + costs[r]["backward"]) / 2 if r in costs else 0.0
                          for r in ranks]))
    spread = 100 * float(np.median([robust_spread(steps.loc[steps["rank"] == r, "dur_ns"].to_numpy()) / plain[r]
                                    for r in ranks]))
    slowdown = 100 * ((p - cost) / u - 1)
    disturbed = slowdown > max(DISTURBED_PCT, SPREADS * spread)
    out.update(profiled_step_ms=p / 1e6, unprofiled_step_ms=u / 1e6, profiler_ms=cost / 1e6, slowdown_pct=slowdown,
               spread_pct=spread, disturbed=bool(disturbed))
    if disturbed:
        profiler = (f"{cost / 1e6:.1f} ms of it the profiler's calibrated cost" if cost else
                    "the profiler's cost not calibrated")
        out["message"] = (f"the profiling window's steps ran {slowdown:.0f}% slower than the unprofiled ones "
                          f"({p / 1e6:.1f} ms, {profiler}, against {u / 1e6:.1f} ms, whose spread is {spread:.1f}%): "
                          "the replay and every prediction follow the window. Record again if the machine was busy")
    return out


def _graph_events(analysis: RunAnalysis) -> dict[int, float]:
    """Each rank's profiler events in the graph's typical step (its CPU ops and the calls in them)."""
    nodes = analysis.graph.nodes
    return {int(r): float(n) for r, n in nodes.groupby("rank")["events"].sum().items()}
