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

import numpy as np

from dpro.graph.dataflow import DataflowGraph

from dpro.replayer.kernels import LongestPaths, ReplayError, group_argmin, trace_back
from dpro.replayer.result import Replay
from dpro.replayer.symmetry import fold

__all__ = ["Replay", "ReplayError", "Replayer", "replay"]


def replay(graph: DataflowGraph, durations: np.ndarray | None = None, copies: int = 4,
           symmetric: bool = True) -> Replay:
    """Simulate ``graph``'s step in steady state; ``durations`` overrides node durations (what-if).

    The step is unrolled ``copies`` times: every thread and stream goes on from one copy to the
    next (the first op of a copy follows the last op of the previous one after the measured
    gap, never overlapping it), so GPU work that runs into the next step and skew between ranks
    carry over as in a running job. A rank's predicted step time is the time between the starts
    of its first op in the last two copies (with one copy, from its first op's start to its
    last op's end); the timeline returned is the last copy's. The recorded step time is never
    an input.

    If the ranks are identical (``symmetric``, see :mod:`dpro.replayer.symmetry`), one rank and
    the collectives are replayed and the result is mapped to every rank: exact, with a graph as
    many times smaller as there are ranks. ``symmetric=False`` replays the whole graph.
    """
    nodes, edges = graph.nodes, graph.edges
    dur = nodes["dur_ns"].to_numpy(np.float64) if durations is None else np.asarray(durations, np.float64)
    folded = None
    if symmetric:
        offset = nodes["offset_ns"].to_numpy(np.float64)
        src, dst = edges["src"].to_numpy(np.int64), edges["dst"].to_numpy(np.int64)
        wraps = _wraps(graph, offset, nodes["dur_ns"].to_numpy(np.float64))
        folded = fold(nodes["rank"].to_numpy(np.int64), dur, offset, src, dst, edges["lag_ns"].to_numpy(np.float64),
                      wraps)
    if folded is None:
        return Replayer(graph, copies).replay(dur)
    start, end, cause = _Unrolled(offset[folded.nodes], folded.src, folded.dst, folded.lag, folded.wraps,
                                  copies).times(dur[folded.nodes])
    start, end, cause = start[:, folded.node_of], end[:, folded.node_of], folded.cause_edge(cause)
    return _result(graph, start, end, cause, copies)


class Replayer:
    """One graph prepared for many replays with different durations (what-if questions).

    The unrolled graph and its topological order are built once; each :meth:`replay`
    recomputes only the nodes at or after the first one (in topological order) whose duration
    differs from the previous call's.

        >>> replayer = Replayer(graph)                                     # doctest: +SKIP
        >>> replayer.replay(durations_a).step_ns, replayer.replay(durations_b).step_ns  # doctest: +SKIP
    """

    def __init__(self, graph: DataflowGraph, copies: int = 4) -> None:
        nodes, edges = graph.nodes, graph.edges
        offset = nodes["offset_ns"].to_numpy(np.float64)
        self.graph, self.copies = graph, copies
        self._unrolled = _Unrolled(offset, edges["src"].to_numpy(np.int64), edges["dst"].to_numpy(np.int64),
                                   edges["lag_ns"].to_numpy(np.float64),
                                   _wraps(graph, offset, nodes["dur_ns"].to_numpy(np.float64)), copies)
        self._previous: tuple[np.ndarray, tuple] | None = None

    def replay(self, durations: np.ndarray | None = None) -> Replay:
        """The replay with ``durations`` (default: the recorded ones)."""
        dur = self.graph.nodes["dur_ns"].to_numpy(np.float64) if durations is None else np.asarray(durations, np.float64)
        previous = self._previous
        if previous is None or previous[0].shape != dur.shape:
            times = self._unrolled.run(dur)
        else:
            times = self._unrolled.run(dur, np.flatnonzero(dur != previous[0]), previous[1])
        self._previous = (dur.copy(), times)
        return _result(self.graph, *self._unrolled.shape(times), self.copies)


def _result(graph: DataflowGraph, start: np.ndarray, end: np.ndarray, cause: np.ndarray, copies: int) -> Replay:
    """The :class:`Replay` of unrolled times (``copies × nodes``) and last-copy causes."""
    nodes = graph.nodes
    first = _first_nodes(nodes["rank"].to_numpy(np.int64), nodes["offset_ns"].to_numpy(np.float64))
    ranks = nodes["rank"].to_numpy(np.int64)
    step_ns = {r: float(start[-1, first[r]] - start[-2, first[r]]) if copies > 1
               else float(end[-1, ranks == r].max() - start[-1, first[r]]) for r in sorted(graph.step_ns)}
    path = trace_back(int(np.argmax(end[-1])), cause, graph.edges["src"].to_numpy(np.int64))
    return Replay(start[-1], end[-1], step_ns, path.tolist(), cause)


