"""Collectives matched across ranks: the one matcher of dpro.

**Instances.** On each rank, a collective's *instance* is the event that does its work
(:func:`work_events`): its NCCL kernel when the rank's trace has collective kernels, else its
outermost CPU-side event (``gloo:all_reduce``...), never the ``c10d::*`` call or
``record_param_comms`` that only issues it. Instances are numbered by order of issue
(:func:`number`): several communication threads or streams take work in the order it was
issued, so the order of start times across them is the order of issue.

**Matching** (:func:`match`). Instances of different ranks are the same collective when they
share a key: step, process group (``""`` when the trace names none), collective name and
occurrence. A key is kept when every rank that took part in that process group has it, on at
least two ranks; a rank that missed one (a trace cut short) leaves that collective unmatched.
The dataflow graph matches the collectives of its typical step this way, clock alignment and
straggler analysis those of every profiled step.

    >>> inst = rank_instances(load_trace("rank0.json.gz").events, rank=0)   # doctest: +SKIP
    >>> matched = match(pd.concat([inst, other_ranks_instances]))          # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpro.graph.vocabulary import P2P_FAMILIES, collective_family, dtype_bytes, is_enqueue_call

__all__ = ["INSTANCE_COLUMNS", "KEY", "does_work", "has_collective_kernels", "is_p2p", "match", "number", "pair_p2p",
           "rank_instances", "work_events"]

KEY = ["step", "pg_name", "coll_name", "occurrence"]
INSTANCE_COLUMNS = ["rank", *KEY, "peer", "start_ns", "dur_ns", "nbytes"]


def does_work(frame: pd.DataFrame, kernels: bool) -> np.ndarray:
    """Mask of the collective events (``cat``, ``name``, ``stream``, ``coll_name``) that may be
    instances: collective kernels when the rank has any (``kernels``), else CPU-side events that
    do not merely issue a collective."""
    coll = frame["coll_name"].notna().to_numpy()
    if kernels:
        return coll & (frame["cat"] == "kernel").to_numpy()
    names = frame["name"].astype(str)
    return coll & (frame["stream"] < 0).to_numpy() & ~names.map(is_enqueue_call).astype(bool).to_numpy()


def has_collective_kernels(events: pd.DataFrame) -> bool:
    """Whether a rank's collectives run as kernels (NCCL), which are then their instances."""
    return bool(((events["cat"] == "kernel") & events["coll_name"].notna()).any())


def work_events(events: pd.DataFrame) -> pd.DataFrame:
    """The events of one rank that do collectives' work: kernels if any, else outermost CPU events."""
    kernels = has_collective_kernels(events)
    ev = events[does_work(events, kernels)]
    if kernels:
        return ev
    p2p = is_p2p(ev)  # a send's or receive's work spans its wait, overlapping the ops after it
    sends = ev[p2p]
    ev = ev[~p2p].sort_values(["tid", "start_ns"], kind="stable")
    ends = (ev["start_ns"] + ev["dur_ns"]).groupby(ev["tid"]).cummax()
    previous_end = ends.groupby(ev["tid"]).shift(1).fillna(np.iinfo(np.int64).min)
    outermost = ev[ev["start_ns"].to_numpy() >= previous_end.to_numpy()]
    if sends.empty:
        return outermost
    return pd.concat([outermost, sends]).sort_values(["tid", "start_ns"], kind="stable")


def is_p2p(frame: pd.DataFrame) -> np.ndarray:
    """Mask of the events (``coll_name``) of sends and receives."""
    return frame["coll_name"].astype(object).map(
        lambda c: isinstance(c, str) and collective_family(c) in P2P_FAMILIES).to_numpy(bool)


def number(frame: pd.DataFrame, by: list[str], start: str = "start_ns") -> pd.Series:
    """Each row's order of issue among the rows sharing ``by``: its rank by ``start`` (stable)."""
    ordered = frame.sort_values(start, kind="stable")
    return ordered.groupby(by, observed=True, sort=False).cumcount().reindex(frame.index)


