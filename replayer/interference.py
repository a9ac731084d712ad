"""Compute and communication slow each other down where they overlap.

On CPUs, gloo's threads take cores from the job's compute; on GPUs, NCCL's kernels take SMs and
memory bandwidth from the compute kernels. A recorded op's duration already holds the
slow-down of the overlap it met in the recording; a change that moves communication (other
buckets, a faster link, compression) changes that overlap, and so the op's duration.

The model: an op of class ``compute`` (CPU and GPU ops off the communication threads and
streams) that overlaps communication on its rank for a fraction ``f`` of its time takes
``1 + s f`` times as long as alone; likewise a send overlapped by compute on either of its
ranks, with its own ``s``. The slow-downs ``s`` come from the run:

- :func:`from_calibration`: ``dpro record``'s calibration times known work alone and while an
  all-reduce runs, and the all-reduce alone and while the main thread computes
  (:mod:`dpro.collectors.calibration`);
- :func:`from_graph`: ops of one name and number of profiler events on one thread found in
  the recorded step both without overlap and fully overlapped: the median ratio of their
  durations (for runs recorded without the calibration).

:func:`overlap` measures ``f`` on a replayed timeline; :func:`relative_slowdown` turns a change
of overlap into a factor on each duration (1 where the overlap did not change, so the replay of
the recorded configuration is left as it was). Both take the graph's :class:`NodeClasses`,
derived once per graph (a what-if replays it several times).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpro.graph.dataflow import DataflowGraph
from dpro.run_records import Calibration

__all__ = ["Interference", "NodeClasses", "from_calibration", "from_graph", "overlap", "relative_slowdown"]

ALONE, OVERLAPPED = 0.05, 0.95  # an op's overlap fraction to count as without and with overlap
MIN_PAIRS = 3  # ops found both ways for the recorded step to give the compute slow-down


@dataclass(frozen=True)
class Interference:
    """Fractional slow-downs: ``compute`` of compute fully overlapped by communication,
    ``comm`` of communication fully overlapped by compute; ``source`` says where they came from."""

    compute: float
    comm: float
    source: str


@dataclass(frozen=True)
class NodeClasses:
    """Per node of a graph: its ``rank``, whether it is ``compute`` (CPU and GPU ops off the
    threads and streams that run collectives) or a ``send``, and the ``receiver`` rank of a
    send (-1 for other nodes)."""

    rank: np.ndarray
    compute: np.ndarray
    send: np.ndarray
    receiver: np.ndarray

    @classmethod
    def of(cls, graph: DataflowGraph) -> NodeClasses:
        nodes = graph.nodes
        kind, resource = nodes["kind"].astype(str), nodes["resource"].astype(str)
        comm = set(resource[kind == "collective"])
        link = resource.str.startswith("link/")
        receiver = np.full(len(nodes), -1, np.int64)
        receiver[link.to_numpy()] = resource[link].str.split("->").str[1].astype(np.int64).to_numpy()
        return cls(nodes["rank"].to_numpy(np.int64), (kind.isin(["cpu", "gpu"]) & ~resource.isin(comm)).to_numpy(),
                   (kind == "transfer").to_numpy(), receiver)


def from_calibration(calibrations: dict[int, Calibration]) -> Interference | None:
    """The median over ranks of the calibration's slow-downs (never below 0: a faster run
    beside communication is noise); ``None`` without a calibration of interference."""
    rows = [c.interference for c in calibrations.values() if c.interference]
    if not rows:
        return None
    compute = np.median([r.compute_beside_comm_ns / r.compute_alone_ns - 1 for r in rows])
    comm = np.median([r.comm_beside_compute_ns / r.comm_alone_ns - 1 for r in rows])
    return Interference(max(float(compute), 0.0), max(float(comm), 0.0), "calibration")


def from_graph(graph: DataflowGraph, fractions: np.ndarray) -> tuple[float, int] | None:
    """The compute slow-down seen in the graph's typical step (``fractions``: :func:`overlap`
    on its replay as recorded) and how many ops it rests on: over ops keyed by thread, name
    and profiler events (not input shapes, which the graph does not hold: a forward and a
    backward op of one name and different sizes may pair) found both alone (overlap <=
    :data:`ALONE`) and overlapped (>= :data:`OVERLAPPED`), the median ratio of their median
    durations, less 1, never below 0. ``None`` if fewer than :data:`MIN_PAIRS` such ops."""
    nodes = graph.nodes
    frame = pd.DataFrame({"resource": nodes["resource"].astype(str), "name": nodes["name"].astype(str),
                          "events": nodes["events"].to_numpy(), "dur": nodes["dur_ns"].to_numpy(np.float64),
                          "f": fractions})[NodeClasses.of(graph).compute & (nodes["dur_ns"].to_numpy(np.float64) > 0)]
    keys = ["resource", "name", "events"]
    alone = frame[frame["f"] <= ALONE].groupby(keys)["dur"].median()
    together = frame[frame["f"] >= OVERLAPPED].groupby(keys)["dur"].median()
    both = alone.index.intersection(together.index)
    if len(both) < MIN_PAIRS:
        return None
    return max(float(np.median(together[both] / alone[both])) - 1, 0.0), len(both)


def overlap(classes: NodeClasses, start: np.ndarray, end: np.ndarray, step_ns: dict[int, float]) -> np.ndarray:
    """Per node (of the graph ``classes`` describe), the fraction of its time during which the
    other class ran on its rank: communication (the sends to and from the rank) for compute,
    compute (on either end) for a send; 0 for every other node. The timeline is one step: the
    neighbouring steps are the same shifted by the rank's ``step_ns``."""
    out = np.zeros(len(start))
    timed = end > start

    def covered(these: np.ndarray, by: np.ndarray, period: float) -> tuple[np.ndarray, np.ndarray]:
        ids = np.flatnonzero(these & timed)
        if not len(ids) or not by.any():
            return ids, np.zeros(len(ids))
        s, e = _periodic(start[by], end[by], period)
        return ids, _covered(s, e, start[ids], end[ids]) / (end[ids] - start[ids])

    for rank, period in step_ns.items():
        sends_here = classes.send & ((classes.rank == rank) | (classes.receiver == rank))
        compute_here = classes.compute & (classes.rank == rank)
        ids, fraction = covered(compute_here, sends_here, period)
        out[ids] = fraction
        ids, fraction = covered(sends_here, compute_here, period)  # a send: the more of its two ends
        out[ids] = np.maximum(out[ids], fraction)
    return np.clip(out, 0.0, 1.0)


