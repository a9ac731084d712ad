"""Columns to tables: the events, steps, flows and process groups of one rank's trace."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpro.graph.kineto.collect import PHASE_LABELS, Collector, dense
from dpro.graph.kineto.decode import decode_events
from dpro.graph.kineto.schema import TraceTables
from dpro.graph.kineto.strings import categorical, derive, int_labels, make_frame, prefer
from dpro.graph.vocabulary import (GPU_CATEGORIES, WINDOW_CATEGORY, canonical_collective, collective_in_name,
                                   modern_category, step_number)



def parse(path: Path, rank: int | None) -> TraceTables:
    header, collector = decode_events(path)
    base = header.get("baseTimeNanoseconds")
    base_ns = 0 if base is None else int(base)
    dist = header.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else {}
    rank, rank_source = _resolve_rank(dist, rank, path)
    events, steps, window = _events_frame(collector, rank, base_ns)
    devices = header.get("deviceProperties")
    meta = {
        "source": str(path), "trace_name": header.get("traceName"), "schema_version": header.get("schemaVersion"),
        "rank": rank, "rank_source": rank_source, "world_size": dist.get("world_size"),
        "backend": dist.get("backend"), "nccl_version": dist.get("nccl_version"), "pg_count": dist.get("pg_count"),
        "base_time_ns": None if base is None else base_ns, "time_unit": header.get("displayTimeUnit"),
        "span_start_ns": window[0], "span_end_ns": window[1],
        "device_properties": devices if isinstance(devices, list) else [],
    }
    return TraceTables(events, _flows_frame(collector, base_ns), steps, _process_groups(dist), meta)


def _events_frame(c: Collector, rank: int, base_ns: int) -> tuple[pd.DataFrame, pd.DataFrame, tuple]:
    """The events table, the steps table and the profiling window (start, end) in ns."""
    col, text, n = c.events, c.text, c.n_events
    cat, cat_labels = derive(col["cat"], text["cat"].labels, modern_category)
    start, dur = col["start_ns"] + base_ns, col["dur_ns"]
    window_code = cat_labels.index(WINDOW_CATEGORY) if WINDOW_CATEGORY in cat_labels else -2
    is_window = cat == window_code
    window = _window(start[is_window], (start + dur)[is_window], c.instants["ts_ns"] + base_ns, start, dur)

    order = _start_order(start, dur, np.flatnonzero(~is_window))
    cat, start, dur = cat[order], start[order], dur[order]
    if window_code >= 0:  # its events are gone: drop the label
        cat, cat_labels = cat - (cat > window_code), cat_labels[:window_code] + cat_labels[window_code + 1:]
    name, name_labels = col["name"][order], list(text["name"].labels)
    pid, tid, correlation = col["pid"][order], col["tid"][order], col["correlation"][order]
    gpu = np.isin(cat, [i for i, label in enumerate(cat_labels) if label in GPU_CATEGORIES])
    stream, device = (column[order] for column in dense(n, c.gpu, ("stream", "device")).values())
    comm = {f: column[order] for f, column in dense(n, c.comm, (
        "coll_name", "in_nelems", "out_nelems", "group_size", "pg_id", "seq", "dtype", "pg_name", "pg_desc")).items()}
    steps = _steps(name, name_labels, start, dur, gpu)
    coll = prefer(derive(comm["coll_name"], text["coll_name"].labels, canonical_collective),
                   derive(name, name_labels, collective_in_name))
    pg = prefer((comm["pg_name"], list(text["pg_name"].labels)), int_labels(comm["pg_id"]))
    frame = make_frame({
        "rank": np.full(len(order), rank, np.int32),
        "cat": categorical(cat, cat_labels),
        "name": categorical(name, name_labels),
        "pid": pid, "tid": tid,
        "stream": np.where(gpu, np.where(stream >= 0, stream, tid), -1).astype(np.int32),
        "device": np.where(gpu, np.where(device >= 0, device, pid), -1).astype(np.int32),
        "start_ns": start, "dur_ns": dur,
        "step": _step_of(start, gpu, correlation, steps).astype(np.int32),
        "correlation": correlation,
        "external_id": col["external_id"][order],
        "coll_name": categorical(*coll),
        "pg_name": categorical(*pg),
        "pg_desc": categorical(comm["pg_desc"], list(text["pg_desc"].labels)),
        "in_nelems": comm["in_nelems"], "out_nelems": comm["out_nelems"],
        "group_size": comm["group_size"].astype(np.int32),
        "dtype": categorical(comm["dtype"], list(text["dtype"].labels)),
        "seq": comm["seq"],
    })
    return frame, make_frame(steps), window


def _start_order(start: np.ndarray, dur: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``rows`` sorted by start, the longer first among equal starts (a parent before its children)."""
    rows = rows[np.argsort(start[rows], kind="stable")]
    s = start[rows]
    tied = np.flatnonzero(s[1:] == s[:-1])
    if len(tied):  # re-sort the runs of equal starts only, which is much quicker than a full lexsort
        runs = np.unique(np.concatenate((tied, tied + 1)))
        rows[runs] = rows[runs][np.lexsort((-dur[rows[runs]], s[runs]))]
    return rows


