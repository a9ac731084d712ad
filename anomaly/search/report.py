"""The report of an anomaly search (:mod:`dpro.anomaly.search.collie`): JSON for tools, Markdown for people.

Both list the anomalies first (each with its minimal feature set and the measurements that show
which features are needed), then every trial. ``write_report`` puts ``search.json`` and
``search.md`` in a directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpro.anomaly.engines.base import Workload
from dpro.anomaly.search.collie import Anomaly, SearchResult, Trial
from dpro.anomaly.search.space import plain


def to_json(result: SearchResult) -> dict[str, Any]:
    """The whole search, JSON-ready."""
    return {"engine": result.engine, "objective": result.objective.describe(), "seed": result.seed,
            "budget": {"max_trials": result.budget.max_trials, "max_seconds": result.budget.max_seconds},
            "stopped": result.stopped, "elapsed_s": round(result.elapsed_s, 3), "space": result.space.to_dict(),
            "anomalies": [_anomaly(result, a) for a in result.anomalies],
            "unconfirmed": [{"trial": t, "remeasured": again} for t, again in result.unconfirmed],
            "trials": [_trial(result, t) for t in result.trials], "notes": result.notes}


def _changes(result: SearchResult, workload: Workload) -> dict[str, Any]:
    return {n: plain(v) for n, v in result.space.differences(workload).items()}


def _trial(result: SearchResult, t: Trial) -> dict[str, Any]:
    r = t.result
    counters = {role: {f"{c.device}:{c.canonical or c.name}": c.per_s for c in d.rates if c.per_s}
                for role, d in r.counters.items()}
    return {"index": t.index, "kind": t.kind, "changed": _changes(result, t.workload), "score": t.score,
            "anomalous": t.anomalous, "accepted": t.accepted, "temperature": t.temperature,
            "seconds": round(t.seconds, 3), "throughput_gbps": r.throughput_gbps, "msgs_per_s": r.msgs_per_s,
            "latency_us": r.latency_us, "counters": counters, "errors": r.errors, "notes": r.notes,
            "workload": t.workload.to_dict()}


def _anomaly(result: SearchResult, a: Anomaly) -> dict[str, Any]:
    return {"trial": a.trial, "confirm": a.confirm, "score": result.trials[a.trial].score,
            "confirm_score": result.trials[a.confirm].score,
            "minimal_features": {n: plain(v) for n, v in a.minimal.items()}, "complete": a.complete,
            "found": _changes(result, a.found), "workload": a.workload.to_dict(),
            "resets": [{"feature": r.feature, "value": plain(r.value), "trial": r.trial, "score": r.score,
                        "needed": r.needed, "why": r.why} for r in a.resets]}


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}"


def _features(values: dict[str, Any]) -> str:
    return ", ".join(f"{n}={plain(v)}" for n, v in values.items()) or "(baseline)"


def to_markdown(result: SearchResult) -> str:
    """A readable summary: the anomalies with their evidence, then a table of every trial."""
    objective = result.objective.describe()
    budget = ", ".join(part for part in (
        f"{result.budget.max_trials} trials" if result.budget.max_trials else "",
        f"{result.budget.max_seconds:g} s" if result.budget.max_seconds else "") if part)
    lines = [f"# Anomaly search: {result.engine} engine, objective {objective['name']} "
             f"(anomalous {'below' if objective['name'] == 'throughput' else 'above'} {objective['threshold']:g})", "",
             f"Seed {result.seed}; {len(result.trials)} trials in {result.elapsed_s:.1f} s (budget: {budget}); "
             f"stopped: {result.stopped}.", "",
             f"Baseline: {_features(result.space.values(result.space.baseline))}.", ""]
    if objective["name"] == "throughput":
        lines += ["Score: throughput per sending direction as a fraction of " +
                  (f"the link rate, {objective['link_gbps']:g} Gbit/s." if objective["link_gbps"]
                   else "the best measured at the same message size."), ""]
    else:
        lines += [f"Score: {objective['counter']} per second, both endpoints together.", ""]
    lines += [f"## Anomalies ({len(result.anomalies)})", ""]
    if not result.anomalies:
        lines += ["None found.", ""]
    for i, a in enumerate(result.anomalies, 1):
        lines += [f"### {i}. {_features(a.minimal)}", "",
                  f"Found by trial {a.trial} (score {_fmt(result.trials[a.trial].score)}: "
                  f"{_features(result.space.differences(a.found))}), confirmed by trial {a.confirm} "
                  f"(score {_fmt(result.trials[a.confirm].score)}). Minimal feature set: "
                  f"**{_features(a.minimal)}**" + ("" if a.complete else
                                                   " (incomplete: the budget ran out before every feature was tried)")
                  + ".", "",
                  "| feature reset | to | trial | score | verdict |", "|---|---|---|---|---|"]
        for r in a.resets:
            verdict = "needed" if r.needed else "not needed"
            trial = "–" if r.trial is None else r.trial
            lines.append(f"| {r.feature} | {plain(r.value)} | {trial} | {_fmt(r.score)} | "
                         f"{verdict}{': ' + r.why if r.why else ''} |")
        lines.append("")
    if result.unconfirmed:
        lines += ["## Not confirmed", ""]
        for t, again in result.unconfirmed:
            lines.append(f"- trial {t} (score {_fmt(result.trials[t].score)}): " +
                         ("no budget left to measure it again" if again is None
                          else f"trial {again} measured it again: score {_fmt(result.trials[again].score)}"))
        lines.append("")
    lines += ["## Trials", "", "| # | kind | workload (vs baseline) | score | Gbit/s | p99 µs | accepted | errors |",
              "|---|---|---|---|---|---|---|---|"]
    for t in result.trials:
        accepted = "" if t.accepted is None else ("yes" if t.accepted else "no")
        errors = "; ".join(t.result.errors).replace("|", "\\|")
        lines.append(f"| {t.index} | {t.kind}{' **anomalous**' if t.anomalous else ''} | "
                     f"{_features(result.space.differences(t.workload))} | {_fmt(t.score)} | "
                     f"{_fmt(t.result.throughput_gbps)} | {_fmt(t.result.latency_us.get('p99'))} | {accepted} | "
                     f"{errors} |")
    if result.notes:
        lines += ["", "## Notes", "", *[f"- {note}" for note in result.notes]]
    return "\n".join(lines) + "\n"


def write_report(result: SearchResult, out_dir: str | Path) -> dict[str, Path]:
    """Write ``search.json`` and ``search.md`` into ``out_dir`` (created if needed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "search.json", "markdown": out / "search.md"}
    paths["json"].write_text(json.dumps(to_json(result), indent=1) + "\n")
    paths["markdown"].write_text(to_markdown(result))
    return paths
