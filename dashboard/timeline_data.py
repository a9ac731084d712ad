"""The timeline's data: every recorded op of every rank in lanes, and the level of detail of a
window computed on the server.

:func:`build_lanes` puts each rank's profiled events (:meth:`dpro.analysis.RunAnalysis.tables`,
read from the trace cache, never re-decoded) in a lane per CPU thread and GPU stream, on one
clock (each rank's aligned offset subtracted, :attr:`~dpro.analysis.RunAnalysis.offsets`), with
each op's nesting depth. ``ProfilerStep#N`` spans become the step bounds, not ops.

:func:`window` answers a view ``[t0, t1]``: where at most ``budget`` ops are visible, every one
of them (each clickable); otherwise each lane's outermost ops merged wherever they lie closer
than a pixel apart (``(t1 - t0) / pixels``), each merged span coloured by the kind that took
most of its time and counting its ops; the pixel is widened until at most ``budget`` shapes
remain. Finding the visible ops is a binary search per lane over the starts and the running
maximum of the ends, so a view costs its visible ops, not the run's.

    >>> lanes = build_lanes(analysis)                       # doctest: +SKIP
    >>> view = window(lanes, 0, lanes.end_ns)                # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import pandas as pd

from dpro.analysis.run import RunAnalysis

__all__ = ["KINDS", "Lanes", "View", "build_lanes", "window"]

KINDS = ("cpu op", "annotation", "runtime", "kernel", "memory", "collective", "other")
_KIND_OF_CAT = {"cpu_op": 0, "user_annotation": 1, "gpu_user_annotation": 1, "python_function": 1,
                "cuda_runtime": 2, "cuda_driver": 2, "kernel": 3, "gpu_memcpy": 4, "gpu_memset": 4}
COLLECTIVE = KINDS.index("collective")
STEP_PREFIX = "ProfilerStep#"


@dataclass
class Lanes:
    """Every op of a run by lane, sorted by (lane, start); times in ns from the earliest op.

    ``labels``: per lane, e.g. ``"rank 0 · cpu 5793"``; ``lane_rank``, ``lane_gpu`` and
    ``lane_thread`` (thread id, or stream on a GPU); ``ptr``: lane ``i``'s ops
    are rows ``ptr[i]:ptr[i + 1]``. Per op: ``lane``, ``start``, ``end``, ``reach`` (the latest
    end of its lane's ops up to it), ``kind`` (index into :data:`KINDS`), ``depth``, ``name``
    (index into ``names``), ``rank``, ``step``, ``row`` (its row in its rank's events).
    ``steps``: ``rank``, ``step``, ``start``, ``end`` of the profiled steps, same clock.
    ``origin_ns``: the earliest op's aligned epoch time.
    """

    labels: list[str]
    lane_rank: np.ndarray
    lane_gpu: np.ndarray
    lane_thread: np.ndarray
    ptr: np.ndarray
    lane: np.ndarray
    start: np.ndarray
    end: np.ndarray
    reach: np.ndarray
    kind: np.ndarray
    depth: np.ndarray
    name: np.ndarray
    names: np.ndarray
    rank: np.ndarray
    step: np.ndarray
    row: np.ndarray
    steps: pd.DataFrame
    origin_ns: int

    @property
    def end_ns(self) -> int:
        return int(self.reach.max()) if len(self.reach) else 0

    def __len__(self) -> int:
        return len(self.start)


@dataclass
class View:
    """What one window draws: ``shapes`` (``lane``, ``start``, ``end``, ``kind``, ``depth``,
    ``count``: ops it stands for, ``op``: the op's row in :class:`Lanes` or -1 when merged),
    ``visible``: the ops in the window, ``merged``: whether the shapes are merged spans,
    ``pixel_ns``: the merge distance (0 when every op is sent)."""

    t0: float
    t1: float
    shapes: pd.DataFrame
    visible: int
    merged: bool
    pixel_ns: float


def build_lanes(analysis: RunAnalysis) -> Lanes:
    """Every rank's profiled ops in lanes, aligned (see the module docstring)."""
    offsets = analysis.offsets
    frames, steps = [], []
    for rank in analysis.analysed_ranks:
        tables = analysis.tables(rank)
        e = tables.events
        offset = int(offsets.get(rank, 0))
        is_step = _per_category(e["name"], lambda name: str(name).startswith(STEP_PREFIX), False)
        gpu = (e["stream"].to_numpy() >= 0) | (e["device"].to_numpy() >= 0)
        frames.append(pd.DataFrame({
            "rank": np.int32(rank), "gpu": gpu[~is_step],
            "thread": np.where(gpu, e["stream"].to_numpy(np.int64), e["tid"].to_numpy(np.int64))[~is_step],
            "start": e["start_ns"].to_numpy(np.int64)[~is_step] - offset,
            "dur": e["dur_ns"].to_numpy(np.int64)[~is_step],
            "kind": _kinds(e)[~is_step], "name": e["name"].to_numpy(object)[~is_step],
            "step": e["step"].to_numpy(np.int32)[~is_step], "row": np.flatnonzero(~is_step)}))
        steps.append(tables.steps.assign(rank=rank, start=tables.steps["start_ns"] - offset,
                                         end=tables.steps["end_ns"] - offset)[["rank", "step", "start", "end"]])
    ops = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        {c: pd.Series(dtype=t) for c, t in [("rank", "int32"), ("gpu", "bool"), ("thread", "int64"), ("start", "int64"),
                                            ("dur", "int64"), ("kind", "int8"), ("name", object), ("step", "int32"),
                                            ("row", "int64")]})
    keys = ops.groupby(["rank", "gpu", "thread"], sort=False).size().rename("ops").reset_index()
    keys = keys.sort_values(["rank", "gpu", "ops", "thread"], ascending=[True, True, False, True], ignore_index=True)
    lane_of = pd.Series(np.arange(len(keys)), index=pd.MultiIndex.from_frame(keys[["rank", "gpu", "thread"]]))
    lane = lane_of.reindex(pd.MultiIndex.from_frame(ops[["rank", "gpu", "thread"]])).to_numpy(np.int64)
    order = np.lexsort((-ops["dur"].to_numpy(), ops["start"].to_numpy(), lane))  # parents before their children
    origin = int(ops["start"].min()) if len(ops) else 0
    start = ops["start"].to_numpy(np.int64)[order] - origin
    end = start + ops["dur"].to_numpy(np.int64)[order]
    lane = lane[order]
    ptr = np.searchsorted(lane, np.arange(len(keys) + 1)).astype(np.int64)
    codes, names = pd.factorize(ops["name"].to_numpy(object)[order])
    reach, depth = _reach_and_depth(ptr, start, end)
    hosts, mesh = analysis.hosts, analysis.parallelism
    labels = [f"rank {r}{f' ({hosts[r]})' if hosts.get(r) else ''}"
              f"{f' [{mesh.coordinate(r)}]' if mesh.coordinate(r) else ''} · {'gpu stream' if g else 'cpu'} {t}"
              for r, g, t in keys[["rank", "gpu", "thread"]].itertuples(index=False)]
    step_table = pd.concat(steps, ignore_index=True) if steps else pd.DataFrame(columns=["rank", "step", "start", "end"])
    step_table[["start", "end"]] -= origin
    return Lanes(labels=labels, lane_rank=keys["rank"].to_numpy(np.int32),
                 lane_gpu=keys["gpu"].to_numpy(bool), lane_thread=keys["thread"].to_numpy(np.int64), ptr=ptr, lane=lane, start=start, end=end,
                 reach=reach, kind=ops["kind"].to_numpy(np.int8)[order], depth=depth, name=codes.astype(np.int32),
                 names=np.asarray(names, object), rank=ops["rank"].to_numpy(np.int32)[order],
                 step=ops["step"].to_numpy(np.int32)[order], row=ops["row"].to_numpy(np.int64)[order],
                 steps=step_table, origin_ns=origin)


def window(lanes: Lanes, t0: float, t1: float, budget: int = 2000, pixels: int = 1500,
           shown: np.ndarray | None = None) -> View:
    """The shapes of the window ``[t0, t1]`` (ns from :attr:`Lanes.origin_ns`) on the lanes
    ``shown`` (default: all), at most ``budget`` of them (see the module docstring)."""
    t0, t1 = float(t0), max(float(t1), float(t0) + 1.0)
    ops = visible_ops(lanes, t0, t1, shown)
    if len(ops) <= budget:
        shapes = pd.DataFrame({"lane": lanes.lane[ops], "start": lanes.start[ops], "end": lanes.end[ops],
                               "kind": lanes.kind[ops], "depth": lanes.depth[ops], "count": 1, "op": ops})
        return View(t0, t1, shapes, len(ops), False, 0.0)
    outer = ops[lanes.depth[ops] == 0]
    pixel = (t1 - t0) / pixels
    while True:
        shapes = _merge(lanes, outer, pixel)
        if len(shapes) <= budget:
            return View(t0, t1, shapes, len(ops), True, pixel)
        pixel *= 2 * len(shapes) / budget


def visible_ops(lanes: Lanes, t0: float, t1: float, shown: np.ndarray | None = None) -> np.ndarray:
    """The rows of the ops that overlap ``[t0, t1]`` on the lanes ``shown``, by lane and start."""
    chosen = range(len(lanes.labels)) if shown is None else np.asarray(shown, np.int64)
    parts = []
    for i in chosen:
        a, b = lanes.ptr[i], lanes.ptr[i + 1]
        lo = a + np.searchsorted(lanes.reach[a:b], t0, "right")  # every op before lo ended by t0
        hi = a + np.searchsorted(lanes.start[a:b], t1, "left")
        if hi > lo:
            rows = np.arange(lo, hi)
            parts.append(rows[lanes.end[lo:hi] > t0])
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def _merge(lanes: Lanes, ops: np.ndarray, pixel: float) -> pd.DataFrame:
    """``ops`` (outermost, by lane and start) merged where less than ``pixel`` apart."""
    if not len(ops):
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in ("lane", "start", "end", "kind", "depth", "count", "op")})
    lane, start, end = lanes.lane[ops], lanes.start[ops], lanes.end[ops]
    cut = np.ones(len(ops), bool)
    cut[1:] = (lane[1:] != lane[:-1]) | (start[1:] > lanes.reach[ops[:-1]] + pixel)
    first = np.flatnonzero(cut)
    group = np.cumsum(cut) - 1
    spent = np.zeros((len(first), len(KINDS)))
    np.add.at(spent, (group, lanes.kind[ops]), (end - start).astype(np.float64))
    count = np.diff(np.append(first, len(ops)))
    return pd.DataFrame({"lane": lane[first], "start": start[first], "end": np.maximum.reduceat(end, first),
                         "kind": spent.argmax(axis=1).astype(np.int8), "depth": 0, "count": count,
                         "op": np.where(count == 1, ops[first], -1)})


