"""The search's report: JSON for tools, Markdown and HTML for people, one strategy file per strategy.

Every report leads with the answer: the recommended change (or "keep the job as it is"), its
predicted step with its interval beside the measured one, lossy or exact, why, and how to apply
it; then the measured trials, the :data:`TOP` distinct strategies (equivalents folded), where
the step's time goes before and after, the code changes and the notes. ``report.json`` holds
every strategy; ``report.md`` lists them all with ``--all``."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from dpro.analysis.run import RunAnalysis
from dpro.replayer.breakdown import CATEGORIES, mean_breakdown
from dpro.run_format import write_json_atomic

from dpro.optimizer.report_html import write_html
from dpro.optimizer.report_text import (APART, SHOWN, TOP, apply_command, appliable, breakdown_rows, folded, headline,
                                        keep_hint, speedups)
from dpro.optimizer.search import Evaluated, SearchResult
from dpro.optimizer.trials import Trial, best
from dpro.optimizer.uncertainty import interval, intervals_source

__all__ = ["candidates", "lines", "markdown", "report", "with_breakdowns", "with_trials", "write_report"]

EQUAL = 1e-6  # predictions this close are the same prediction


def report(result: SearchResult, command: list[str] | None = None) -> dict[str, Any]:
    """``{"baseline_step_ms", "recommendation", "strategies", "code_changes", "notes", "search",
    "intervals", "command"}`` (:func:`with_breakdowns` adds where the step goes).

    ``strategies``: the lines ``dpro record --apply`` can set whole and whose family is scored,
    the recommendation first (:func:`lines`); ``code_changes``: the strategies that need the
    script changed by hand or that no held-out case has scored, listed apart and never
    recommended. Each line: ``name``, ``passes``, ``lossy``, ``predicted_step_ms``,
    ``predicted_speedup``, ``interval_ms`` (the measured step the prediction stands for, 90% on
    held-out cases; null where unscored), ``speedup_interval``, ``status`` (``recommended``,
    ``proven``, ``as recorded``, ``unproven``, ``slower``, ``unscored``), ``equivalents`` (the
    strategies it stands for), ``memory_gb`` (the largest rank's estimate, GB; null where the run
    did not measure memory), ``change`` (the code change), ``apply`` (the settings ``dpro record
    --apply`` sets) and what the cost model found (``prediction``); ``command``: the recorded
    job's command, which ``--apply`` reruns."""
    baseline = result.baseline_step_ms
    entries = [_entry(e, baseline) for e in result.evaluated]
    ranked = lines([x for x in entries if not x["code_change"] and x["interval_ms"] is not None])
    apart = lines([x for x in entries if x["code_change"] or x["interval_ms"] is None])
    best = ranked[0] if ranked else None
    if not any(e is result.recorded for e in result.evaluated):  # over the memory budget
        # the best scored strategy that fits; with none, of those that fit, one --apply can set before a
        # code change, then the fewest changes (passes: their predictions have no interval to rank them
        # by), the best predicted of those
        best = ranked[0] if ranked else min(apart, key=lambda x: (x["code_change"], len(x["passes"]),
                                                                  x["predicted_step_ms"]))
        best["status"] = "recommended"
        verdict = {"verdict": "change", "name": best["name"],
                   "why": "the recorded configuration needs more memory than the budget: "
                          + ("the best predicted that fits" if ranked else "the smallest change that fits, "
                             "--apply's first, the best predicted of those (unscored: no interval)")}
        ranked = [best] + [x for x in ranked if x is not best]
        apart = [x for x in apart if x is not best]
    elif best is not None and best["status"] == "proven":
        best["status"] = "recommended"
        verdict = {"verdict": "change", "name": best["name"],
                   "why": f"predicted {best['predicted_speedup']:.2f}x, at least {best['speedup_interval'][0]:.2f}x "
                          "on 90% of held-out cases"}
    else:
        unproven = [x["name"] for x in ranked if x["status"] == "unproven"]
        verdict = {"verdict": "keep", "name": "as-recorded",
                   "why": "no change's predicted gain clears its uncertainty" + (
                       f" (best unproven: {', '.join(unproven[:3])})" if unproven else "")}
    return {"baseline_step_ms": baseline, "recommendation": verdict, "strategies": ranked, "code_changes": apart,
            "notes": list(result.notes), "intervals": intervals_source(), "command": command,
            "search": {"space": result.space, "evaluated": result.tried, "elapsed_s": result.elapsed_s,
                       "exhaustive": result.exhaustive,
                       "exposed_communication_ms": result.exposed_communication_ms,
                       "memory_budget_gb": None if result.memory_budget_bytes is None else result.memory_budget_bytes / 1e9,
                       "over_memory_budget": result.over_memory_budget,
                       "tricks": asdict(result.tricks)}}


