"""Measured against predicted step times, and the predicted timeline as a Chrome trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from dpro.graph.dataflow import DataflowGraph, graph_of_run
from dpro.run_format import Run

from .simulate import Replay, replay


def replay_run(run: Run, align: bool = True) -> tuple[DataflowGraph, Replay]:
    """Build the graph of a recorded run and replay it."""
    graph = graph_of_run(run, align=align)
    return graph, replay(graph)


def comparison(graph: DataflowGraph, result: Replay) -> dict[str, Any]:
    """Measured and predicted step time per rank and for the job (the mean over ranks)."""
    per_rank = [{"rank": r, "measured_step_ms": graph.step_ns[r] / 1e6,
                 "predicted_step_ms": result.step_ns[r] / 1e6,
                 "error_pct": 100 * (result.step_ns[r] / graph.step_ns[r] - 1)} for r in sorted(graph.step_ns)]
    measured = float(np.mean([r["measured_step_ms"] for r in per_rank]))
    predicted = float(np.mean([r["predicted_step_ms"] for r in per_rank]))
    return {"measured_step_ms": measured, "predicted_step_ms": predicted,
            "error_pct": 100 * (predicted / measured - 1), "steps": graph.steps,
            "nodes": len(graph.nodes), "edges": len(graph.edges), "per_rank": per_rank}


def critical_path(graph: DataflowGraph, result: Replay) -> list[dict[str, Any]]:
    """The nodes on the predicted critical path, with their predicted times (ms)."""
    nodes = graph.nodes
    return [{"node": int(v), "rank": int(nodes.at[v, "rank"]), "resource": nodes.at[v, "resource"],
             "name": str(nodes.at[v, "name"]), "start_ms": result.start_ns[v] / 1e6,
             "dur_ms": (result.end_ns[v] - result.start_ns[v]) / 1e6} for v in result.critical_path]


def export_chrome_trace(graph: DataflowGraph, result: Replay, path: Path) -> None:
    """Write the predicted timeline as a Chrome trace (one process per rank, one track per
    thread or stream; collectives on their own process)."""
    nodes = graph.nodes
    events = []
    for v, (rank, resource, name) in enumerate(zip(nodes["rank"], nodes["resource"], nodes["name"])):
        events.append({"ph": "X", "name": str(name), "pid": int(rank) if rank >= 0 else "collectives",
                       "tid": str(resource), "ts": result.start_ns[v] / 1e3,
                       "dur": (result.end_ns[v] - result.start_ns[v]) / 1e3, "cat": str(nodes.at[v, "kind"])})
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