def _kinds(events: pd.DataFrame) -> np.ndarray:
    kind = _per_category(events["cat"], lambda cat: _KIND_OF_CAT.get(cat, len(KINDS) - 1), len(KINDS) - 1).astype(np.int8)
    kind[events["coll_name"].notna().to_numpy()] = COLLECTIVE
    return kind


def _per_category(column: pd.Series, value: Any, missing: Any) -> np.ndarray:
    """``value(text)`` of each row of a text column, computed once per distinct text."""
    values = pd.Categorical(column)
    table = np.array([value(c) for c in values.categories] + [missing])
    return table[values.codes]


def _reach_and_depth(ptr: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    reach = np.empty_like(end)
    depth = np.empty(len(start), np.int16)
    _lane_sweep(ptr, start, end, reach, depth)
    return reach, depth


@numba.njit(cache=True)
def _lane_sweep(ptr: np.ndarray, start: np.ndarray, end: np.ndarray, reach: np.ndarray, depth: np.ndarray) -> None:
    """Per lane, the running maximum of the ends and each op's nesting depth (the ops still
    open when it starts; by start, parents first)."""
    stack = np.empty(len(start) + 1, np.int64)
    for i in range(len(ptr) - 1):
        top = 0
        latest = np.iinfo(np.int64).min
        for k in range(ptr[i], ptr[i + 1]):
            while top > 0 and stack[top - 1] <= start[k]:
                top -= 1
            depth[k] = min(top, 32767)
            stack[top] = end[k]
            top += 1
            latest = max(latest, end[k])
            reach[k] = latest
