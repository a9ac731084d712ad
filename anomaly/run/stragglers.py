"""Stragglers and slow transfers, from the collectives in every rank's trace; slow steps.

**Collective instances.** The collectives matched across ranks by the run model
(:attr:`dpro.analysis.RunAnalysis.collectives`, from :mod:`dpro.graph.matching`): one row per
rank and instance, keyed by (step, process group, collective name, occurrence in the step),
start times aligned with the refined clock offsets.

**Compute stragglers** (:func:`stragglers`). In a collective everyone waits for the last rank
to arrive: the late rank arrives after the others and its own collective is short, since it
waits for no one. For every rank and step, ``late`` is the most (over the step's collectives:
a straggler is late where its slow part ends, not at every collective) it arrived after the
others' median arrival, ``short`` the most its collective was shorter than the others'; the
evidence is the smaller of the two, so both must agree (``short`` does not depend on clock
alignment). A rank stands out in a step when that evidence is a robust outlier against the
other ranks (``z >= z_min``, the centre and spread being the median and 1.4826 × MAD of the
other ranks, the spread at least the rank's own variation across steps) and it costs at least
``min_share`` of the step. It is a suspect when it stands
out in at least half of the profiled steps.

**Slow transfers** (:func:`slow_transfers`). An instance's transfer time is its shortest
duration over the ranks (the last to arrive waits for no one), so arrival skew is taken out.
Instances are compared within a class (collective name, group size and, when known, the
message size rounded to a power of two): an instance is slow when its transfer time is a
robust outlier of its class (``z >= z_min`` on a log scale, the spread at least 1%, and
``min_drop`` longer than the median). A process group slow in at least half of its steps accuses the hosts of its ranks that
are in no process group of the same class found fast; when all its transfers are slow and no
other group is comparable, nothing is there to compare against, and probes must tell.

**Slow steps** (:func:`step_outliers`): steps of the job (median over ranks of each rank's step times)
whose duration is a robust outlier; and ranks whose own step time stands out in at least half
of the steps (:func:`step_stragglers`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpro.anomaly.suspects import Suspect
from dpro.graph.matching import KEY
from dpro.stats import MAD_SCALE, robust_spread
from dpro.run_format import DPRO_PHASES

__all__ = ["collective_stats", "rank_lateness", "slow_transfers", "step_outliers", "step_stragglers", "stragglers"]

Z_MIN = 4.0
MIN_SHARE = 0.02
MIN_DROP = 0.2


def rank_lateness(instances: pd.DataFrame) -> pd.DataFrame:
    """Per rank and step: ``late_ns`` (the most, over the step's collectives, it arrived after
    the median arrival of the others), ``short_ns`` (the most its collective was shorter than
    the others' median), ``evidence_ns`` (the smaller) and ``jitter_ns`` (1.4826 × MAD of its
    ``evidence_ns`` across the steps: how steady it is)."""
    df = instances.copy()
    df["late_ns"], df["short_ns"] = _against_others(df, "start_ns"), -_against_others(df, "dur_ns")
    per = df.groupby(["rank", "step"]).agg(late_ns=("late_ns", "max"), short_ns=("short_ns", "max"),
                                           collectives=("late_ns", "size"))
    per["evidence_ns"] = per[["late_ns", "short_ns"]].min(axis=1)
    per["jitter_ns"] = per.groupby("rank")["evidence_ns"].transform(robust_spread)
    return per.reset_index()


def _against_others(df: pd.DataFrame, column: str) -> pd.Series:
    """Each rank's ``column`` minus the median of the other ranks' in the same instance."""
    out = pd.Series(np.nan, index=df.index)
    for _, rows in df.groupby(KEY):
        values = rows[column].to_numpy(np.float64)
        for i, label in enumerate(rows.index):
            others = np.delete(values, i)
            out[label] = values[i] - np.median(others) if others.size else 0.0
    return out


def collective_stats(instances: pd.DataFrame) -> pd.DataFrame:
    """One row per collective instance: its key, ``ranks`` (tuple), ``skew_ns`` (last arrival
    after the first), ``last_rank`` (the one everyone waited for), ``transfer_ns`` (shortest
    duration over the ranks), ``nbytes`` and ``group_size``."""
    df = instances.sort_values("start_ns", kind="stable")
    return df.groupby(KEY, as_index=False).agg(
        ranks=("rank", lambda r: tuple(sorted(r))), skew_ns=("start_ns", lambda a: a.max() - a.min()),
        last_rank=("rank", "last"), transfer_ns=("dur_ns", "min"), nbytes=("nbytes", "max"),
        group_size=("group_size", "first"))


def stragglers(instances: pd.DataFrame, profiled_steps: pd.DataFrame, hosts: dict[int, str] | None = None,
               z_min: float = Z_MIN, min_share: float = MIN_SHARE) -> list[Suspect]:
    """Ranks the others wait for at collectives in at least half of the profiled steps.

    ``instances``: matched collective instances, aligned; ``profiled_steps``: ``step``,
    ``start_ns``, ``end_ns`` of each rank's profiled steps."""
    if instances.empty:
        return []
    per = rank_lateness(instances)
    step_ns = (profiled_steps["end_ns"] - profiled_steps["start_ns"]).groupby(profiled_steps["step"]).median()
    per["z"] = np.nan
    for _, rows in per.groupby("step"):
        values, jitter = rows["evidence_ns"].to_numpy(float), float(rows["jitter_ns"].median())
        for i, label in enumerate(rows.index):
            others = np.delete(values, i)
            centre = np.median(others)
            spread = max(robust_spread(others, centre), jitter, 1_000.0)
            per.at[label, "z"] = (values[i] - centre) / spread
    per["share"] = per["evidence_ns"] / per["step"].map(step_ns).astype(float)
    per["out"] = (per["z"] >= z_min) & (per["share"] >= min_share)
    n_steps = per.groupby("rank")["step"].nunique()
    out = []
    for rank, rows in per.groupby("rank"):
        late = rows[rows["out"]]
        if len(late) and 2 * len(late) >= n_steps[rank]:
            host = (hosts or {}).get(rank) or None
            out.append(Suspect("rank", f"rank {rank}", float(late["z"].median()), rank=int(rank), host=host, evidence={
                "cause": "compute: arrives late at collectives, the others wait",
                "late_ms": round(float(rows["late_ns"].median()) / 1e6, 3),
                "short_ms": round(float(rows["short_ns"].median()) / 1e6, 3),
                "share_of_step": round(float(rows["share"].median()), 3),
                "steps_late": f"{len(late)}/{n_steps[rank]}"}))
    return sorted(out, key=lambda s: -s.score)