def relative_slowdown(classes: NodeClasses, interference: Interference, fractions: np.ndarray,
                      reference: np.ndarray) -> np.ndarray:
    """Per node, its duration at overlap ``fractions`` over its duration at the ``reference``
    overlap (the recorded configuration's)."""
    s = np.zeros(len(fractions))
    s[classes.compute] = interference.compute
    s[classes.send] = interference.comm
    return (1 + s * fractions) / (1 + s * reference)


def _periodic(start: np.ndarray, end: np.ndarray, period: float) -> tuple[np.ndarray, np.ndarray]:
    """The intervals of one step and of its neighbours, ``period`` before and after."""
    shifts = np.array([-period, 0.0, period])[:, None]
    return (start + shifts).ravel(), (end + shifts).ravel()


def _covered(start: np.ndarray, end: np.ndarray, q_start: np.ndarray, q_end: np.ndarray) -> np.ndarray:
    """How much of each query interval ``[q_start, q_end]`` the union of the intervals covers."""
    order = np.argsort(start, kind="stable")
    s, e = start[order], np.maximum.accumulate(end[order])
    first = np.r_[True, s[1:] > e[:-1]]  # a merged interval starts where nothing before reaches
    last = np.r_[np.flatnonzero(first)[1:] - 1, len(s) - 1]
    merged_start, merged_end = s[first], e[last]
    before = np.r_[0.0, np.cumsum(merged_end - merged_start)]

    def covered_until(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(merged_start, t, side="right")
        j = np.maximum(i - 1, 0)
        partial = np.clip(t - merged_start[j], 0.0, merged_end[j] - merged_start[j])
        return np.where(i > 0, before[j] + partial, 0.0)

    return covered_until(q_end) - covered_until(q_start)
