"""A rank's trace labelled from its collective log: process groups, sequence numbers, sizes, peers.

gloo's trace events name no process group, so a job with several (FSDP sharding over one, tensor
and data parallel over two dimensions of a mesh) cannot be matched from its trace alone; nor do
its sends name their peer. ``dpro record`` writes each rank's ``collectives.json``
(:mod:`dpro.collectors.collective_log`): the flight recorder's collectives (group, sequence
number, profiling name, sizes, creation time) and the logged sends and receives (peer, group,
bytes, time). :func:`label` writes them into the events:

- a collective's *enqueue call* (``c10d::allreduce_``...) takes the ``pg_name`` and ``seq`` of
  the entry created inside it. The log's times are the system clock's and the trace's the
  profiler's: they agree to microseconds on a quiet machine, but on a loaded one they were seen
  0.1 ms before to 0.4 ms after the calls (drifting, then jumping), where a call lasts 20 µs.
  So where some call holds no entry, the calls are paired with the log's entries in order
  (:func:`_in_order`): the process issues its collectives one at a time, so its calls are a run
  of its entries, each naming its call's collective; time only places the run, which must fit
  clearly better than any other and put no entry far from its call (an entry lost or added
  shifts the rest, and is refused). Each entry paired takes its call's start as its time. Where
  no run qualifies, the calls keep the entries created inside them;
- its *work event* (``gloo:all_reduce``...) runs on a worker thread of its group, first in, first
  out: each work event takes the oldest entry of that name not yet taken among the groups whose
  entry was created before the work began, preferring the group its thread already served
  (a gloo worker thread serves one group), else the entry created first;
- the k-th send (and receive) call and work event of the window take the k-th logged send
  (receive) created since the window began: ``peer`` (global rank), ``pg_name``, ``seq`` (the
  index among those, negated less one so that it never meets a collective's).

Where a trace names its groups already (NCCL), it is returned as it was. Sizes fill
``in_nelems`` and ``dtype`` where the trace has none.
"""

from __future__ import annotations

import json
import os
from collections import deque
from typing import Any

import numpy as np
import pandas as pd

from dpro.graph.matching import work_events
from dpro.graph.vocabulary import P2P_FAMILIES, collective_family, collective_in_name, is_enqueue_call

__all__ = ["label", "read_log"]


def read_log(path: str | os.PathLike | None) -> dict[str, Any] | None:
    """A rank's ``collectives.json``, or None when there is none or it cannot be read."""
    if path is None:
        return None
    try:
        with open(path) as f:
            log = json.load(f)
    except (OSError, ValueError):
        return None
    return log if isinstance(log, dict) else None


def label(events: pd.DataFrame, log: dict[str, Any] | None) -> pd.DataFrame:
    """``events`` with ``pg_name``, ``seq``, ``in_nelems``, ``dtype`` and ``peer`` (float, NaN
    where not a send or receive) filled from ``log`` (see the module docstring), and ``logged``
    (whether the log labelled the event)."""
    events = events.assign(peer=np.nan, logged=False)
    coll = events["coll_name"].notna()
    if not log or not coll.any() or events.loc[coll, "pg_name"].notna().any():
        return events
    in_window = events["step"] >= 0
    since = int(events.loc[in_window, "start_ns"].min()) if in_window.any() else int(events["start_ns"].min())
    pg = events["pg_name"].astype(object).to_numpy(copy=True)
    dtype = events["dtype"].astype(object).to_numpy(copy=True)
    seq = events["seq"].to_numpy(np.int64, copy=True)
    nelems = events["in_nelems"].to_numpy(np.int64, copy=True)
    peer = events["peer"].to_numpy(np.float64, copy=True)
    logged = np.zeros(len(events), bool)
    names = events["name"].astype(str)
    enqueue = (coll & names.map(is_enqueue_call).astype(bool)).to_numpy()
    family = events["coll_name"].astype(object).map(lambda c: collective_family(str(c)) if isinstance(c, str) else "")
    p2p = (coll & family.isin(P2P_FAMILIES)).to_numpy()
    calls, entries = _enqueue_entries(events, enqueue & ~p2p, log.get("collectives", []), since)
    for row, entry in calls:
        pg[row], seq[row], logged[row] = entry["pg_name"], entry["seq"], True
    work = np.zeros(len(events), bool)
    work[events.index.get_indexer(work_events(events).index)] = True
    for row, entry in _work_entries(events, work & ~p2p, entries):
        pg[row], seq[row], logged[row] = entry["pg_name"], entry["seq"], True
        sizes, dtypes = entry.get("input_sizes") or [], entry.get("input_dtypes") or []
        if nelems[row] < 0 and sizes:
            nelems[row] = int(sum(np.prod(s, dtype=np.int64) for s in sizes))
            dtype[row] = str(dtypes[0]).lower() if dtypes else dtype[row]
    sends = [e for e in log.get("p2p", []) if e.get("created_ns", 0) >= since]
    for op in ("send", "recv"):
        of_op = [(i, e) for i, e in enumerate(sends) if e["op"] == op]
        for part in (enqueue, ~enqueue):
            rows = np.flatnonzero(p2p & part & (family == op).to_numpy())
            rows = rows[np.argsort(events["start_ns"].to_numpy()[rows], kind="stable")]
            for row, (i, entry) in zip(rows, of_op):
                pg[row], seq[row], peer[row], logged[row] = entry["pg_name"], -2 - i, entry["peer"], True
                if nelems[row] < 0 and entry.get("nbytes") is not None:
                    nelems[row], dtype[row] = int(entry["nbytes"]), "uint8"
    return events.assign(pg_name=pd.Categorical(pg), dtype=pd.Categorical(dtype), seq=seq, in_nelems=nelems,
                         peer=peer, logged=logged)