def _window(starts: np.ndarray, ends: np.ndarray, instants: np.ndarray, start: np.ndarray,
            dur: np.ndarray) -> tuple[int | None, int | None]:
    """The profiling window: the span event and the instants around it, else all events."""
    bounds = np.concatenate((starts, ends, instants))
    if not len(bounds):
        bounds = np.concatenate((start, start + dur))
    return (int(bounds.min()), int(bounds.max())) if len(bounds) else (None, None)


def _steps(name: np.ndarray, name_labels: list[str], start: np.ndarray, dur: np.ndarray,
           gpu: np.ndarray) -> dict[str, np.ndarray]:
    """Columns of the CPU ``ProfilerStep#N`` events (the first of each N), sorted by start."""
    number = np.array([step_number(label) for label in name_labels] + [-1], np.int64)[name]
    rows = np.flatnonzero((number >= 0) & ~gpu)
    rows = rows[np.unique(number[rows], return_index=True)[1]]
    rows = rows[np.argsort(start[rows], kind="stable")]
    return {"step": number[rows], "start_ns": start[rows], "end_ns": start[rows] + dur[rows]}


def _step_of(start: np.ndarray, gpu: np.ndarray, correlation: np.ndarray, steps: dict[str, np.ndarray]) -> np.ndarray:
    """Step of each event: the step enclosing its start; on the GPU, the step of its launch."""
    i = np.searchsorted(steps["start_ns"], start, side="right") - 1
    inside = (i >= 0) & (start < np.append(steps["end_ns"], 0)[i])
    step = np.append(steps["step"], -1)[np.where(inside, i, -1)]
    launch = np.flatnonzero(~gpu & (correlation >= 0))
    launch = launch[np.argsort(correlation[launch], kind="stable")]
    launch_correlation = np.append(correlation[launch], -1)
    j = np.minimum(np.searchsorted(launch_correlation[:-1], correlation), len(launch))
    launched = gpu & (correlation >= 0) & (launch_correlation[j] == correlation)
    return np.where(launched, np.append(step[launch], -1)[j], step)


def _flows_frame(c: Collector, base_ns: int) -> pd.DataFrame:
    col = c.flows
    ts = col["ts_ns"] + base_ns
    order = np.argsort(ts, kind="stable")
    return make_frame({
        "cat": categorical(*derive(col["cat"][order], c.text["flow_cat"].labels, modern_category)),
        "flow_id": col["flow_id"][order],
        "phase": categorical(col["phase"][order], PHASE_LABELS),
        "pid": col["pid"][order], "tid": col["tid"][order], "ts_ns": ts[order],
    })


def _process_groups(dist: dict) -> pd.DataFrame:
    configs = [c for c in dist.get("pg_config") or [] if isinstance(c, dict)]
    ranks = [[int(r) for r in c.get("ranks") or []] for c in configs]
    return groups_frame({
        "pg_name": [str(c.get("pg_name", "")) for c in configs],
        "pg_desc": [str(c.get("pg_desc", "")) for c in configs],
        "backend": [_backend(c.get("backend_config"), dist.get("backend")) for c in configs],
        "size": [int(c.get("pg_size", len(r))) for c, r in zip(configs, ranks, strict=True)],
        "ranks": ranks,
    })


def groups_frame(columns: dict[str, list]) -> pd.DataFrame:
    return make_frame({name: np.array(values, np.int64) if name == "size" else pd.Series(values, dtype=object)
                   for name, values in columns.items()})


def _backend(config: Any, default: Any) -> str:
    """``cuda:nccl`` → ``nccl``; ``cpu:gloo,cuda:gloo`` → ``gloo``; ``cpu:gloo,cuda:nccl`` → ``gloo,nccl``."""
    if not isinstance(config, str) or not config:
        return str(default or "")
    return ",".join(dict.fromkeys(part.rpartition(":")[2] for part in config.split(",")))


_RANK_IN_FILE_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)


def _resolve_rank(dist: dict, rank: int | None, path: Path) -> tuple[int, str]:
    recorded = dist.get("rank")
    if isinstance(recorded, int):
        if rank is not None and rank != recorded:
            warnings.warn(f"{path.name}: distributedInfo says rank {recorded}, not {rank}; using {recorded}",
                          stacklevel=4)
        return recorded, "distributedInfo"
    if rank is not None:
        return int(rank), "argument"
    in_name = _RANK_IN_FILE_NAME.findall(path.name)
    if in_name:
        return int(in_name[-1]), "file name"
    return 0, "default"