def with_breakdowns(data: dict[str, Any], result: SearchResult) -> dict[str, Any]:
    """``data`` with ``breakdowns``: where the step's time goes on the critical path (ms, mean
    over ranks, :mod:`dpro.replayer.breakdown`) as recorded and under the report's first
    :data:`~dpro.optimizer.report_text.SHOWN` lines that change the job, by name, from the
    search's own predictions (nothing is predicted again)."""
    replayed = {e.strategy.name: e.replayed for e in result.evaluated}
    recorded = result.recorded.replayed if result.recorded is not None else replayed["as-recorded"]
    lines = [x["name"] for x in data["strategies"] + data["code_changes"] if x["apply"]][:SHOWN]
    shown = [("as-recorded", recorded)] + [(name, replayed[name]) for name in lines]
    return {**data, "breakdowns": {name: {k: round(v, 4) for k, v in mean_breakdown(p.graph, p.replay).items()}
                                   for name, p in shown}}


def candidates(data: dict[str, Any], count: int) -> list[tuple[str, dict[str, Any], float]]:
    """The ``count`` strategies to measure, ``(name, settings, predicted ms)``: the lines that
    change the job in the report's order, then the strategies they stand for (which the cost
    model could not tell apart), the best predicted first."""
    found = [(s["name"], s["apply"], s["predicted_step_ms"]) for s in data["strategies"] if s["apply"]]
    found += sorted(((e["name"], e["apply"], e["predicted_step_ms"]) for s in data["strategies"]
                     for e in s["equivalent_strategies"]), key=lambda e: e[2])
    return found[:count]


def with_trials(data: dict[str, Any], trials: list[Trial], steps: int, rounds: int) -> dict[str, Any]:
    """``data`` with the measured trials (``trials[0]``: the job as it is) and the measured best
    recommended in place of the predicted best: its line first, ``strategy.json``'s."""
    baseline = trials[0].median_ms
    winner = best(trials)
    found = {x["name"]: x for x in data["strategies"]}
    measured = {t.name for t in trials}
    for line in data["strategies"]:  # a measured equivalent is a line of its own from now on, with its own figures
        for e in line["equivalent_strategies"]:
            if e["name"] in measured:
                found[e["name"]] = {**e, "equivalents": [], "equivalent_strategies": []}
    for t in trials:
        if t.name in found:
            found[t.name]["measured_ms"] = t.median_ms
    if winner is None or winner is trials[0] or baseline is None:
        verdict = {"verdict": "keep", "name": "as-recorded", "by": "trials",
                   "why": "no trial measured a step (see the trials)" if winner is None else
                          "the job as it is measured no step: nothing to compare with" if baseline is None else
                          "no candidate measured faster than the job as it is"}
    else:
        verdict = {"verdict": "change", "name": winner.name, "by": "trials",
                   "why": f"measured {baseline / winner.median_ms:.2f}x faster than the job as it is "
                          f"({winner.median_ms:.1f} against {baseline:.1f} ms, medians of {len(winner.measured_ms)} "
                          f"interleaved trials; predicted {data['baseline_step_ms'] / winner.predicted_step_ms:.2f}x)"}
    chosen = found.get(verdict["name"])  # none: the job as it is, over a memory budget (no line of its own)
    strategies = data["strategies"]
    if chosen is not None:
        for x in strategies:
            if x["status"] == "recommended":
                x["status"] = "proven"
        chosen["status"] = "recommended" if verdict["verdict"] == "change" else "as recorded"
        strategies = [chosen] + [x for x in strategies if x["name"] != chosen["name"]]
        for line in strategies[1:]:  # the chosen equivalent stands for itself now, no longer in its line's count
            line["equivalents"] = [n for n in line["equivalents"] if n != chosen["name"]]
            line["equivalent_strategies"] = [e for e in line["equivalent_strategies"] if e["name"] != chosen["name"]]
    return {**data, "recommendation": verdict, "strategies": strategies,
            "trials": {"steps": steps, "rounds": rounds, "results": [t.as_dict(baseline) for t in trials]}}


