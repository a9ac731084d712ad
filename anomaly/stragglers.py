"""Stragglers and slow transfers, from the collectives in every rank's trace; slow steps.

**Collective instances** (:func:`collective_instances`). On each rank, the events that do a
collective's work: its NCCL kernels when there are any, else its CPU-side collective events
(``gloo:all_reduce``...; not the ``c10d::*`` calls that only enqueue them). They are matched
across ranks by (step, process group, collective name, occurrence in the step). Start times
are aligned with the ranks' clock offsets.

**Compute stragglers** (:func:`stragglers`). In a collective everyone waits for the last rank
to arrive: the late rank arrives after the others and its own collective is short, since it
waits for no one. For every rank and step, ``late`` is the median (over the step's collectives)
of its arrival after the median arrival, ``short`` the median of how much shorter its
collective is than the median one; the evidence is the smaller of the two, so both must agree
(``short`` does not depend on clock alignment). A rank stands out in a step when that evidence
is a robust outlier against the other ranks (``z >= z_min``, the centre and spread being the
median and 1.4826 × MAD of the other ranks, the spread at least the ranks' own jitter between
collectives) and it costs at least ``min_share`` of the step. It is a suspect when it stands
out in at least half of the profiled steps.

**Slow transfers** (:func:`slow_transfers`). An instance's transfer time is its shortest
duration over the ranks (the last to arrive waits for no one), so arrival skew is taken out.
Instances are compared within a class (collective name, group size and, when known, the
message size rounded to a power of two): an instance is slow when its transfer time is a
robust outlier of its class (``z >= z_min`` on a log scale, the spread at least 1%, and
``min_drop`` longer than the median). A process group slow in at least half of its steps accuses the hosts of its ranks that
are in no process group of the same class found fast; when all its transfers are slow and no
other group is comparable, nothing is there to compare against, and probes must tell.

**Slow steps** (:func:`step_outliers`): steps of the job (median over ranks of ``Run.steps``)
whose duration is a robust outlier; and ranks whose own step time stands out in at least half
of the steps (:func:`step_stragglers`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpro.graph.kineto import TraceTables
from dpro.run_format import Run

from .suspects import Suspect

__all__ = ["collective_instances", "collective_stats", "rank_lateness", "slow_transfers", "step_outliers", "step_stragglers",
           "stragglers"]

Z_MIN = 4.0
MIN_SHARE = 0.02
MIN_DROP = 0.2
KEY = ["step", "pg_name", "coll_name", "occurrence"]
_ITEMSIZE = {"float": 4, "int": 4, "half": 2, "bfloat16": 2, "double": 8, "long": 8, "short": 2, "byte": 1,
             "char": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


def collective_instances(traces: dict[int, TraceTables], offsets: dict[int, int] | None = None) -> pd.DataFrame:
    """One row per rank and collective instance seen on at least two ranks: ``rank``, ``step``,
    ``pg_name``, ``coll_name``, ``occurrence``, ``start_ns`` (aligned), ``dur_ns``, ``nbytes``
    (NaN if unknown); and ``group_size`` (ranks that took part)."""
    frames = []
    for rank, tables in sorted(traces.items()):
        ev = _work_events(tables.events)
        itemsize = ev["dtype"].astype(str).str.lower().map(_ITEMSIZE)
        frame = pd.DataFrame({
            "rank": rank, "step": ev["step"].to_numpy(np.int64),
            "pg_name": ev["pg_name"].astype(object).fillna("").astype(str).to_numpy(),
            "coll_name": ev["coll_name"].astype(str).to_numpy(),
            "start_ns": ev["start_ns"].to_numpy(np.int64) - (offsets or {}).get(rank, 0),
            "dur_ns": ev["dur_ns"].to_numpy(np.int64),
            "nbytes": np.where(ev["in_nelems"].to_numpy() >= 0, ev["in_nelems"].to_numpy() * itemsize.to_numpy(), np.nan),
        }).sort_values("start_ns", kind="stable")
        frame["occurrence"] = frame.groupby(["step", "pg_name", "coll_name"]).cumcount()
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=["rank", *KEY, "start_ns", "dur_ns", "nbytes", "group_size"])
    out = pd.concat(frames, ignore_index=True)
    out["group_size"] = out.groupby(KEY)["rank"].transform("nunique")
    return out[out["group_size"] >= 2].reset_index(drop=True)[["rank", *KEY, "start_ns", "dur_ns", "nbytes", "group_size"]]


def _work_events(events: pd.DataFrame) -> pd.DataFrame:
    """The events that do collectives' work: kernels if any, else outermost CPU events."""
    ev = events[events["coll_name"].notna() & (events["step"] >= 0)]
    kernels = ev[ev["cat"] == "kernel"]
    if len(kernels):
        return kernels
    names = ev["name"].astype(str)
    ev = ev[~names.str.startswith("c10d::") & (names != "record_param_comms") & (ev["stream"] < 0)]
    ev = ev.sort_values(["tid", "start_ns"], kind="stable")
    ends = (ev["start_ns"] + ev["dur_ns"]).groupby(ev["tid"]).cummax()
    previous_end = ends.groupby(ev["tid"]).shift(1).fillna(np.iinfo(np.int64).min)
    return ev[ev["start_ns"].to_numpy() >= previous_end.to_numpy()]