def rank_instances(events: pd.DataFrame, rank: int) -> pd.DataFrame:
    """One row per collective instance of one rank in its profiled steps (:data:`INSTANCE_COLUMNS`
    and ``event``, the row of ``events``): the rank's own clock; ``nbytes`` from the event's
    element count and dtype, else from the call that issued it, NaN when neither says."""
    work = work_events(events[events["step"] >= 0])
    frame = pd.DataFrame({
        "rank": rank, "step": work["step"].to_numpy(np.int64),
        "pg_name": work["pg_name"].astype(object).fillna("").astype(str).to_numpy(),
        "coll_name": work["coll_name"].astype(str).to_numpy(),
        "start_ns": work["start_ns"].to_numpy(np.int64), "dur_ns": work["dur_ns"].to_numpy(np.int64),
        "nbytes": _nbytes(work), "event": work.index.to_numpy(),
        "peer": work["peer"].fillna(-1).to_numpy(np.int64) if "peer" in work else np.full(len(work), -1, np.int64),
    })
    if len(work) and "logged" in work and work["logged"].to_numpy(bool).all():  # the groups' own order
        seq = work["seq"].to_numpy(np.int64)
        frame["issued"] = np.where(seq >= 0, seq, -(seq + 2))
        frame["occurrence"] = number(frame, ["step", "pg_name", "coll_name", "peer"], "issued")
        frame = frame.drop(columns="issued")
    else:
        frame["occurrence"] = number(frame, ["step", "pg_name", "coll_name", "peer"])
    missing = frame["nbytes"].isna()
    if missing.any():  # sizes of the calls that issued them, in the same order per collective
        issued = _issue_calls(events)
        if len(issued):
            frame["_nth"] = number(frame, ["step", "coll_name"])
            sizes = issued.set_index(["step", "coll_name", "_nth"])["nbytes"]
            looked_up = sizes.reindex(pd.MultiIndex.from_frame(frame[["step", "coll_name", "_nth"]])).to_numpy()
            frame.loc[missing, "nbytes"] = looked_up[missing.to_numpy()]
            frame = frame.drop(columns="_nth")
    return frame[[*INSTANCE_COLUMNS, "event"]].reset_index(drop=True)


def _nbytes(events: pd.DataFrame) -> np.ndarray:
    """Bytes of each collective event from its element count and dtype, NaN where unknown."""
    itemsize = events["dtype"].astype(object).map(dtype_bytes).astype("float64").to_numpy()
    nelems = events["in_nelems"].to_numpy(np.float64)
    return np.where(nelems >= 0, nelems * itemsize, np.nan)


def _issue_calls(events: pd.DataFrame) -> pd.DataFrame:
    """The sized calls that issue collectives (``record_param_comms``, else ``c10d::*``), numbered
    per step and collective."""
    calls = events[events["coll_name"].notna() & (events["step"] >= 0) & (events["in_nelems"] >= 0)]
    calls = calls[calls["name"].astype(str).map(is_enqueue_call).astype(bool)]
    if calls.empty:
        return calls
    names = calls["name"].astype(str)
    calls = calls[names == "record_param_comms"] if (names == "record_param_comms").any() else calls
    frame = pd.DataFrame({"step": calls["step"].to_numpy(np.int64), "coll_name": calls["coll_name"].astype(str).to_numpy(),
                          "start_ns": calls["start_ns"].to_numpy(), "nbytes": _nbytes(calls)})
    frame["_nth"] = number(frame, ["step", "coll_name"])
    return frame


def match(instances: pd.DataFrame, key: list[str] | None = None) -> pd.DataFrame:
    """The instances (of every rank) whose collective is matched, with ``group_size``.

    ``key`` (default :data:`KEY`; it holds ``pg_name``) identifies a collective across ranks.
    A collective is matched when every rank seen in its process group has it, and at least two do.
    Sends and receives are left out: :func:`pair_p2p` matches them.
    """
    key = key or KEY
    instances = instances[~is_p2p(instances)]
    if instances.empty:
        return instances.assign(group_size=pd.Series(dtype="int64"))
    members = instances.groupby("pg_name", observed=True)["rank"].nunique()
    size = instances.groupby(key, observed=True)["rank"].transform("nunique")
    complete = (size >= 2) & (size == instances["pg_name"].map(members))
    return instances[complete.to_numpy()].assign(group_size=size[complete].astype("int64")).reset_index(drop=True)


def pair_p2p(frame: pd.DataFrame) -> list[tuple[int, int]]:
    """``(send, recv)`` index pairs of ``frame``'s sends and receives (``rank``, ``peer``,
    ``pg_name``, ``coll_name``, ``occurrence`` numbered per peer): the k-th send of rank a to b in
    a group is the k-th receive of b from a. Those without a peer, or without a partner, are left out."""
    p2p = frame[is_p2p(frame) & (frame["peer"].to_numpy() >= 0)]
    family = p2p["coll_name"].astype(str).map(collective_family)
    sends, recvs = p2p[family == "send"], p2p[family == "recv"]
    key = ["rank", "peer", "pg_name", "occurrence"]
    recv_at = {tuple(k): i for k, i in zip(recvs[key].itertuples(index=False), recvs.index)}
    pairs = []
    for (rank, peer, pg, k), i in zip(sends[key].itertuples(index=False), sends.index):
        j = recv_at.get((peer, rank, pg, k))
        if j is not None:
            pairs.append((int(i), int(j)))
    return pairs
