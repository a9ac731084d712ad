"""Trends across nights: for the newest run in the history, each host's comparable metrics
against the baseline learned from the earlier runs (:func:`dpro.anomaly.health.rules.learned`),
regressions flagged as the rules would flag them."""

from __future__ import annotations

from typing import Any

from dpro.anomaly.health.config import Rules
from dpro.anomaly.health.model import Metric
from dpro.anomaly.health.rules import judge, learned

__all__ = ["trends"]


def trends(runs: list[dict[str, Any]], rules: Rules, host: str | None = None) -> dict[str, Any]:
    """``{"runs": [{id, started, verdict}] oldest first, "nodes": {host: {key: {"values",
    "baseline", "worse_pct", "status"}}}, "regressions": [...]}`` from :meth:`History.runs`
    (newest first)."""
    out: dict[str, Any] = {"runs": [{k: r[k] for k in ("id", "started", "verdict")} for r in reversed(runs)],
                           "nodes": {}, "regressions": []}
    if not runs:
        return out
    newest, earlier = runs[0], runs[1:]
    for name, node in sorted(newest["nodes"].items()):
        if host is not None and name != host:
            continue
        rows = {}
        for key, higher in sorted(node["comparable"].items()):
            past = [r["nodes"][name]["metrics"][key] for r in earlier
                    if name in r["nodes"] and key in r["nodes"][name]["metrics"]]
            value = node["metrics"][key]
            baseline = learned(past, rules)
            row: dict[str, Any] = {"values": [*reversed(past), value], "baseline": None, "worse_pct": None,
                                   "status": "no baseline"}
            if baseline is not None:
                status, worse = judge(Metric(key, value, "", higher), baseline, rules)
                row.update(baseline=round(baseline.value, 4), worse_pct=round(worse * 100, 1),
                           status={"pass": "ok", "warn": "regression", "fail": "regression (severe)"}[status])
                if status != "pass":
                    out["regressions"].append({"host": name, "metric": key, "value": value,
                                               "baseline": round(baseline.value, 4), "worse_pct": round(worse * 100, 1),
                                               "run": newest["id"]})
            rows[key] = row
        out["nodes"][name] = rows
    return out
