"""Measured against predicted step times, what the step waits on, and the predicted timeline as a
Chrome trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from dpro.graph.collectives import default_algorithm
from dpro.graph.dataflow import DataflowGraph
from dpro.replayer.breakdown import breakdown, rank_critical_path
from dpro.replayer.cost import fit_link_model
from dpro.replayer.result import Replay
from dpro.stats import job_mean, timed_ranks


def comparison(graph: DataflowGraph, result: Replay, measured_ns: dict[int, float],
               profiled_ns: dict[int, float]) -> dict[str, Any]:
    """Predicted step time per rank and for the job (:func:`dpro.stats.job_mean` over the ranks
    that have a measured step) against the measured
    one, ``measured_ns``: the median of the steps outside the profiling window, the steps users
    run; beside it the profiled window's median (``profiled_ns``) and its slow-down. Each rank's
    critical-path breakdown; the collectives (algorithm, size, transfer and waiting); the link
    model fitted on the recorded collectives."""
    def ms(ns: float) -> float | None:
        return None if ns != ns else ns / 1e6

    def error(predicted: float, measured: float) -> float | None:
        return None if measured != measured else 100 * (predicted / measured - 1)

    ranks = sorted(graph.step_ns)
    per_rank = [{"rank": r, "measured_step_ms": ms(measured_ns[r]), "predicted_step_ms": result.step_ns[r] / 1e6,
                 "error_pct": error(result.step_ns[r], measured_ns[r]), "profiled_step_ms": ms(profiled_ns[r]),
                 "profiler_slowdown": None if measured_ns[r] != measured_ns[r] else profiled_ns[r] / measured_ns[r]}
                for r in ranks]
    timed = timed_ranks(measured_ns, ranks)
    measured, predicted = job_mean(measured_ns, timed), job_mean(result.step_ns, timed)
    profiled = job_mean(profiled_ns, timed)
    return {"measured_step_ms": ms(measured), "predicted_step_ms": predicted / 1e6,
            "error_pct": error(predicted, measured), "profiled_step_ms": ms(profiled),
            "profiler_slowdown": None if measured != measured else profiled / measured, "steps": graph.steps,
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
             "resource": str(nodes.at[v, "resource"]), "name": str(nodes.at[v, "name"]),
             "start_ms": result.start_ns[v] / 1e6, "dur_ms": (result.end_ns[v] - result.start_ns[v]) / 1e6}
            for v in rank_critical_path(graph, result, rank)]


def top_ops(path: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ops of a critical path (:func:`critical_path`) grouped by name and kind, by their total
    time on it: ``name``, ``kind``, ``count``, ``total_ms``, ``share`` (of the path's op time),
    longest first."""
    totals: dict[tuple[str, str], list[float]] = {}
    for p in path:
        entry = totals.setdefault((p["name"], p["kind"]), [0, 0.0])
        entry[0] += 1
        entry[1] += p["dur_ms"]
    whole = sum(t for _, t in totals.values()) or 1.0
    ops = [{"name": name, "kind": kind, "count": n, "total_ms": t, "share": t / whole}
           for (name, kind), (n, t) in totals.items()]
    return sorted(ops, key=lambda o: -o["total_ms"])


def export_chrome_trace(graph: DataflowGraph, result: Replay, path: Path) -> None:
    """Write the predicted timeline as a Chrome trace (opens in Perfetto): one process per rank,
    one named track per thread, stream or link (sends on the sender's process); a rank's part
    of a collective is one span on its communication thread, from its arrival to its end.
    Events that would overlap on a track (two collectives on one link at once) go to numbered
    extra tracks."""
    nodes, edges = graph.nodes, graph.edges
    start, end = result.start_ns.copy(), result.end_ns.copy()
    kinds = nodes["kind"].to_numpy()
    done = np.flatnonzero(kinds == "collective")  # a rank's end: drawn as its collective's span
    own = edges[(edges["kind"] == "arrive") & edges["dst"].isin(done)]
    done_of = dict(zip(own["src"].tolist(), own["dst"].tolist()))  # a rank's arrival -> its end
    for arrival, finish in done_of.items():
        end[arrival] = end[finish]
    events: list[dict[str, Any]] = []
    lanes: dict[tuple[int, str], list[float]] = {}
    tids: dict[tuple[int, str], int] = {}
    for v in np.lexsort((-(end - start), start)):
        if kinds[v] == "collective":
            continue
        rank, resource = int(nodes.at[v, "rank"]), str(nodes.at[v, "resource"])
        ends, lane = lanes.setdefault((rank, resource), []), 0
        while lane < len(ends) and ends[lane] > start[v] + 1:  # 1 ns of rounding
            lane += 1
        ends[lane:lane + 1] = [end[v]]
        track = (rank, resource if lane == 0 else f"{resource} #{lane + 1}")
        if track not in tids:
            tids[track] = len(tids) + 1
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tids[track], "args": {"name": track[1]}})
        name = nodes.at[done_of[v], "name"] if v in done_of else nodes.at[v, "name"]
        events.append({"ph": "X", "name": str(name), "pid": rank, "tid": tids[track], "ts": start[v] / 1e3,
                       "dur": (end[v] - start[v]) / 1e3, "cat": str(kinds[v])})
    events += [{"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}} for r in sorted(graph.step_ns)]
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
