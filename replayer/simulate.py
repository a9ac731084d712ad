"""Replay a :class:`~dpro.graph.dataflow.DataflowGraph`: predicted start and end of every node.

Each node starts once all its inputs allow (``start(v) = max(end(u) + lag)`` over its edges; a
node with no input keeps its measured offset), and lasts its duration. Program-order edges make
each thread and stream a queue; a collective's sends wait for the ranks at both ends, so a
collective goes on when its last rank arrives. Times are longest paths, computed by the compiled kernels of
:mod:`dpro.replayer.kernels`.

    >>> result = replay(graph)                              # doctest: +SKIP
    >>> result.step_ns                                      # predicted step time per rank
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpro.graph.dataflow import DataflowGraph

from .kernels import ReplayError, group_argmin, longest_path, trace_back
from .symmetry import fold

__all__ = ["Replay", "ReplayError", "replay"]


@dataclass
class Replay:
    """The predicted timeline of the last unrolled step.

    ``start_ns``, ``end_ns``: per node of the graph. ``step_ns``: predicted step time per rank.
    ``critical_path``: the nodes, first to last, whose edges bound one another's start up to the
    node that ends last. ``cause_edge``: per node, the row of ``graph.edges`` whose edge bound its
    start (of equally binding edges, the first row); -1 if nothing did (it started at its offset)
    or if it was bound by the previous step (a thread or stream going on from one step to the next).
    """

    start_ns: np.ndarray
    end_ns: np.ndarray
    step_ns: dict[int, float]
    critical_path: list[int]
    cause_edge: np.ndarray


def replay(graph: DataflowGraph, durations: np.ndarray | None = None, copies: int = 4,
           symmetric: bool = True) -> Replay:
    """Simulate ``graph``'s step in steady state; ``durations`` overrides node durations (what-if).

    The step is unrolled ``copies`` times: every thread and stream goes on from one copy to the
    next (the first op of a copy follows the last op of the previous one after the measured
    gap, never overlapping it), so GPU work that runs into the next step and skew between ranks
    carry over as in a running job. A rank's predicted step time is the time between the starts
    of its first op in the last two copies; the timeline returned is the last copy's.

    If the ranks are identical (``symmetric``, see :mod:`dpro.replayer.symmetry`), one rank and
    the collectives are replayed and the result is mapped to every rank: exact, with a graph as
    many times smaller as there are ranks. ``symmetric=False`` replays the whole graph.
    """
    nodes, edges = graph.nodes, graph.edges
    dur = nodes["dur_ns"].to_numpy(np.float64) if durations is None else np.asarray(durations, np.float64)
    offset = nodes["offset_ns"].to_numpy(np.float64)
    ranks = nodes["rank"].to_numpy(np.int64)
    src, dst = edges["src"].to_numpy(np.int64), edges["dst"].to_numpy(np.int64)
    lag = edges["lag_ns"].to_numpy(np.float64)
    wraps = _wraps(graph, offset, nodes["dur_ns"].to_numpy(np.float64))  # as recorded, whatever the what-if
    folded = fold(ranks, dur, offset, src, dst, lag, wraps) if symmetric else None
    if folded is None:
        start, end, cause = _unrolled(offset, dur, src, dst, lag, wraps, copies)
    else:
        start, end, cause = _unrolled(offset[folded.nodes], dur[folded.nodes], folded.src, folded.dst,
                                      folded.lag, folded.wraps, copies)
        start, end, cause = start[:, folded.node_of], end[:, folded.node_of], folded.cause_edge(cause)
    first = _first_nodes(ranks, offset)
    step_ns = {r: float(start[-1, first[r]] - start[-2, first[r]]) if copies > 1 else graph.step_ns[r]
               for r in sorted(graph.step_ns)}
    path = trace_back(int(np.argmax(end[-1])), cause, src)
    return Replay(start[-1], end[-1], step_ns, path.tolist(), cause)


def _unrolled(offset: np.ndarray, dur: np.ndarray, src: np.ndarray, dst: np.ndarray, lag: np.ndarray,
             wraps: tuple[np.ndarray, np.ndarray, np.ndarray], copies: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start and end times of ``copies`` unrolled steps (arrays ``copies × nodes``), and the cause
    edge (index into ``src``; -1 if none or a wrap) of every node in the last copy.

    Copy ``k`` holds the nodes ``k * n ..`` and the edges ``k * m ..``; the wraps, from each copy to
    the next, come after all of them. Nodes without an input start at their ``offset``.
    """
    n, m = len(dur), len(src)
    wrap_src, wrap_dst, wrap_lag = wraps
    step = np.arange(copies, dtype=np.int64)[:, None] * n
    all_src = np.concatenate([(src + step).ravel(), (wrap_src + step[:-1]).ravel()])
    all_dst = np.concatenate([(dst + step).ravel(), (wrap_dst + step[1:]).ravel()])
    all_lag = np.concatenate([np.tile(lag, copies), np.tile(wrap_lag, copies - 1)])
    has_input = np.bincount(dst, minlength=n) > 0
    wrapped = has_input.copy()
    wrapped[wrap_dst] = True  # from the second copy on
    earliest = np.where(np.r_[has_input, np.tile(wrapped, copies - 1)], -np.inf, np.tile(offset, copies))
    start, end, cause = longest_path(earliest, np.tile(dur, copies), all_src, all_dst, all_lag)
    last = cause[(copies - 1) * n:] - (copies - 1) * m
    last[(last < 0) | (last >= m)] = -1
    return start.reshape(copies, n), end.reshape(copies, n), last


