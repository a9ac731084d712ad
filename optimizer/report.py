"""The search's report: JSON for tools, Markdown and HTML for people, one strategy file per strategy."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dpro.analysis.run import RunAnalysis
from dpro.run_format import write_json_atomic

from dpro.optimizer.report_html import write_html
from dpro.optimizer.search import SearchResult

__all__ = ["report", "write_report"]


def report(result: SearchResult) -> dict[str, Any]:
    """``{"baseline_step_ms", "strategies": [{"name", "passes", "lossy", "predicted_step_ms",
    "predicted_speedup", "memory_gb", "change", "apply"}...], "notes", "search"}``, best first.
    ``change``: the code change; ``apply``: the settings ``dpro record --apply`` sets;
    ``memory_gb``: the strategy's memory estimate on its largest rank (GB, 1e9 bytes; null where
    the run did not measure memory, :mod:`dpro.optimizer.memory`)."""
    baseline = result.baseline_step_ms
    strategies = []
    for e in result.evaluated:
        s = e.strategy
        strategies.append({"name": s.name, "passes": list(s.passes), "lossy": s.lossy,
                           "predicted_step_ms": e.predicted_step_ms, "predicted_speedup": baseline / e.predicted_step_ms,
                           "memory_gb": None if e.memory_bytes is None else e.memory_bytes / 1e9,
                           "change": s.code(), "apply": dict(s.settings),
                           "prediction": {k: e.prediction.get(k) for k in ("replayed_step_ms", "unanchored_step_ms",
                                                                           "link_model", "buckets_bytes", "compression")
                                          if k in e.prediction}})
    return {"baseline_step_ms": baseline, "strategies": strategies, "notes": list(result.notes),
            "search": {"space": result.space, "evaluated": result.tried, "elapsed_s": result.elapsed_s,
                       "exhaustive": result.exhaustive,
                       "exposed_communication_ms": result.exposed_communication_ms,
                       "memory_budget_gb": None if result.memory_budget_bytes is None else result.memory_budget_bytes / 1e9,
                       "over_memory_budget": result.over_memory_budget,
                       "tricks": asdict(result.tricks)}}


def write_report(data: dict[str, Any], out: Path, analysis: RunAnalysis) -> None:
    """``report.json``, ``report.md``, ``report.html`` (:mod:`dpro.optimizer.report_html`),
    ``strategy.json`` (the best) and ``strategies/<name>.json``."""
    (out / "strategies").mkdir(parents=True, exist_ok=True)
    for stale in (out / "strategies").glob("*.json"):  # a report replaced (--force) leaves none of its own
        stale.unlink()
    write_json_atomic(out / "report.json", data)
    for s in data["strategies"]:
        write_json_atomic(out / "strategies" / f"{s['name']}.json", _strategy_file(s, data))
    write_json_atomic(out / "strategy.json", _strategy_file(data["strategies"][0], data))
    (out / "report.md").write_text(_markdown(data))
    write_html(analysis, data, out / "report.html")


def _strategy_file(s: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """What ``dpro record --apply`` reads (``settings``) and ``dpro compare`` checks against."""
    return {"name": s["name"], "passes": s["passes"], "lossy": s["lossy"], "settings": s["apply"], "code": s["change"],
            "baseline_step_ms": data["baseline_step_ms"], "predicted_step_ms": s["predicted_step_ms"]}


def _gb(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"


def _markdown(data: dict[str, Any]) -> str:
    lines = ["# dpro optimize", "",
             f"Baseline: {data['baseline_step_ms']:.1f} ms per step (the median step outside the profiling window).", "",
             "| strategy | predicted ms | speed-up | memory GB | lossy | passes |", "|---|---|---|---|---|---|"]
    for s in data["strategies"]:
        lines.append(f"| {s['name']} | {s['predicted_step_ms']:.1f} | {s['predicted_speedup']:.2f}x | "
                     f"{_gb(s['memory_gb'])} | {'yes' if s['lossy'] else ''} | {'+'.join(s['passes']) or '-'} |")
    best = data["strategies"][0]
    lines += ["", f"## Best: {best['name']}", ""]
    lines += ["```python", *best["change"], "```"] if best["change"] else ["No change predicts a faster step."]
    lines += ["", f"Apply it without editing the script: `dpro record --apply strategy.json -- torchrun ...`.", ""]
    if data["notes"]:
        lines += ["## Notes", "", *(f"- {n}" for n in data["notes"]), ""]
    search = data["search"]
    lines.append(f"Search: {search['evaluated']} of {search['space']} strategies in {search['elapsed_s']:.1f} s"
                 + ("." if search["exhaustive"] else " (the budget ran out)."))
    return "\n".join(lines) + "\n"