def slow_transfers(instances: pd.DataFrame, hosts: dict[int, str] | None = None, z_min: float = Z_MIN,
                   min_drop: float = MIN_DROP) -> list[Suspect]:
    """Hosts whose process groups' transfers are persistently slower than comparable ones."""
    if instances.empty:
        return []
    hosts = {r: h for r, h in (hosts or {}).items() if h}
    inst = collective_stats(instances)
    size_class = np.where(inst["nbytes"] > 0, np.round(np.log2(inst["nbytes"].where(inst["nbytes"] > 0))), -1)
    inst["class"] = list(zip(inst["coll_name"], inst["group_size"], size_class))
    logs = np.log(inst["transfer_ns"].clip(lower=1).astype(float))
    centre = logs.groupby(inst["class"]).transform("median")
    spread = (logs - centre).abs().groupby(inst["class"]).transform("median") * MAD_SCALE
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


def _timed_steps(step_times: pd.DataFrame) -> pd.DataFrame:
    """The steps of :attr:`dpro.analysis.RunAnalysis.step_times` that time the job: those of
    :data:`dpro.run_format.DPRO_PHASES` are left out, their extra time is dpro's own."""
    return step_times[~step_times["phase"].isin(DPRO_PHASES)][["step", "dur_ns", "rank"]].copy()


def step_outliers(step_times: pd.DataFrame, z_min: float = Z_MIN, min_drop: float = MIN_DROP) -> pd.DataFrame:
    """Steps of the job (median over ranks of each step's duration): ``step``, ``dur_ns``,
    ``z`` (robust, log scale) and ``slow``; step 0, untimed steps and the profiler's warm-up
    and export steps are left out."""
    job = _timed_steps(step_times).groupby("step")["dur_ns"].median().rename("dur_ns").reset_index()
    if job.empty:
        return job.assign(z=[], slow=[])
    logs = np.log(job["dur_ns"].clip(lower=1).astype(float))
    excess = logs - logs.median()
    job["z"] = excess / max(robust_spread(excess.to_numpy(), 0.0), 0.01)
    job["slow"] = (job["z"] >= z_min) & (excess >= np.log1p(min_drop))
    return job


def step_stragglers(step_times: pd.DataFrame, hosts: dict[int, str] | None = None, z_min: float = Z_MIN,
                    min_drop: float = MIN_DROP) -> list[Suspect]:
    """Ranks whose own step time stands out against the other ranks' in at least half of the
    steps they timed (as in :func:`step_outliers`)."""
    steps = _timed_steps(step_times)
    if steps["rank"].nunique() < 2:
        return []
    steps["log"] = np.log(steps["dur_ns"].clip(lower=1).astype(float))
    steps["excess"] = steps["log"] - steps.groupby("step")["log"].transform("median")
    spread = max(robust_spread(steps["excess"].to_numpy(), 0.0), 0.01)
    steps["out"] = (steps["excess"] / spread >= z_min) & (steps["excess"] >= np.log1p(min_drop))
    out = []
    for rank, rows in steps.groupby("rank"):
        if rows["out"].any() and 2 * rows["out"].sum() >= len(rows):
            out.append(Suspect("rank", f"rank {rank}", float(np.median(rows["excess"][rows["out"]]) / spread),
                               rank=int(rank), host=(hosts or {}).get(rank) or None, evidence={
                                   "cause": "step time: this rank's steps are longer than the others'",
                                   "step_ratio": round(float(np.exp(rows["excess"].median())), 3),
                                   "steps_slow": f"{int(rows['out'].sum())}/{len(rows)}"}))
    return sorted(out, key=lambda s: -s.score)
