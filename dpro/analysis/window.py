"""Whether the profiling window ran like the job's other steps.

The graph, and so every replay and prediction, is built from the profiled window's steps: a
window that something disturbed (another job on the host, a burst of the machine, a slow
storage write) makes the model follow that disturbance. :func:`window_check` compares the
window's steps with the steps users run (outside it) and flags a window that ran far slower than
them: by more than :data:`DISTURBED_PCT` and more than :data:`SPREADS` robust spreads of the
unprofiled steps. The profiler's own cost is part of the window's time (the replay takes out its
calibrated share), so a job of many tiny CPU ops can be flagged for its profiler alone: the
message says so.

    >>> window_check(RunAnalysis.open("run1"))           # doctest: +SKIP
    {'profiled_step_ms': 418.2, 'unprofiled_step_ms': 385.9, 'slowdown_pct': 8.4, ...}
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpro.stats import robust_spread

from dpro.analysis.run import RunAnalysis

__all__ = ["DISTURBED_PCT", "SPREADS", "window_check"]

DISTURBED_PCT = 10.0
SPREADS = 3.0


def window_check(analysis: RunAnalysis) -> dict[str, Any]:
    """The profiled window against the unprofiled steps, over every rank's steps:
    ``profiled_step_ms`` and ``unprofiled_step_ms`` (medians), ``slowdown_pct``, the unprofiled
    steps' ``spread_pct`` (robust), ``disturbed`` and ``message`` (one line; None when the window
    is not flagged or cannot be judged)."""
    times = analysis.step_times
    profiled = times.loc[times["phase"] == "profiled", "dur_ns"].to_numpy(np.float64)
    plain = analysis.unprofiled_steps["dur_ns"].to_numpy(np.float64)
    out: dict[str, Any] = {"profiled_step_ms": None, "unprofiled_step_ms": None, "slowdown_pct": None,
                           "spread_pct": None, "disturbed": False, "message": None}
    if not len(profiled) or not len(plain):
        return out
    p, u = float(np.median(profiled)), float(np.median(plain))
    slowdown, spread = 100 * (p / u - 1), 100 * robust_spread(plain) / u
    disturbed = slowdown > max(DISTURBED_PCT, SPREADS * spread)
    out.update(profiled_step_ms=p / 1e6, unprofiled_step_ms=u / 1e6, slowdown_pct=slowdown, spread_pct=spread,
               disturbed=bool(disturbed))
    if disturbed:
        out["message"] = (f"the profiling window's steps ran {slowdown:.0f}% slower than the unprofiled ones "
                          f"({p / 1e6:.1f} against {u / 1e6:.1f} ms, whose spread is {spread:.1f}%): the replay and "
                          "every prediction follow the window; the profiler's calibrated cost is taken out, the "
                          "rest was a disturbance or more profiler cost than calibrated. Record again if the "
                          "machine was busy")
    return out
