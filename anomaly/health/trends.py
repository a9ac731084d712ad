"""Trends across nights: for the newest run in the history, each host's comparable metrics
against the baseline learned from the earlier runs (:func:`dpro.anomaly.health.rules.learned`),
regressions flagged as the rules would flag them: the rules given, else those the newest run was
judged by (stored with it), so that the history agrees with the nightly job's verdicts: a host's
pairwise rates beyond the newest night's common change, as the nightly job judged them."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from dpro.anomaly.health.config import Rules
from dpro.anomaly.health.history import History
from dpro.anomaly.health.model import Metric
from dpro.anomaly.health.rules import common_changes, judge, learned

__all__ = ["beyond", "newest_trends", "rules_of", "trends"]


def rules_of(run: dict[str, Any]) -> Rules:
    """The rules a run (as :meth:`History.runs` gives it) was judged by; the defaults for a run
    stored without them."""
    stored = run["facts"].get("rules", {})
    return Rules(**{f.name: stored[f.name] for f in fields(Rules) if f.name in stored})


def newest_trends(history: History, rules: Rules | None = None, shown: int = 1,
                  host: str | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The newest runs of ``history`` (at least ``shown``, and as many as the rules' baseline
    needs), newest first, and their :func:`trends` by ``rules`` (default: the newest run's)."""
    newest = history.runs(1)
    rules = rules or (rules_of(newest[0]) if newest else Rules())
    runs = history.runs(max(shown, rules.nights + 1))
    return runs, trends(runs, rules, host)


def trends(runs: list[dict[str, Any]], rules: Rules | None = None, host: str | None = None,
           beyond_common: bool = True) -> dict[str, Any]:
    """``{"runs": [{id, started, verdict}] oldest first, "nodes": {host: {key: {"values",
    "baseline", "worse_pct", "common_change_pct", "status"}}}, "regressions": [...]}`` (``worse_pct``
    with the common change taken out, None where none was) from :meth:`History.runs`
    (newest first), judged by ``rules`` (default: the newest run's); ``beyond_common=False``: each
    host against its own baseline alone, the rule before, for comparison."""
    out: dict[str, Any] = {"runs": [{k: r[k] for k in ("id", "started", "verdict")} for r in reversed(runs)],
                           "nodes": {}, "regressions": []}
    if not runs:
        return out
    rules = rules or rules_of(runs[0])
    newest, earlier = runs[0], runs[1:]
    pasts = {(name, key): [r["nodes"][name]["metrics"][key] for r in earlier
                           if name in r["nodes"] and key in r["nodes"][name]["metrics"]][:rules.nights]
             for name, node in newest["nodes"].items() for key in node["comparable"]}
    baselines = {at: learned(past, rules) for at, past in pasts.items()}
    measured = {(name, key): Metric(key, node["metrics"][key], "", higher)
                for name, node in newest["nodes"].items() for key, higher in node["comparable"].items()}
    common = common_changes(((name, key, measured[name, key], b) for (name, key), b in baselines.items() if b is not None),
                            {s.get("host") for s in newest["suspects"] if s["kind"] in ("host", "nic")}
                            ) if beyond_common else {}
    for name, node in sorted(newest["nodes"].items()):
        if host is not None and name != host:
            continue
        rows = {}
        for key in sorted(node["comparable"]):
            past = pasts[name, key]
            value = node["metrics"][key]
            baseline = baselines[name, key]
            row: dict[str, Any] = {"values": [*reversed(past), value], "baseline": None, "worse_pct": None,
                                   "status": "no baseline"}
            if baseline is not None:
                shared = common.get((name, key), 1.0)
                status, worse = judge(measured[name, key], baseline, rules, shared)
                taken = {"common_change_pct": round((shared - 1) * 100, 1) if shared < 1.0 else None}
                row.update(baseline=round(baseline.value, 4), worse_pct=round(worse * 100, 1), **taken,
                           status={"pass": "ok", "warn": "regression", "fail": "regression (severe)"}[status])
                if status != "pass":
                    out["regressions"].append({"host": name, "metric": key, "value": value,
                                               "baseline": round(baseline.value, 4), "worse_pct": round(worse * 100, 1),
                                               **taken, "run": newest["id"]})
            rows[key] = row
        out["nodes"][name] = rows
    return out


def beyond(row: dict[str, Any]) -> str:
    """What a trend row's (or regression's) ``worse_pct`` left out, said: the unsuspected hosts'
    common change, if any."""
    common = row.get("common_change_pct")
    return "" if common is None else f" beyond the hosts' common {common:+.1f}%"