def _entry(e: Evaluated, baseline: float) -> dict[str, Any]:
    s, predicted = e.strategy, e.predicted_step_ms
    found = interval(s, predicted)
    if found is None:
        status = "unscored"
    elif not s.settings:
        status = "as recorded"
    elif found.proves_faster_than(baseline):
        status = "proven"
    else:
        status = "unproven" if predicted < baseline else "slower"
    return {"name": s.name, "passes": list(s.passes), "lossy": s.lossy, "code_change": s.code_change,
            "predicted_step_ms": predicted, "predicted_speedup": baseline / predicted,
            "interval_ms": None if found is None else [found.low_ms, found.high_ms],
            "speedup_interval": None if found is None else [baseline / found.high_ms, baseline / found.low_ms],
            "families": None if found is None else list(found.families), "status": status, "equivalents": [],
            "equivalent_strategies": [],
            "memory_gb": None if e.memory_bytes is None else e.memory_bytes / 1e9,
            "change": s.code(), "apply": dict(s.settings),
            "prediction": {k: e.prediction.get(k) for k in ("replayed_step_ms", "unanchored_step_ms", "link_model",
                                                            "buckets_bytes", "compression") if k in e.prediction}}


def lines(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``entries`` with equivalents collapsed, in the order a user reads them: proven lines
    (best predicted first), the recorded configuration, then the rest best predicted first.

    Strategies of the same lossiness whose predictions differ by less than half of either's
    interval (equal, where unscored) are one line: the cheapest change (fewest settings, then the best
    predicted) stands for them, the others named in its ``equivalents``."""
    left = sorted(entries, key=lambda x: x["predicted_step_ms"])
    out = []
    while left:
        head = left[0]
        group = [head] + [x for x in left[1:] if x["lossy"] == head["lossy"] and _within(x, head) and _within(head, x)]
        line = min(group, key=lambda x: (len(x["apply"]), x["predicted_step_ms"]))
        line["equivalents"] = [x["name"] for x in group if x is not line]
        line["equivalent_strategies"] = [{k: v for k, v in x.items() if k not in ("equivalents", "equivalent_strategies")}
                                         for x in group if x is not line]
        out.append(line)
        left = [x for x in left if not any(x is g for g in group)]
    rank = {"proven": 0, "as recorded": 1}
    return sorted(out, key=lambda x: (rank.get(x["status"], 2), x["predicted_step_ms"]))


def _within(x: dict[str, Any], y: dict[str, Any]) -> bool:
    """Whether ``x``'s prediction differs from ``y``'s by no more than half of ``y``'s interval
    (relative; where ``y`` is unscored or has no interval, whether they are equal)."""
    width = 0.0 if y["interval_ms"] is None else (y["interval_ms"][1] - y["interval_ms"][0]) / y["predicted_step_ms"]
    return abs(x["predicted_step_ms"] / y["predicted_step_ms"] - 1) <= width / 2 + EQUAL


def write_report(data: dict[str, Any], result: SearchResult, out: Path, analysis: RunAnalysis,
                 every: bool = False) -> None:
    """``report.json``, ``report.md`` (``every``: listing every strategy), ``report.html``
    (:mod:`dpro.optimizer.report_html`, drawn from ``result``'s own predictions; plotly.js
    beside it), ``strategy.json`` (the recommendation) and ``strategies/<name>.json`` (every
    line)."""
    (out / "strategies").mkdir(parents=True, exist_ok=True)
    for stale in (out / "strategies").glob("*.json"):  # a report replaced (--force) leaves none of its own
        stale.unlink()
    write_json_atomic(out / "report.json", data)
    for s in data["strategies"] + data["code_changes"]:
        write_json_atomic(out / "strategies" / f"{s['name']}.json", _strategy_file(s, data))
    write_json_atomic(out / "strategy.json", _strategy_file(data["strategies"][0], data))
    (out / "report.md").write_text(markdown(data, every, str(out)))
    replayed = {e.strategy.name: e.replayed for e in result.evaluated}
    recorded = result.recorded.replayed if result.recorded is not None else replayed["as-recorded"]
    write_html(analysis, data, recorded, replayed, out / "report.html")


def _strategy_file(s: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """What ``dpro record --apply`` reads (``settings``) and ``dpro compare`` checks against."""
    return {"name": s["name"], "passes": s["passes"], "lossy": s["lossy"], "settings": s["apply"], "code": s["change"],
            "baseline_step_ms": data["baseline_step_ms"], "predicted_step_ms": s["predicted_step_ms"],
            "interval_ms": s["interval_ms"], "status": s["status"]}


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _gb(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"


def _rows(entries: list[dict[str, Any]]) -> list[str]:
    rows = ["| # | strategy | predicted ms | speed-up (90% interval) | status | memory GB | lossy | stands for |",
            "|---|---|---|---|---|---|---|---|"]
    return rows + [f"| {i} | {s['name']} | {s['predicted_step_ms']:.1f} | {speedups(s)} | {s['status']} | "
                   f"{_gb(s['memory_gb'])} | {'yes' if s['lossy'] else ''} | {folded(s)} |"
                   for i, s in enumerate(entries, 1)]


def markdown(data: dict[str, Any], every: bool = False, folder: str = "DIR") -> str:
    """``report.md``: the answer first (:func:`headline`), then the trials, the :data:`TOP`
    distinct strategies (``every``: all of them), where the step goes, the code changes and
    the notes."""
    verdict, best = data["recommendation"], data["strategies"][0]
    title, detail = headline(data)
    out = ["# dpro optimize", "", f"**{title}.** {detail}", ""]
    if verdict["verdict"] == "change":
        out += [f"Why: {verdict['why']}.", ""]
        if appliable(best):
            out += ["Apply it without editing the script:", "", "```sh", apply_command(data, folder), "```", "",
                    "or change the script:", ""]
        out += ["```python", *best["change"], "```", ""]
    else:
        out += [keep_hint(data), ""]
    if "trials" in data:
        t = data["trials"]
        out += [f"## Measured trials ({t['steps']} steps each, {t['rounds']} interleaved rounds)", "",
                "| strategy | predicted ms | measured ms (median) | measured speed-up | rounds | note |",
                "|---|---|---|---|---|---|"]
        for r in t["results"]:
            out.append(f"| {r['name']} | {_ms(r['predicted_step_ms'])} | {_ms(r['median_ms'])} | "
                       f"{'' if r['measured_speedup'] is None else format(r['measured_speedup'], '.2f') + 'x'} | "
                       f"{' '.join(f'{m:.1f}' for m in r['measured_ms'])} | "
                       f"{'; '.join(([r['failed']] if r['failed'] else []) + r['left_out'])} |")
        out.append("")
    lines = data["strategies"]
    shown = lines if every else lines[:TOP]
    folded_count = sum(len(s["equivalents"]) for s in lines)
    out += [f"## Strategies ({len(lines)} distinct; {folded_count} more fold into them, equal within their intervals)",
            "", f"Baseline: {data['baseline_step_ms']:.1f} ms per step (the median step outside the profiling window). "
            f"Intervals: 90% of the cost model's held-out errors per family of change (model {data['intervals']['model']}, "
            f"fidelity scoring seed {data['intervals']['seed']}).", "", *_rows(shown), ""]
    if len(shown) < len(lines):
        out += [f"{len(lines) - len(shown)} more in report.json (`dpro optimize --all` lists them here).", ""]
    rows = breakdown_rows(data)
    if rows:
        out += ["## Where the step goes (critical path, ms, mean over ranks)", "",
                "| | span | " + " | ".join(c.replace("_", "-") for c in CATEGORIES) + " |",
                "|---|" + "---|" * (len(CATEGORIES) + 1), *(f"| {' | '.join(r)} |" for r in rows), ""]
    apart = data["code_changes"]
    if apart:
        listed = apart if every else apart[:APART]
        out += ["## Code changes (never recommended: `--apply` cannot set them, or no held-out case scored them)", "",
                *_rows(listed), ""]
        if len(listed) < len(apart):
            out += [f"{len(apart) - len(listed)} more in report.json.", ""]
    if data["notes"]:
        out += ["## Notes", "", *(f"- {n}" for n in data["notes"]), ""]
    search = data["search"]
    out.append(f"Search: {search['evaluated']} of {search['space']} strategies in {search['elapsed_s']:.1f} s"
               + ("." if search["exhaustive"] else " (the budget ran out)."))
    return "\n".join(out) + "\n"
