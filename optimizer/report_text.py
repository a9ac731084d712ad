"""The words of the optimize report that its Markdown, its HTML and the command line share."""

from __future__ import annotations

import shlex
from typing import Any

from dpro.replayer.breakdown import CATEGORIES

__all__ = ["APART", "SHOWN", "TOP", "apply_command", "appliable", "breakdown_rows", "folded", "headline",
           "keep_hint", "speedups"]

TOP = 10  # distinct strategies the reports list first (the rest: report.json, --all)
APART = 5  # code changes they list first
SHOWN = 4  # strategies whose step is drawn beside the recorded configuration's


def speedups(s: dict[str, Any]) -> str:
    """``1.23x (1.10-1.31x)``: the predicted speed-up and its 90% interval."""
    shown = f"{s['predicted_speedup']:.2f}x"
    return shown + ("" if s["speedup_interval"] is None else
                    f" ({s['speedup_interval'][0]:.2f}-{s['speedup_interval'][1]:.2f}x)")


def folded(s: dict[str, Any], shown: int = 2) -> str:
    """The strategies a line stands for: the first ``shown`` names and a count of the rest."""
    names = s["equivalents"]
    return ", ".join(names[:shown]) + (f" +{len(names) - shown} more" if len(names) > shown else "")


def appliable(s: dict[str, Any]) -> bool:
    """Whether ``dpro record --apply`` sets the whole of line ``s`` (no change by hand)."""
    return bool(s["apply"]) and not s["code_change"]


def apply_command(data: dict[str, Any], folder: str) -> str:
    """The command that runs the job with the recommendation applied, the script unchanged
    (quoted for a POSIX shell)."""
    job = shlex.join(data["command"]) if data.get("command") else "torchrun ..."
    return f"dpro record --apply {shlex.quote(f'{folder}/strategy.json')} -- {job}"


def keep_hint(data: dict[str, Any]) -> str:
    """What to do when the answer is to keep the job: measure the best candidates, unless the
    trials just did."""
    if "trials" in data:
        return "The trials measured the best candidates: none was faster."
    job = shlex.join(data["command"]) if data.get("command") else "torchrun ..."
    return f"`dpro optimize RUN --trial -- {job}` measures the best candidates."


def headline(data: dict[str, Any]) -> tuple[str, str]:
    """The answer in two sentences: ``(what to do, what it is predicted and measured to give)``."""
    verdict, best, baseline = data["recommendation"], data["strategies"][0], data["baseline_step_ms"]
    if verdict["verdict"] != "change":
        return ("Keep the job as it is", f"{verdict['why'][:1].upper()}{verdict['why'][1:]}. Its step is "
                f"{baseline:.1f} ms (measured: the median step outside the profiling window).")
    interval = "" if best["interval_ms"] is None else \
        f" (90% interval {best['interval_ms'][0]:.1f}-{best['interval_ms'][1]:.1f} ms)"
    measured = "" if best.get("measured_ms") is None else f"; measured {best['measured_ms']:.1f} ms in trials"
    exact = ("Lossy: the gradients are compressed, the numerics change." if best["lossy"]
             else "Exact: the numerics do not change.")
    return (f"Recommended: {best['name']}",
            f"Predicted {best['predicted_step_ms']:.1f} ms per step{interval} against the measured {baseline:.1f} ms: "
            f"{speedups(best)}{measured}. {exact}")


def breakdown_rows(data: dict[str, Any]) -> list[list[str]]:
    """The critical path's split (ms) as recorded and under each line it was drawn for:
    ``[label, span, compute, ...]``."""
    return [[name if name == "as-recorded" else f"{name} (predicted)", f"{b['span']:.1f}",
             *(f"{b[c]:.1f}" for c in CATEGORIES)] for name, b in data.get("breakdowns", {}).items()]
