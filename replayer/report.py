"""Measured against predicted step times, what the step waits on, and the predicted timeline as a
Chrome trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from dpro.graph.dataflow import DataflowGraph, graph_of_run
from dpro.run_format import Run

from dpro.graph.collectives import default_algorithm

from .breakdown import breakdown, rank_critical_path
from .cost import fit_link_model
from .simulate import Replay, replay


def replay_run(run: Run, align: bool = True) -> tuple[DataflowGraph, Replay]:
    """Build the graph of a recorded run and replay it."""
    graph = graph_of_run(run, align=align)
    return graph, replay(graph)


def comparison(graph: DataflowGraph, result: Replay) -> dict[str, Any]:
    """Measured and predicted step time per rank and for the job (the mean over ranks); each
    rank's critical-path breakdown; the collectives (algorithm, size, transfer and waiting);
    the fitted link model."""
    per_rank = [{"rank": r, "measured_step_ms": graph.step_ns[r] / 1e6,
                 "predicted_step_ms": result.step_ns[r] / 1e6,
                 "error_pct": 100 * (result.step_ns[r] / graph.step_ns[r] - 1)} for r in sorted(graph.step_ns)]
    measured = float(np.mean([r["measured_step_ms"] for r in per_rank]))
    predicted = float(np.mean([r["predicted_step_ms"] for r in per_rank]))
    return {"measured_step_ms": measured, "predicted_step_ms": predicted,
            "error_pct": 100 * (predicted / measured - 1), "steps": graph.steps,
            "nodes": len(graph.nodes), "edges": len(graph.edges), "per_rank": per_rank,
            "breakdown": [breakdown(graph, result, r) for r in sorted(graph.step_ns)],
            "collectives": collectives(graph),
            "link_model": [{"collective": c, "link_class": k, "alpha_us": m.alpha_ns / 1e3,
                            "bandwidth_gb_s": m.beta_bytes_per_ns, "points": m.points}
                           for (c, k), m in fit_link_model(graph).items()],
            "clock_offsets_ns": {str(r): o for r, o in graph.clock_offsets_ns.items()}}


def collectives(graph: DataflowGraph) -> list[dict[str, Any]]:
    """Each matched collective: algorithm, bytes, measured transfer time, each rank's measured
    wait for the last to arrive, and how many sends it was decomposed into."""
    out = []
    for c in graph.collectives.itertuples():
        out.append({"collective": f"{c.coll}#{c.occurrence}", "algorithm": c.algorithm or default_algorithm(c.coll),
                    "bytes": None if c.bytes != c.bytes else int(c.bytes), "ranks": list(c.ranks),
                    "transfer_ms": c.transfer_ns / 1e6, "wait_ms": [w / 1e6 for w in c.wait_ns],
                    "sends": len(c.sends)})
    return out


def critical_path(graph: DataflowGraph, result: Replay, rank: int | None = None) -> list[dict[str, Any]]:
    """The nodes on the predicted critical path (ending at ``rank``'s last op, or the job's),
    with their predicted times (ms)."""
    nodes = graph.nodes
    return [{"node": int(v), "rank": int(nodes.at[v, "rank"]), "kind": str(nodes.at[v, "kind"]),
             "resource": nodes.at[v, "resource"], "name": str(nodes.at[v, "name"]),
             "start_ms": result.start_ns[v] / 1e6, "dur_ms": (result.end_ns[v] - result.start_ns[v]) / 1e6}
            for v in rank_critical_path(graph, result, rank)]


def export_chrome_trace(graph: DataflowGraph, result: Replay, path: Path) -> None:
    """Write the predicted timeline as a Chrome trace: one process per rank, one track per
    thread, stream or link (sends on the sender's process); a rank's part of a collective is
    one span on its communication thread, from its arrival to its end. Events that would
    overlap on a track (two collectives on one link at once) go to numbered extra tracks."""
    nodes = graph.nodes
    start, end = result.start_ns.copy(), result.end_ns.copy()
    kinds = nodes["kind"].to_numpy()
    keep = kinds != "collective"  # a rank's end: drawn as its collective's span below
    arrival_of = {}
    for c in graph.collectives.itertuples():
        for rank, done in zip(c.ranks, c.done):
            arrival = graph.edges[(graph.edges["dst"] == done) & (graph.edges["kind"] == "arrive")]["src"].iloc[0]
            arrival_of[int(arrival)] = done
    for arrival, done in arrival_of.items():
        end[arrival] = end[done]
    events = []
    lanes: dict[str, list[float]] = {}
    order = np.lexsort((-(end - start), start))
    for v in order:
        if not keep[v]:
            continue
        resource, lane = str(nodes.at[v, "resource"]), 0
        ends = lanes.setdefault(resource, [])
        while lane < len(ends) and ends[lane] > start[v] + 1:  # 1 ns of rounding
            lane += 1
        ends[lane:lane + 1] = [end[v]]
        name = str(nodes.at[v, "name"])
        if v in arrival_of:
            name = str(nodes.at[arrival_of[v], "name"])
        events.append({"ph": "X", "name": name, "pid": int(nodes.at[v, "rank"]),
                       "tid": resource if lane == 0 else f"{resource} #{lane + 1}", "ts": start[v] / 1e3,
                       "dur": (end[v] - start[v]) / 1e3, "cat": str(kinds[v])})
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
