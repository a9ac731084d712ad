"""Fold a graph whose ranks are identical onto one rank and the shared collectives.

Ranks are identical when each has as many nodes, with the same durations and offsets in graph
order, and as many edges and wraps, which join the same local nodes (or the same collective)
with the same lags, in the same order. Every rank then has the same times as rank 0 and a
collective starts when rank 0's arrival allows, so replaying rank 0 with the collectives is exact;
edges run only within a rank or between a rank and a collective (anything else is not folded).

    >>> f = fold(ranks, dur, offset, src, dst, lag, wraps)     # doctest: +SKIP
    >>> start_of_every_node = folded_start[f.node_of]          # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Wraps = tuple[np.ndarray, np.ndarray, np.ndarray]  # src, dst, lag


@dataclass
class Fold:
    """Rank 0's nodes and the collectives, in graph order, with their edges and wraps renumbered;
    and how to map results back to the whole graph."""

    nodes: np.ndarray  # the graph's node ids of the folded nodes
    src: np.ndarray  # the folded edges (rank 0's, in graph order), over folded node ids
    dst: np.ndarray
    lag: np.ndarray
    wraps: Wraps  # rank 0's wraps, over folded node ids
    node_of: np.ndarray  # per graph node, the folded node with the same times
    rank_row: np.ndarray  # per graph node, its rank's row in ``edge_ids`` (-1: a collective)
    edge_ids: np.ndarray  # ranks x edges per rank: each rank's graph edge ids, in graph order

    def cause_edge(self, folded: np.ndarray) -> np.ndarray:
        """Per graph node, the graph edge that bound its start, from the folded edge (-1: none)
        that bound its folded node's start.

        A rank's node is bound by its own copy of the edge. A collective is bound equally by
        every rank's arrival: the first edge in graph order, as the full replay picks it.
        """
        column = folded[self.node_of]
        if self.edge_ids.size == 0:
            return column
        safe = np.maximum(column, 0)
        own = self.edge_ids[np.maximum(self.rank_row, 0), safe]
        first = self.edge_ids.min(axis=0)[safe]
        return np.where(column < 0, -1, np.where(self.rank_row >= 0, own, first))


def fold(ranks: np.ndarray, dur: np.ndarray, offset: np.ndarray, src: np.ndarray, dst: np.ndarray,
         lag: np.ndarray, wraps: Wraps) -> Fold | None:
    """The fold of a graph with two or more identical ranks; None if the ranks differ."""
    rank_ids = np.unique(ranks[ranks >= 0])
    if len(rank_ids) < 2:
        return None
    rank_row = np.where(ranks >= 0, np.searchsorted(rank_ids, ranks), -1)
    node_ids = _per_rank(rank_row, len(rank_ids))
    if node_ids is None or not (_same_rows(dur[node_ids]) and _same_rows(offset[node_ids])):
        return None
    # Each node's local name: its position in its rank, or ~(its position among the collectives).
    local = np.empty(len(ranks), np.int64)
    local[node_ids] = np.arange(node_ids.shape[1])
    collectives = np.flatnonzero(ranks < 0)
    local[collectives] = ~np.arange(len(collectives))
    wrap_src, wrap_dst, wrap_lag = wraps
    edge_ids = _edges_per_rank(rank_row, local, src, dst, lag)
    wrap_ids = _edges_per_rank(rank_row, local, wrap_src, wrap_dst, wrap_lag)
    if edge_ids is None or wrap_ids is None:
        return None
    nodes = np.flatnonzero(rank_row <= 0)  # rank 0's and the collectives
    folded_id = np.full(len(ranks), -1)
    folded_id[nodes] = np.arange(len(nodes))
    node_of = np.where(rank_row >= 0, folded_id[node_ids[0, np.maximum(local, 0)]], folded_id)
    return Fold(nodes=nodes, src=folded_id[src[edge_ids[0]]], dst=folded_id[dst[edge_ids[0]]], lag=lag[edge_ids[0]],
                wraps=(folded_id[wrap_src[wrap_ids[0]]], folded_id[wrap_dst[wrap_ids[0]]], wrap_lag[wrap_ids[0]]),
                node_of=node_of, rank_row=rank_row, edge_ids=edge_ids)


def _per_rank(row: np.ndarray, ranks: int) -> np.ndarray | None:
    """Ranks x items per rank: the ids of each rank's items (those of ``row`` ``0..ranks-1``), in
    order; None if the ranks have different numbers of items."""
    ids = np.flatnonzero(row >= 0)
    counts = np.bincount(row[ids], minlength=ranks)
    if (counts != counts[0]).any():
        return None
    return ids[np.argsort(row[ids], kind="stable")].reshape(ranks, counts[0])


def _edges_per_rank(rank_row: np.ndarray, local: np.ndarray, src: np.ndarray, dst: np.ndarray,
                    lag: np.ndarray) -> np.ndarray | None:
    """Ranks x edges per rank (see :func:`_per_rank`) if every rank has the same edges in the
    same order, each within the rank or between it and a collective; else None."""
    a, b = rank_row[src], rank_row[dst]
    if ((a >= 0) & (b >= 0) & (a != b)).any() or ((a < 0) & (b < 0)).any():
        return None
    ids = _per_rank(np.maximum(a, b), int(rank_row.max()) + 1)
    if ids is None:
        return None
    same = _same_rows(local[src[ids]]) and _same_rows(local[dst[ids]]) and _same_rows(lag[ids])
    return ids if same else None


def _same_rows(values: np.ndarray) -> bool:
    """Whether every row equals the first."""
    return bool((values == values[:1]).all())
