"""A rank's CPU ops as the cost model reads them: top-level ops, nesting and an op's fixed cost."""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import numpy as np
import pandas as pd

from dpro.run_format import BACKWARD_EVENT_PREFIX

from dpro.analysis.run import RunAnalysis

__all__ = ["ACCUMULATE_GRAD_EVENT", "DDP_FORWARD_EVENT", "FSDP_EVENT_PREFIX", "VIEW_OPS", "cpu_ops", "forward_marks", "once_per_rank",
           "parents", "self_ns", "top_level", "view_op_ns"]

ACCUMULATE_GRAD_EVENT = f"{BACKWARD_EVENT_PREFIX}: torch::autograd::AccumulateGrad"  # a gradient made ready
DDP_FORWARD_EVENT = "DistributedDataParallel.forward"  # DDP's record_function around the model's forward
FSDP_EVENT_PREFIX = "FSDP::"  # FSDP2's record_functions (its hooks, gathers and copies)
VIEW_OPS = ("aten::as_strided", "aten::view", "aten::_reshape_alias", "aten::alias")  # no work: an op's fixed cost

T = TypeVar("T")


def once_per_rank(measure: Callable[[RunAnalysis, int], T]) -> Callable[[RunAnalysis, int], T]:
    """``measure(analysis, rank)`` computed once per run and rank (it depends on the run's traces
    only, and a search asks for it at every prediction), kept by the run model
    (:meth:`~dpro.analysis.run.RunAnalysis.kept`)."""
    name = f"{measure.__module__}.{measure.__qualname__}"

    @functools.wraps(measure)
    def measured(analysis: RunAnalysis, rank: int) -> T:
        return analysis.kept(name, rank, lambda: measure(analysis, rank))

    return measured


def cpu_ops(analysis: RunAnalysis, rank: int) -> pd.DataFrame:
    """``rank``'s CPU ops, sorted by thread, start and longest first (an op before those nested
    in it), with ``end_ns``, indexed from 0."""
    events = analysis.tables(rank).events
    cpu = events[events["cat"] == "cpu_op"]
    cpu = cpu.sort_values(["tid", "start_ns", "dur_ns"], ascending=[True, True, False]).reset_index(drop=True)
    return cpu.assign(end_ns=cpu["start_ns"] + cpu["dur_ns"])


def forward_marks(analysis: RunAnalysis, rank: int) -> pd.DataFrame:
    """DDP's forward annotations on ``rank``'s CPU (not their GPU copies): ``start_ns``,
    ``dur_ns``, ``tid``, ``step``."""
    events = analysis.tables(rank).events
    marks = events[(events["name"] == DDP_FORWARD_EVENT) & (events["cat"] == "user_annotation")]
    return marks[["start_ns", "dur_ns", "tid", "step"]]


def top_level(cpu: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Of :func:`cpu_ops`: which ops are top-level (no op of their thread around them), and each
    op's top-level op (its row)."""
    reach = cpu.groupby("tid")["end_ns"].cummax().groupby(cpu["tid"]).shift(1, fill_value=np.iinfo(np.int64).min)
    top = (cpu["start_ns"] >= reach).to_numpy()
    rows = np.arange(len(cpu))
    owner = pd.Series(np.where(top, rows, -1)).replace(-1, np.nan).ffill()
    return top, np.where(owner.isna(), rows, owner.fillna(0)).astype(np.int64)  # (no owner: an unordered start)


def parents(cpu: pd.DataFrame) -> np.ndarray:
    """Of :func:`cpu_ops`: each op's innermost op around it (its row; -1 for a top-level op)."""
    tid, start, end = (cpu[c].to_numpy() for c in ("tid", "start_ns", "end_ns"))
    parent = np.full(len(cpu), -1, np.int64)
    open_ops: list[int] = []
    for i in range(len(cpu)):
        while open_ops and (tid[open_ops[-1]] != tid[i] or end[open_ops[-1]] <= start[i]):
            open_ops.pop()
        if open_ops:
            parent[i] = open_ops[-1]
        open_ops.append(i)
    return parent


def self_ns(cpu: pd.DataFrame, parent: np.ndarray) -> np.ndarray:
    """Of :func:`cpu_ops`: each op's time outside the ops nested in it."""
    dur = cpu["dur_ns"].to_numpy(np.float64)
    nested = np.zeros(len(cpu))
    np.add.at(nested, parent[parent >= 0], dur[parent >= 0])
    return np.maximum(dur - nested, 0.0)


def view_op_ns(cpu: pd.DataFrame) -> float:
    """What an op that does no work takes: the median of the view ops (0 without any)."""
    views = cpu["name"].astype(str).isin(VIEW_OPS).to_numpy()
    median = cpu.loc[views, "dur_ns"].median()
    return float(median) if median == median else 0.0