def _wraps(graph: DataflowGraph, offset: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges from the last op of each thread or stream to its first op in the next step.

    The lag is the measured gap across the step boundary (one step later, the first op starts
    again), never negative (a queue does not run two ops at once), and, as for program order
    within the step, without the time the queue sat idle waiting for the first op's other
    inputs (a communication thread waits for the next step's first collective to be issued).
    Queues are the CPU threads and GPU streams (links and collectives' ends are not). The first
    op is the one that starts first, the last the one that ends last (ties: the earlier node);
    one wrap per queue, in order of the queues' first node.
    """
    nodes, edges = graph.nodes, graph.edges
    ranks = nodes["rank"].to_numpy(np.int64)
    resource = pd.factorize(nodes["resource"], sort=False)[0]  # numbered by first node
    ids = np.flatnonzero((ranks >= 0) & nodes["kind"].isin(("cpu", "gpu")).to_numpy())
    head = ids[group_argmin(resource[ids], offset[ids])]
    tail = ids[group_argmin(resource[ids], -(offset[ids] + dur[ids]))]
    period = pd.Series(graph.step_ns, dtype=np.float64).reindex(ranks[head]).to_numpy()
    tail_end = offset[tail] + dur[tail] - period  # in the head's step
    lag = np.maximum(0.0, offset[head] - tail_end)
    e_src, e_dst = edges["src"].to_numpy(np.int64), edges["dst"].to_numpy(np.int64)
    ready = np.full(len(offset), -np.inf)
    np.maximum.at(ready, e_dst, offset[e_src] + dur[e_src] + edges["lag_ns"].to_numpy(np.float64))
    idle = ready[head] > tail_end
    lag[idle] = np.minimum(lag[idle], np.maximum(0.0, offset[head][idle] - ready[head][idle]))
    return tail, head, lag


def _first_nodes(ranks: np.ndarray, offset: np.ndarray) -> dict[int, int]:
    """Each rank's node that starts first (ties: the earlier node)."""
    ids = np.flatnonzero(ranks >= 0)
    firsts = ids[group_argmin(ranks[ids], offset[ids])]
    return dict(zip(ranks[firsts].tolist(), firsts.tolist()))