def _enqueue_entries(events: pd.DataFrame, mask: np.ndarray, log_entries: list[dict[str, Any]],
                     since: int) -> tuple[list[tuple[int, dict[str, Any]]], list[dict[str, Any]]]:
    """(row, entry) for each enqueue call and the entry it created (see the module docstring), and
    the window's entries in order of creation for the work events: where the calls pair in order,
    their entries, each created (``created_ns``) when its call began on the trace's clock, and
    those the log holds after them; else those created since ``since``."""
    rows = np.flatnonzero(mask)
    start = events["start_ns"].to_numpy(np.int64)[rows]
    order = np.argsort(start, kind="stable")
    rows, start = rows[order], start[order]
    end = start + events["dur_ns"].to_numpy(np.int64)[rows]
    entries = sorted(log_entries, key=lambda e: e["created_ns"])
    created = np.array([e["created_ns"] for e in entries], np.int64)
    pairs, taken = [], created < since
    for row, a, b in zip(rows, start, end):
        i = int(np.searchsorted(created, a, "left"))
        while i < len(entries) and created[i] <= b and taken[i]:
            i += 1
        if i < len(entries) and created[i] <= b:
            taken[i] = True
            pairs.append((row, entries[i]))
    window = [e for e, t in zip(entries, created >= since) if t]
    if len(pairs) == len(rows):  # the clocks agree: each call holds its entry's creation
        return pairs, window
    calls = events["coll_name"].astype(str).to_numpy()[rows]
    first = _in_order(start, end, log_entries, [_loose_family(c) for c in calls])
    if first is None:
        return pairs, window
    moved = [{**e, "created_ns": int(a)} for e, a in zip(log_entries[first:first + len(rows)], start)]
    return list(zip(rows, moved)), moved + log_entries[first + len(rows):]


FIT_NS = 1_000_000
"""How far (ns) any entry of a run may fall outside the call it pairs with: a clock off by more,
or a run shifted past a lost entry (its entries then stand a call's spacing off), pairs nothing."""


def _in_order(start: np.ndarray, end: np.ndarray, entries: list[dict[str, Any]], families: list[str],
              reach: int = 64) -> int | None:
    """The index in ``entries`` (the log's, in the order it issued them) of the entry that the
    first of the calls (``start`` and ``end``, sorted by start; ``families``, their collectives'
    :func:`_loose_family`) created, where the calls are a run of the entries: of the runs that
    begin within ``reach`` entries of the first call's time and whose entries each name its
    call's collective, the one whose entries fall closest to their calls (median distance outside
    the call), if under half the next closest's and none of its entries is ``FIT_NS`` outside its
    call. None otherwise: with no calls, no such run, two near alike (a clock as far off as the
    calls are apart), or one entry far off (an entry lost or added, which shifts the rest)."""
    n, m = len(start), len(entries)
    if n == 0 or m < n:
        return None
    created = np.array([e["created_ns"] for e in entries], np.int64)
    named = np.array([_loose_family(collective_in_name(str(e.get("name", ""))) or "") for e in entries])
    guess = int(np.searchsorted(np.sort(created), start[0]))
    firsts = np.arange(max(guess - reach, 0), min(guess + reach, m - n) + 1)
    firsts = firsts[[(named[f:f + n] == families).all() for f in firsts]] if len(firsts) else firsts
    if not len(firsts):
        return None
    runs = created[firsts[:, None] + np.arange(n)]
    outside = np.maximum(np.maximum(start - runs, runs - end), 0)
    apart = np.median(outside, axis=1)
    best = int(np.argmin(apart))
    ranked = np.sort(apart)
    if outside[best].max() > FIT_NS or (len(ranked) > 1 and ranked[0] >= 0.5 * ranked[1]):
        return None
    return int(firsts[best])


def _loose_family(name: str) -> str:
    """The family of a canonical collective name, a reduce-scatter's counted as an all-reduce
    (gloo logs it as one)."""
    family = collective_family(name)
    return "all_reduce" if family == "reduce_scatter" else family


def _work_entries(events: pd.DataFrame, mask: np.ndarray, entries: list[dict[str, Any]]):
    """(row, entry) for each work event (see the module docstring): each worker thread is given
    the group most of its events would take first in, first out across groups; then a group's
    work events, in order of start, take its entries in order of creation (its queue is first
    in, first out), each no earlier than it was created."""
    rows = np.flatnonzero(mask)
    frame = events.iloc[rows]
    order = np.argsort(frame["start_ns"].to_numpy(), kind="stable")
    rows, names = rows[order], frame["name"].astype(str).to_numpy()[order]
    tids, starts = frame["tid"].to_numpy()[order], frame["start_ns"].to_numpy(np.int64)[order]
    queues: dict[tuple[str, str], deque] = {}
    for e in entries:
        queues.setdefault((e["name"], e["pg_name"]), deque()).append(e)
    votes: dict[Any, dict[str, int]] = {}
    for name, tid, start in zip(names, tids, starts):
        ready = {g: q for (n, g), q in queues.items() if n == name and q and q[0]["created_ns"] <= start}
        if ready:
            group = min(ready, key=lambda g: ready[g][0]["created_ns"])
            ready[group].popleft()
            counts = votes.setdefault(tid, {})
            counts[group] = counts.get(group, 0) + 1
    served = {tid: max(counts, key=counts.get) for tid, counts in votes.items()}
    by_group: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_group.setdefault(e["pg_name"], []).append(e)
    for group, taken in by_group.items():
        mine = [i for i, tid in enumerate(tids) if served.get(tid) == group]
        k = 0
        for i in mine:
            if k < len(taken) and taken[k]["created_ns"] <= starts[i] and taken[k]["name"] == names[i]:
                yield rows[i], taken[k]
                k += 1
