"""Compiled graph kernels of the replay: topological order and longest-path times over edge
arrays, and two helpers (a chain of causes, the least key per group).

Nodes are ``0..n-1``; edge ``e`` goes from ``src[e]`` to ``dst[e]`` with lag ``lag[e]`` and means
``start(dst) >= end(src) + lag``. The kernels are compiled by numba on first use and cached on
disk (``cache=True``), so only the first run after an install pays for the compilation.

    >>> start, end, cause = longest_path(earliest, dur, src, dst, lag)    # doctest: +SKIP
"""

from __future__ import annotations

import numba
import numpy as np

from dpro.errors import DproError


class ReplayError(DproError):
    """The graph cannot be replayed (it has a cycle)."""


@numba.njit(cache=True)
def _out_edges(n: int, src: np.ndarray, dst: np.ndarray, lag: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """CSR of the out-edges: those of node ``u`` are the slots ``ptr[u]:ptr[u + 1]``, by edge
    index; each slot holds the edge's index, head and lag (contiguous, for the sweeps)."""
    ptr = np.zeros(n + 1, np.int64)
    for e in range(src.size):
        ptr[src[e] + 1] += 1
    for u in range(n):
        ptr[u + 1] += ptr[u]
    fill = ptr[:-1].copy()
    edge = np.empty(src.size, np.int64)
    head = np.empty(src.size, np.int64)
    weight = np.empty(src.size, np.float64)
    for e in range(src.size):
        i = fill[src[e]]
        edge[i], head[i], weight[i] = e, dst[e], lag[e]
        fill[src[e]] += 1
    return ptr, edge, head, weight


@numba.njit(cache=True)
def _kahn(n: int, ptr: np.ndarray, head: np.ndarray) -> tuple[np.ndarray, int]:
    """Kahn's algorithm: a topological order and how many nodes it holds (fewer than ``n``: a cycle).

    Ready nodes go on a stack, so a chain of ops is followed while it is ready: consecutive nodes
    are near each other in memory, which makes this and the sweep several times faster on big
    graphs than a queue would.
    """
    indegree = np.zeros(n, np.int64)
    for i in range(head.size):
        indegree[head[i]] += 1
    order = np.empty(n, np.int64)
    stack = np.empty(n, np.int64)
    top = 0
    for v in range(n - 1, -1, -1):
        if indegree[v] == 0:
            stack[top] = v
            top += 1
    count = 0
    while top > 0:
        top -= 1
        u = stack[top]
        order[count] = u
        count += 1
        for i in range(ptr[u + 1] - 1, ptr[u] - 1, -1):
            v = head[i]
            indegree[v] -= 1
            if indegree[v] == 0:
                stack[top] = v
                top += 1
    return order, count


@numba.njit(cache=True)
def _sweep(order: np.ndarray, ptr: np.ndarray, edge: np.ndarray, head: np.ndarray, weight: np.ndarray,
           earliest: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Longest-path start and end times in ``order``, and the edge that bound each start.

    Of several edges that bind a start equally, the one of lowest index is the cause.
    """
    start = earliest.copy()
    end = np.empty(dur.size, np.float64)
    cause = np.full(dur.size, -1, np.int64)
    for u in order:
        end[u] = start[u] + dur[u]
        for i in range(ptr[u], ptr[u + 1]):
            v, e = head[i], edge[i]
            ready = end[u] + weight[i]
            if ready > start[v] or (ready == start[v] and e < cause[v]):
                start[v] = ready
                cause[v] = e
    return start, end, cause


@numba.njit(cache=True)
def _resweep(order: np.ndarray, first: int, ptr: np.ndarray, edge: np.ndarray, tail: np.ndarray,
             weight: np.ndarray, earliest: np.ndarray, dur: np.ndarray, start: np.ndarray, end: np.ndarray,
             cause: np.ndarray) -> None:
    """Recompute, in place, the nodes from position ``first`` of ``order`` on, each from its
    in-edges (CSR by head: ``tail``, ``weight``, ``edge``); the nodes before keep their times.
    Same ties as :func:`_sweep`: the binding edge of lowest index."""
    for i in range(first, order.size):
        v = order[i]
        s, c = earliest[v], -1
        for j in range(ptr[v], ptr[v + 1]):
            ready = end[tail[j]] + weight[j]
            if ready > s or (ready == s and c >= 0 and edge[j] < c):
                s, c = ready, edge[j]
        start[v], cause[v] = s, c
        end[v] = s + dur[v]


@numba.njit(cache=True)
def _group_argmin(group: np.ndarray, key: np.ndarray, groups: int) -> np.ndarray:
    """Per group ``0..groups-1``, the position of its least ``key`` (ties: the first); -1 if empty."""
    best = np.full(groups, -1, np.int64)
    for i in range(group.size):
        g = group[i]
        if best[g] < 0 or key[i] < key[best[g]]:
            best[g] = i
    return best


@numba.njit(cache=True)
def _trace_back(v: int, cause: np.ndarray, src: np.ndarray) -> np.ndarray:
    """The nodes from the start of ``v``'s chain of causes to ``v`` (a cause of -1 ends the chain)."""
    path = [v]
    while cause[v] >= 0:
        v = src[cause[v]]
        path.append(v)
    return np.array(path[::-1], np.int64)


class LongestPaths:
    """Longest-path times over one edge set, for many duration vectors: the structure (both
    CSRs, the topological order) is built once, and :meth:`update` recomputes only the nodes
    at or after the first changed one in topological order."""

    def __init__(self, n: int, src: np.ndarray, dst: np.ndarray, lag: np.ndarray) -> None:
        src, dst = np.ascontiguousarray(src, np.int64), np.ascontiguousarray(dst, np.int64)
        lag = np.ascontiguousarray(lag, np.float64)
        self.out = _out_edges(n, src, dst, lag)
        self.order, count = _kahn(n, self.out[0], self.out[2])
        if count != n:
            raise ReplayError(f"the graph has a cycle through {n - count} node(s)")
        self._edges = (n, src, dst, lag)
        self._into: tuple | None = None  # in-edges and positions, built by the first update

    def times(self, earliest: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Start, end and binding edge of every node (see :func:`longest_path`)."""
        ptr, edge, head, weight = self.out
        return _sweep(self.order, ptr, edge, head, weight, np.ascontiguousarray(earliest, np.float64),
                      np.ascontiguousarray(dur, np.float64))

    def update(self, earliest: np.ndarray, dur: np.ndarray, changed: np.ndarray,
               times: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The times for ``dur``, given the ``times`` of a previous call whose durations
        differed only at the nodes ``changed`` (same ``earliest``)."""
        start, end, cause = (a.copy() for a in times)
        if self._into is None:
            n, src, dst, lag = self._edges
            position = np.empty(n, np.int64)
            position[self.order] = np.arange(n)
            self._into = (*_out_edges(n, dst, src, lag), position)  # by head: the "heads" are the tails
        ptr, edge, tail, weight, position = self._into
        if changed.size:
            _resweep(self.order, int(position[changed].min()), ptr, edge, tail, weight,
                     np.ascontiguousarray(earliest, np.float64), np.ascontiguousarray(dur, np.float64),
                     start, end, cause)
        return start, end, cause


def longest_path(earliest: np.ndarray, dur: np.ndarray, src: np.ndarray, dst: np.ndarray,
                 lag: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start and end of every node, and the index of the edge that bound its start (-1: none).

    A node starts when its inputs allow (``max(end(src) + lag)`` over its in-edges), or at
    ``earliest`` if it has none; raises :class:`ReplayError` on a cycle.
    """
    return LongestPaths(len(dur), src, dst, lag).times(earliest, dur)


def trace_back(v: int, cause: np.ndarray, src: np.ndarray) -> np.ndarray:
    """The chain of nodes whose edges ``cause`` bound one another's start, ending at node ``v``."""
    return _trace_back(int(v), np.ascontiguousarray(cause, np.int64), np.ascontiguousarray(src, np.int64))


def group_argmin(group: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Per group (values ``0..max``, in increasing order, empty groups left out), the position of
    its least ``key``; of equal keys, the first position."""
    if group.size == 0:
        return np.zeros(0, np.int64)
    best = _group_argmin(np.ascontiguousarray(group, np.int64), np.ascontiguousarray(key, np.float64),
                         int(group.max()) + 1)
    return best[best >= 0]