class _Unrolled:
    """``copies`` unrolled steps of a graph: copy ``k`` holds the nodes ``k * n ..`` and the
    edges ``k * m ..``; the wraps, from each copy to the next, come after all of them. Nodes
    without an input start at their ``offset``."""

    def __init__(self, offset: np.ndarray, src: np.ndarray, dst: np.ndarray, lag: np.ndarray,
                 wraps: tuple[np.ndarray, np.ndarray, np.ndarray], copies: int) -> None:
        n, m = len(offset), len(src)
        wrap_src, wrap_dst, wrap_lag = wraps
        step = np.arange(copies, dtype=np.int64)[:, None] * n
        all_src = np.concatenate([(src + step).ravel(), (wrap_src + step[:-1]).ravel()])
        all_dst = np.concatenate([(dst + step).ravel(), (wrap_dst + step[1:]).ravel()])
        all_lag = np.concatenate([np.tile(lag, copies), np.tile(wrap_lag, copies - 1)])
        has_input = np.bincount(dst, minlength=n) > 0
        wrapped = has_input.copy()
        wrapped[wrap_dst] = True  # from the second copy on
        self.earliest = np.where(np.r_[has_input, np.tile(wrapped, copies - 1)], -np.inf, np.tile(offset, copies))
        self.paths = LongestPaths(n * copies, all_src, all_dst, all_lag)
        self.n, self.m, self.copies = n, m, copies

    def run(self, dur: np.ndarray, changed: np.ndarray | None = None,
            previous: tuple | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Unrolled times for per-node ``dur``; with ``previous`` times whose durations differed
        at the nodes ``changed``, only what follows them is recomputed."""
        dur_all = np.tile(dur, self.copies)
        if previous is None:
            return self.paths.times(self.earliest, dur_all)
        every_copy = (changed[None, :] + self.n * np.arange(self.copies)[:, None]).ravel()
        return self.paths.update(self.earliest, dur_all, every_copy, previous)

    def shape(self, times: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Start and end as ``copies × nodes``, and the cause edge (index into the graph's edges;
        -1 if none or a wrap) of every node in the last copy."""
        start, end, cause = times
        last = cause[(self.copies - 1) * self.n:] - (self.copies - 1) * self.m
        last[(last < 0) | (last >= self.m)] = -1
        return start.reshape(self.copies, self.n), end.reshape(self.copies, self.n), last

    def times(self, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.shape(self.run(dur))


def _wraps(graph: DataflowGraph, offset: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The graph's wraps (from the last op of each thread or stream to its first op in the next
    step), each lag cut to what the queue really needs between steps.

    The measured gap (``graph.wraps``) is never negative in the replay (a queue does not run two
    ops at once), and, as for program order within the step, loses the time the queue sat idle
    waiting for the first op's other inputs (a communication thread waits for the next step's
    first collective to be issued): in the first op's step, the last op ended ``gap`` before it
    started; if its other inputs came later, only the latency after them is kept.
    """
    wraps, edges = graph.wraps, graph.edges
    tail, head = wraps["src"].to_numpy(np.int64), wraps["dst"].to_numpy(np.int64)
    gap = wraps["lag_ns"].to_numpy(np.float64)
    lag = np.maximum(0.0, gap)
    e_src, e_dst = edges["src"].to_numpy(np.int64), edges["dst"].to_numpy(np.int64)
    ready = np.full(len(offset), -np.inf)
    np.maximum.at(ready, e_dst, offset[e_src] + dur[e_src] + edges["lag_ns"].to_numpy(np.float64))
    idle = ready[head] > offset[head] - gap
    lag[idle] = np.minimum(lag[idle], np.maximum(0.0, offset[head][idle] - ready[head][idle]))
    return tail, head, lag


def _first_nodes(ranks: np.ndarray, offset: np.ndarray) -> dict[int, int]:
    """Each rank's node that starts first (ties: the earlier node)."""
    ids = np.flatnonzero(ranks >= 0)
    firsts = ids[group_argmin(ranks[ids], offset[ids])]
    return dict(zip(ranks[firsts].tolist(), firsts.tolist()))