def rank_lateness(instances: pd.DataFrame) -> pd.DataFrame:
    """Per rank and step: ``late_ns`` (median arrival after the median arrival), ``short_ns``
    (median shortfall of its duration against the median duration), ``evidence_ns`` (the
    smaller) and ``jitter_ns`` (1.4826 × MAD of its arrivals after the median, between the
    step's collectives)."""
    df = instances.copy()
    by = df.groupby(KEY)
    df["late_ns"] = df["start_ns"] - by["start_ns"].transform("median")
    df["short_ns"] = by["dur_ns"].transform("median") - df["dur_ns"]
    per = df.groupby(["rank", "step"]).agg(late_ns=("late_ns", "median"), short_ns=("short_ns", "median"),
                                           collectives=("late_ns", "size"))
    per["jitter_ns"] = df.groupby(["rank", "step"])["late_ns"].agg(lambda x: 1.4826 * np.median(np.abs(x - x.median())))
    per["evidence_ns"] = per[["late_ns", "short_ns"]].min(axis=1)
    return per.reset_index()


def collective_stats(instances: pd.DataFrame) -> pd.DataFrame:
    """One row per collective instance: its key, ``ranks`` (tuple), ``skew_ns`` (last arrival
    after the first), ``last_rank`` (the one everyone waited for), ``transfer_ns`` (shortest
    duration over the ranks), ``nbytes`` and ``group_size``."""
    df = instances.sort_values("start_ns", kind="stable")
    return df.groupby(KEY, as_index=False).agg(
        ranks=("rank", lambda r: tuple(sorted(r))), skew_ns=("start_ns", lambda a: a.max() - a.min()),
        last_rank=("rank", "last"), transfer_ns=("dur_ns", "min"), nbytes=("nbytes", "max"),
        group_size=("group_size", "first"))


def stragglers(traces: dict[int, TraceTables], offsets: dict[int, int] | None = None,
               hosts: dict[int, str | None] | None = None, z_min: float = Z_MIN,
               min_share: float = MIN_SHARE) -> list[Suspect]:
    """Ranks the others wait for at collectives in at least half of the profiled steps."""
    instances = collective_instances(traces, offsets)
    if instances.empty:
        return []
    per = rank_lateness(instances)
    step_ns = _profiled_step_ns(traces)
    per["z"] = np.nan
    for _, rows in per.groupby("step"):
        values, jitter = rows["evidence_ns"].to_numpy(float), float(rows["jitter_ns"].median())
        for i, label in enumerate(rows.index):
            others = np.delete(values, i)
            centre = np.median(others)
            spread = max(1.4826 * np.median(np.abs(others - centre)), jitter, 1_000.0)
            per.at[label, "z"] = (values[i] - centre) / spread
    per["share"] = per["evidence_ns"] / per["step"].map(step_ns).astype(float)
    per["out"] = (per["z"] >= z_min) & (per["share"] >= min_share)
    n_steps = per.groupby("rank")["step"].nunique()
    out = []
    for rank, rows in per.groupby("rank"):
        late = rows[rows["out"]]
        if len(late) and 2 * len(late) >= n_steps[rank]:
            host = (hosts or {}).get(rank)
            out.append(Suspect("rank", f"rank {rank}", float(late["z"].median()), rank=int(rank), host=host, evidence={
                "cause": "compute: arrives late at collectives, the others wait",
                "late_ms": round(float(rows["late_ns"].median()) / 1e6, 3),
                "short_ms": round(float(rows["short_ns"].median()) / 1e6, 3),
                "share_of_step": round(float(rows["share"].median()), 3),
                "steps_late": f"{len(late)}/{n_steps[rank]}"}))
    return sorted(out, key=lambda s: -s.score)


def _profiled_step_ns(traces: dict[int, TraceTables]) -> pd.Series:
    """Median over ranks of each profiled step's duration, by step."""
    steps = pd.concat([t.steps.assign(dur=t.steps["end_ns"] - t.steps["start_ns"]) for t in traces.values()])
    return steps.groupby("step")["dur"].median()


