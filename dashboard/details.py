"""One op's details for the timeline's click: what it is, its input shapes, its duration in
every profiled step, and its place on the critical path; and a window as a Chrome trace.

Shapes come from the step ``dpro record`` profiles with ``record_shapes`` after the window
(:meth:`dpro.analysis.run.RunAnalysis.input_shapes`): the k-th op of a name on a thread there
has the shapes of the k-th op of that name on that thread in every step; decoded once per rank,
on the first click that asks.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pandas as pd

from dpro.analysis.run import RunAnalysis

from dpro.dashboard.timeline_data import KINDS, Lanes, visible_ops

__all__ = ["chrome_trace", "op_details"]

EXPORT_LIMIT = 500_000  # ops in one exported window (a Chrome trace of this many is ~60 MB)


def op_details(analysis: RunAnalysis, lanes: Lanes, op: int, occurrence: np.ndarray,
               critical: pd.DataFrame) -> dict[str, Any]:
    """What the timeline shows of op ``op`` (a row of ``lanes``): ``occurrence`` from
    :func:`~dpro.dashboard.overlays.occurrences`, ``critical`` from
    :func:`~dpro.dashboard.overlays.critical_ops`."""
    lane, rank, name = int(lanes.lane[op]), int(lanes.rank[op]), lanes.name[op]
    k = int(occurrence[op])
    same = np.arange(lanes.ptr[lane], lanes.ptr[lane + 1])
    same = same[(lanes.name[same] == name) & (occurrence[same] == k)]
    on_path = critical[critical["op"] == op]
    event = analysis.tables(rank).events.iloc[int(lanes.row[op])]
    details = {"name": str(lanes.names[name]), "kind": KINDS[lanes.kind[op]], "rank": rank,
               "lane": lanes.labels[lane], "step": int(lanes.step[op]), "start_ms": lanes.start[op] / 1e6,
               "duration_ms": (lanes.end[op] - lanes.start[op]) / 1e6, "depth": int(lanes.depth[op]),
               "occurrence": k,
               "across_steps": [{"step": int(lanes.step[i]), "duration_ms": (lanes.end[i] - lanes.start[i]) / 1e6}
                                for i in same],
               "critical_path": None if on_path.empty else {"position": int(on_path["position"].iloc[0]),
                                                            "length": int(on_path["length"].iloc[0])},
               "shapes": _shapes(analysis, lanes, op, k)}
    if isinstance(event["coll_name"], str):
        details["collective"] = {key: _plain(event[key]) for key in ("coll_name", "pg_name", "in_nelems", "out_nelems",
                                                                    "dtype", "group_size")}
    return details


def chrome_trace(lanes: Lanes, t0: float, t1: float, shown: np.ndarray | None = None) -> bytes:
    """The ops of the window as a Chrome trace (Perfetto opens it): a process per rank, a
    thread per lane, on the aligned clock; raises ValueError above :data:`EXPORT_LIMIT` ops."""
    ops = visible_ops(lanes, t0, t1, shown)
    if len(ops) > EXPORT_LIMIT:
        raise ValueError(f"{len(ops):,} ops in this window; zoom in to at most {EXPORT_LIMIT:,} to export it")
    events = [{"ph": "M", "name": "thread_name", "pid": int(lanes.lane_rank[i]), "tid": int(i),
               "args": {"name": lanes.labels[i]}} for i in np.unique(lanes.lane[ops])]
    events += [{"ph": "M", "name": "process_name", "pid": int(r), "args": {"name": f"rank {r}"}}
               for r in np.unique(lanes.rank[ops])]
    start_us = (lanes.start[ops] + lanes.origin_ns) / 1e3
    dur_us = (lanes.end[ops] - lanes.start[ops]) / 1e3
    names, kinds = lanes.names[lanes.name[ops]], np.asarray(KINDS)[lanes.kind[ops]]
    events += [{"ph": "X", "name": str(n), "cat": str(c), "pid": int(p), "tid": int(t), "ts": float(s), "dur": float(d)}
               for n, c, p, t, s, d in zip(names, kinds, lanes.rank[ops], lanes.lane[ops], start_us, dur_us)]
    return msgspec.json.encode({"traceEvents": events, "displayTimeUnit": "ms"})


def _shapes(analysis: RunAnalysis, lanes: Lanes, op: int, k: int) -> str | None:
    rank, lane = int(lanes.rank[op]), int(lanes.lane[op])
    table = analysis.input_shapes(rank)
    if table is None or lanes.lane_gpu[lane]:
        return None
    return table.get((int(lanes.lane_thread[lane]), str(lanes.names[lanes.name[op]]), k))


def _plain(value: Any) -> Any:
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    return None if value is None or (isinstance(value, float) and value != value) else value
