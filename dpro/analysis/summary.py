"""What a run directory or a single trace holds: ranks, hosts, steps, step-time statistics, events."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpro.analysis.run import RunAnalysis
from dpro.analysis.window import window_check
from dpro.graph.kineto import TraceFormatError, load_trace
from dpro.run_format import is_run_dir


def step_stats_ms(durations_ns: pd.Series) -> dict[str, float | int | None]:
    """Median, p90, mean, min and max of step durations, in milliseconds, and their count."""
    d = pd.to_numeric(durations_ns, errors="coerce").dropna().to_numpy(dtype="float64") / 1e6
    if d.size == 0:
        return {"n": 0, "median": None, "p90": None, "mean": None, "min": None, "max": None}
    return {"n": int(d.size), "median": float(np.median(d)), "p90": float(np.percentile(d, 90)),
            "mean": float(d.mean()), "min": float(d.min()), "max": float(d.max())}


def summarize_run(analysis: RunAnalysis, count_events: bool = True) -> dict[str, Any]:
    """Per-rank step-time statistics and what each rank wrote.

    ``step_ms`` is computed over the steps outside the profiling window (and after step 0,
    whose start is unknown); ``profiled_step_ms`` over the profiled steps; ``window``: whether the
    profiling window ran like the other steps (:func:`~dpro.analysis.window.window_check`; None
    without ``count_events``, which reads no trace); ``trace_error``: why the rank's trace cannot
    be decoded (None where it can, or was not read).
    """
    run = analysis.run
    per_rank = []
    events_per_step: dict[int, float] = {}  # profiler events per profiled step, for the window check
    for rank in analysis.ranks:
        meta = analysis.metas[rank]
        steps = analysis.steps(rank)
        timed = steps.dropna(subset=["dur_ns"])
        trace = run.trace_path(rank)
        events, trace_error = None, None
        if count_events and trace:
            try:
                events = analysis.tables(rank).events
            except TraceFormatError as e:
                trace_error = str(e)
        if events is not None and len(events):
            events_per_step[rank] = float(events.groupby("step").size().median())
        per_rank.append({
            "rank": rank,
            "host": meta.host or None,
            "steps": len(steps),
            "steps_timed": len(timed),
            "step_ms": step_stats_ms(timed.loc[timed["phase"] == "", "dur_ns"]),
            "profiled_step_ms": step_stats_ms(timed.loc[timed["phase"] == "profiled", "dur_ns"]),
            "profiled_steps": timed.loc[timed["phase"] == "profiled", "step"].tolist(),
            "trace": str(trace.relative_to(run.root)) if trace else None,
            "events": None if events is None else len(events),
            "trace_error": trace_error,
            "no_trace": None if trace else run.why_no_trace(rank),
            "errors": run.error_count(rank),
        })
    medians = {r["rank"]: r["step_ms"]["median"] for r in per_rank if r["step_ms"]["median"] is not None}
    hosts = sorted({r["host"] for r in per_rank if r["host"]} | {n.get("host") for n in run.nodes()} - {None})
    return {
        "path": str(run.root),
        "kind": "run",
        "format_version": run.manifest.get("format_version"),
        "ranks": [r["rank"] for r in per_rank],
        "hosts": hosts,
        "world_size": next((m.world_size for m in analysis.metas.values() if m.world_size), None),
        "slowest_rank": max(medians, key=medians.get) if medians else None,
        "command": run.job_command,
        "nodes": [{"name": n.name, "host": n.host, "exit_code": n.exit_code, "signal": n.signal, "ended": n.ended,
                   "lost_at": None if n.ended else run.last_step_note(n).strip(), "command": list(n.command),
                   "collectors": n.collectors, "not_saved": [vars(x) for x in n.lost]} for n in run.node_records],
        "per_rank": per_rank,
        "window": window_check(analysis, events_per_step) if count_events else None,
    }


def summarize_trace(path: Path, rank: int | None = None) -> dict[str, Any]:
    """Steps (from ``ProfilerStep#N``), step-time statistics and event counts of one trace."""
    tables = load_trace(path, rank=rank)
    steps = tables.steps
    durations = steps["end_ns"] - steps["start_ns"]
    meta = tables.meta
    return {
        "path": str(path),
        "kind": "trace",
        "ranks": [meta["rank"]],
        "hosts": [meta["host"]] if meta.get("host") else [],
        "world_size": meta.get("world_size"),
        "slowest_rank": meta["rank"] if len(steps) else None,
        "per_rank": [{
            "rank": meta["rank"],
            "host": meta.get("host"),
            "steps": len(steps),
            "steps_timed": len(steps),
            "step_ms": step_stats_ms(durations),
            "events": len(tables.events),
            "events_by_category": {str(k): int(v) for k, v in
                                   tables.events["cat"].value_counts().items() if v},
        }],
    }


def summarize(path: str | os.PathLike, rank: int | None = None) -> dict[str, Any]:
    """Summarize a run directory or a single trace file."""
    p = Path(path)
    if p.is_dir() or is_run_dir(p):
        return summarize_run(RunAnalysis.open(p))
    return summarize_trace(p, rank=rank)