def slow_transfers(traces: dict[int, TraceTables], offsets: dict[int, int] | None = None,
                   hosts: dict[int, str | None] | None = None, z_min: float = Z_MIN,
                   min_drop: float = MIN_DROP) -> list[Suspect]:
    """Hosts whose process groups' transfers are persistently slower than comparable ones."""
    instances = collective_instances(traces, offsets)
    if instances.empty:
        return []
    hosts = hosts or {}
    inst = collective_stats(instances)
    size_class = np.where(inst["nbytes"] > 0, np.round(np.log2(inst["nbytes"].where(inst["nbytes"] > 0))), -1)
    inst["class"] = list(zip(inst["coll_name"], inst["group_size"], size_class))
    logs = np.log(inst["transfer_ns"].clip(lower=1).astype(float))
    centre = logs.groupby(inst["class"]).transform("median")
    spread = (logs - centre).abs().groupby(inst["class"]).transform("median") * 1.4826
    inst["z"] = (logs - centre) / spread.clip(lower=0.01)
    inst["slow"] = (inst["z"] >= z_min) & (logs - centre >= np.log1p(min_drop))
    groups = inst.groupby(["pg_name", "ranks", "class"]).agg(
        slow_steps=("step", lambda s: s[inst.loc[s.index, "slow"]].nunique()), steps=("step", "nunique"),
        z=("z", "median"), ratio=("transfer_ns", "median")).reset_index()
    groups["ratio"] /= groups["class"].map(inst.groupby("class")["transfer_ns"].median())
    groups["slow"] = (groups["slow_steps"] > 0) & (2 * groups["slow_steps"] >= groups["steps"])
    out: dict[str, Suspect] = {}
    for _, g in groups[groups["slow"]].iterrows():
        fast = groups[(groups["class"] == g["class"]) & ~groups["slow"]]
        cleared = {hosts.get(r, f"rank {r}") for ranks in fast["ranks"] for r in ranks}
        for r in g["ranks"]:
            host = hosts.get(r, f"rank {r}")
            if host in cleared or (host in out and out[host].score >= g["z"]):
                continue
            out[host] = Suspect("host", host, float(g["z"]), host=hosts.get(r), evidence={
                "cause": "communication: slow transfers, not explained by arrival skew",
                "collective": g["class"][0], "process_group": g["pg_name"], "ranks": list(g["ranks"]),
                "transfer_vs_typical": round(float(g["ratio"]), 2), "steps_slow": f"{g['slow_steps']}/{g['steps']}"})
    return sorted(out.values(), key=lambda s: -s.score)


def _timed_steps(run: Run) -> pd.DataFrame:
    """``step``, ``dur_ns`` and ``rank`` of every timed step of every rank, leaving out the
    profiler's warm-up and trace export, whose time is dpro's own."""
    frames = [s[~s["phase"].isin(("warmup", "export"))].dropna(subset=["dur_ns"]).assign(rank=r)
              for r in run.ranks for s in [run.steps(r)]]
    if not frames:
        return pd.DataFrame({"step": pd.Series(dtype="int64"), "dur_ns": pd.Series(dtype="int64"),
                             "rank": pd.Series(dtype="int64")})
    return pd.concat(frames)[["step", "dur_ns", "rank"]].astype({"dur_ns": "int64"})


def step_outliers(run: Run, z_min: float = Z_MIN, min_drop: float = MIN_DROP) -> pd.DataFrame:
    """Steps of the job (median over ranks of each step's duration): ``step``, ``dur_ns``,
    ``z`` (robust, log scale) and ``slow``; step 0, untimed steps and the profiler's warm-up
    and export steps are left out."""
    job = _timed_steps(run).groupby("step")["dur_ns"].median().rename("dur_ns").reset_index()
    if job.empty:
        return job.assign(z=[], slow=[])
    logs = np.log(job["dur_ns"].clip(lower=1).astype(float))
    excess = logs - logs.median()
    job["z"] = excess / max(1.4826 * float(np.median(np.abs(excess))), 0.01)
    job["slow"] = (job["z"] >= z_min) & (excess >= np.log1p(min_drop))
    return job


def step_stragglers(run: Run, z_min: float = Z_MIN, min_drop: float = MIN_DROP) -> list[Suspect]:
    """Ranks whose own step time stands out against the other ranks' in at least half of the
    steps they timed (as in :func:`step_outliers`)."""
    steps = _timed_steps(run)
    if steps["rank"].nunique() < 2:
        return []
    steps["log"] = np.log(steps["dur_ns"].clip(lower=1).astype(float))
    steps["excess"] = steps["log"] - steps.groupby("step")["log"].transform("median")
    spread = max(1.4826 * float(np.median(np.abs(steps["excess"]))), 0.01)
    steps["out"] = (steps["excess"] / spread >= z_min) & (steps["excess"] >= np.log1p(min_drop))
    out = []
    for rank, rows in steps.groupby("rank"):
        if rows["out"].any() and 2 * rows["out"].sum() >= len(rows):
            out.append(Suspect("rank", f"rank {rank}", float(np.median(rows["excess"][rows["out"]]) / spread),
                               rank=int(rank), host=run.rank_meta(rank).get("host"), evidence={
                                   "cause": "step time: this rank's steps are longer than the others'",
                                   "step_ratio": round(float(np.exp(rows["excess"].median())), 3),
                                   "steps_slow": f"{int(rows['out'].sum())}/{len(rows)}"}))
    return sorted(out, key=lambda s: -s.score)
