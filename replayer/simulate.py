"""Replay a :class:`~dpro.graph.dataflow.DataflowGraph`: predicted start and end of every node.

Each node starts once all its inputs allow (``start(v) = max(end(u) + lag)`` over its edges; a
node with no input keeps its measured offset), and lasts its duration. Program-order edges make
each thread and stream a queue; a collective node is shared by its ranks, so it starts when the
last rank arrives. Nodes are evaluated in a topological order.

    >>> result = replay(graph)                              # doctest: +SKIP
    >>> result.step_ns                                      # predicted step time per rank
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpro.errors import DproError
from dpro.graph.dataflow import DataflowGraph


class ReplayError(DproError):
    """The graph cannot be replayed (it has a cycle)."""


@dataclass
class Replay:
    start_ns: np.ndarray
    end_ns: np.ndarray
    step_ns: dict[int, float]
    critical_path: list[int]


def topological_order(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Kahn's algorithm over edge arrays; raises :class:`ReplayError` on a cycle."""
    indegree = np.bincount(dst, minlength=n)
    order_of_out = np.argsort(src, kind="stable")
    out_start = np.searchsorted(src[order_of_out], np.arange(n + 1))
    ready = list(np.flatnonzero(indegree == 0))
    order = []
    while ready:
        u = ready.pop()
        order.append(u)
        for e in order_of_out[out_start[u]:out_start[u + 1]]:
            v = dst[e]
            indegree[v] -= 1
            if indegree[v] == 0:
                ready.append(v)
    if len(order) != n:
        raise ReplayError(f"the graph has a cycle through {n - len(order)} node(s)")
    return np.asarray(order, dtype=np.int64)


def replay(graph: DataflowGraph, durations: np.ndarray | None = None, copies: int = 4) -> Replay:
    """Simulate ``graph``'s step in steady state; ``durations`` overrides node durations (what-if).

    The step is unrolled ``copies`` times: every thread and stream goes on from one copy to the
    next (the first op of a copy follows the last op of the previous one after the measured
    gap, never overlapping it), so GPU work that runs into the next step and skew between ranks
    carry over as in a running job. A rank's predicted step time is the time between the starts
    of its first op in the last two copies; the timeline returned is the last copy's.
    """
    nodes, edges = graph.nodes, graph.edges
    n = len(nodes)
    dur = nodes["dur_ns"].to_numpy(dtype=np.float64) if durations is None else np.asarray(durations, np.float64)
    src, dst = edges["src"].to_numpy(np.int64), edges["dst"].to_numpy(np.int64)
    lag = edges["lag_ns"].to_numpy(np.float64)
    offset = nodes["offset_ns"].to_numpy(np.float64)
    ranks = nodes["rank"].to_numpy()
    wrap_src, wrap_dst, wrap_lag = _wraps(graph, offset, nodes["dur_ns"].to_numpy(np.float64))  # as recorded
    all_src = np.concatenate([src + k * n for k in range(copies)] + [wrap_src + k * n for k in range(copies - 1)])
    all_dst = np.concatenate([dst + k * n for k in range(copies)] + [wrap_dst + (k + 1) * n for k in range(copies - 1)])
    all_lag = np.concatenate([lag] * copies + [wrap_lag] * (copies - 1))
    total = n * copies
    has_input = np.bincount(all_dst, minlength=total) > 0
    earliest = np.where(has_input, -np.inf, np.tile(offset, copies))
    start, end, cause = _simulate(earliest, np.tile(dur, copies), all_src, all_dst, all_lag)
    first = {r: int(np.flatnonzero(ranks == r)[np.argmin(offset[ranks == r])]) for r in sorted(graph.step_ns)}
    step_ns = {r: float(start[(copies - 1) * n + v] - start[(copies - 2) * n + v]) if copies > 1
               else graph.step_ns[r] for r, v in first.items()}
    last = slice((copies - 1) * n, copies * n)
    path, v = [], int(np.argmax(end[last])) + (copies - 1) * n
    while v >= (copies - 1) * n:
        path.append(v - (copies - 1) * n)
        v = int(cause[v])
    return Replay(start[last], end[last], step_ns, path[::-1])


def _wraps(graph: DataflowGraph, offset: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges from the last op of each thread or stream to its first op in the next step.

    The lag is the measured gap across the step boundary (one step later, the first op starts
    again), never negative (a queue does not run two ops at once), and, as for program order
    within the step, without the time the queue sat idle waiting for the first op's other
    inputs (a communication thread waits for the next step's first collective to be issued).
    """
    src, dst, lag = [], [], []
    nodes, edges = graph.nodes, graph.edges
    e_src, e_dst = edges["src"].to_numpy(), edges["dst"].to_numpy()
    inputs_ready = offset[e_src] + dur[e_src] + edges["lag_ns"].to_numpy(np.float64)
    queues = nodes[(nodes["rank"] >= 0) & nodes["kind"].isin(("cpu", "gpu"))]  # not links, not collectives' ends
    for _, group in queues.groupby("resource", sort=False):
        ids = group.index.to_numpy()
        head, tail = ids[np.argmin(offset[ids])], ids[np.argmax(offset[ids] + dur[ids])]
        period = graph.step_ns[int(nodes.at[head, "rank"])]
        gap = max(0.0, offset[head] + period - (offset[tail] + dur[tail]))
        ready = inputs_ready[e_dst == head]
        if ready.size and ready.max() + period > offset[tail] + dur[tail]:
            gap = min(gap, max(0.0, offset[head] - ready.max()))
        src.append(tail)
        dst.append(head)
        lag.append(gap)
    return np.asarray(src, np.int64), np.asarray(dst, np.int64), np.asarray(lag, np.float64)


def _simulate(earliest: np.ndarray, dur: np.ndarray, src: np.ndarray, dst: np.ndarray,
              lag: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Longest-path times: each node starts when its inputs allow, or at ``earliest`` if it has none."""
    n = len(dur)
    by_dst = np.argsort(dst, kind="stable")
    in_start = np.searchsorted(dst[by_dst], np.arange(n + 1))
    start, end = earliest.copy(), np.zeros(n)
    cause = np.full(n, -1)
    for v in topological_order(n, src, dst):
        incoming = by_dst[in_start[v]:in_start[v + 1]]
        if incoming.size:
            ready = end[src[incoming]] + lag[incoming]
            k = int(np.argmax(ready))
            start[v], cause[v] = ready[k], src[incoming[k]]
        end[v] = start[v] + dur[v]
    return start, end, cause
