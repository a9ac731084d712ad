"""Fold a recorded graph onto one median rank: identical-rank folding, approximated, for fast
what-if replays.

:mod:`dpro.replayer.symmetry` folds ranks that are identical, and is exact. A recorded run's
ranks never are: each op lasts a little longer or shorter on each rank, and a tree collective's
sends differ from rank to rank. When every rank runs the same ops in the same order (the same
kind and name at each position of its ops, the collectives' sends apart), the graph still folds
onto one rank that stands for all of them:

- the ops at one position become one op, lasting the median over ranks of their durations,
  from their median offset;
- the sends of one step of a collective become one send (alike ranks all send at once), lasting
  the median of the step's sends;
- each edge joins what its two ends fold to, with the median lag of the edges that fold
  together (an edge within one folded node is dropped); the wraps likewise.

Replayed, the folded graph gives every rank the median rank's times, with as many times fewer
nodes as there are ranks; stragglers, skew between ranks and a tree's uneven depths are gone (a
collective ends on every rank when its last step ends, each rank's own end lasting the median
rank's). What that costs a prediction is measured by the search's switch (:class:`dpro.optimizer.search.Tricks`).

    >>> folded = median_rank(graph)                               # doctest: +SKIP
    >>> replay = folded.unfold(Replayer(folded.graph).replay(folded.fold(durations)))  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpro.graph.dataflow import DataflowGraph

from dpro.replayer.result import Replay

__all__ = ["MedianRank", "median_rank"]


@dataclass
class MedianRank:
    """A graph folded onto its median rank, and how to map values to it and results back."""

    graph: DataflowGraph  # the folded graph: every node on the first rank
    node_of: np.ndarray  # per node of the whole graph, its folded node
    members: np.ndarray  # folded nodes x members: the whole graph's nodes folded into each (-1: none)
    edge_key: np.ndarray  # the whole graph's edges by (folded edge, dst), sorted: folded edge * nodes + dst
    edge_id: np.ndarray  # ... and their ids in the whole graph, in that order
    ranks: list[int]
    source_nodes: pd.DataFrame  # the whole graph's nodes

    def fold(self, values: np.ndarray) -> np.ndarray:
        """Per folded node, the median of ``values`` (per node of the whole graph) over its members."""
        return _median_of(self.members, values)

    def unfold(self, replay: Replay) -> Replay:
        """A replay of the folded graph as one of the whole graph: each node at its folded node's
        times, each rank with the folded rank's step time, each node bound by its own copy of the
        edge that bound its folded node, and the critical path through the first rank's nodes."""
        n = len(self.node_of)
        cause = np.full(n, -1, np.int64)
        if len(self.edge_key):
            folded_cause = replay.cause_edge[self.node_of]
            key = np.maximum(folded_cause, 0) * n + np.arange(n)
            at = np.minimum(np.searchsorted(self.edge_key, key), len(self.edge_key) - 1)
            cause = np.where((folded_cause >= 0) & (self.edge_key[at] == key), self.edge_id[at], -1)
        step = next(iter(replay.step_ns.values()))
        return Replay(replay.start_ns[self.node_of], replay.end_ns[self.node_of], {r: step for r in self.ranks},
                      self.members[replay.critical_path, 0].tolist(), cause)


def median_rank(graph: DataflowGraph, previous: MedianRank | None = None) -> MedianRank | None:
    """``graph`` folded onto its median rank (see the module docstring); None if it has fewer
    than two ranks or its ranks do not run the same ops. ``previous``: the
    fold of a graph with the same nodes (other edges), whose nodes' fold is reused."""
    nodes = graph.nodes
    if previous is not None and previous.source_nodes is nodes:
        node_of, members, ranks = previous.node_of, previous.members, previous.ranks
        folded_nodes = previous.graph.nodes
    else:
        fold = _fold_nodes(nodes)
        if fold is None:
            return None
        node_of, members, ranks = fold
        folded_nodes = nodes.iloc[members[:, 0]].reset_index(drop=True).assign(rank=ranks[0])
        for column in ("dur_ns", "offset_ns"):
            folded_nodes[column] = _median_of(members, nodes[column].to_numpy(np.float64))
    edges, edge_key, edge_id = _fold_edges(graph.edges, node_of, drop_loops=True)
    wraps, _, _ = _fold_edges(graph.wraps, node_of, drop_loops=False)
    folded = dataclasses.replace(graph, nodes=folded_nodes, edges=edges, wraps=wraps,
                                 step_ns={ranks[0]: float(np.median(list(graph.step_ns.values())))},
                                 start_ns={ranks[0]: 0.0}, collectives=pd.DataFrame(),
                                 hosts={ranks[0]: graph.hosts.get(ranks[0], "")})
    return MedianRank(folded, node_of, members, edge_key, edge_id, ranks, nodes)


def _fold_nodes(nodes: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, list[int]] | None:
    """Per node, its folded node; per folded node, its members (the first rank's op, or the
    first rank's send of the step, first); the ranks. None if the ranks' ops differ."""
    rank = nodes["rank"].to_numpy(np.int64)
    kind = nodes["kind"].astype(str).to_numpy(object)
    name = nodes["name"].astype(str).to_numpy(object)
    ranks = np.unique(rank)
    if len(ranks) < 2 or ranks[0] < 0:
        return None
    send = kind == "transfer"
    by_rank = _same_ops(np.flatnonzero(~send), rank, ranks, kind, name, nodes["offset_ns"].to_numpy(np.float64))
    if by_rank is None:
        return None
    sends = np.flatnonzero(send)
    steps, step_of = np.unique(name[sends], return_inverse=True)  # a send's name is its collective and step
    order = np.lexsort((sends, rank[sends] != ranks[0], step_of))
    sends, step_of = sends[order], step_of[order]
    group_start = np.searchsorted(step_of, np.arange(len(steps)))
    place = np.arange(len(sends)) - group_start[step_of]
    width = max(len(ranks), int(place.max()) + 1 if len(sends) else 0)
    positions = by_rank.shape[1]
    members = np.full((positions + len(steps), width), -1, np.int64)
    members[:positions, :len(ranks)] = by_rank.T
    members[positions + step_of, place] = sends
    node_of = np.empty(len(nodes), np.int64)
    node_of[by_rank] = np.arange(positions)
    node_of[sends] = positions + step_of
    return node_of, members, [int(r) for r in ranks]


def _same_ops(ops: np.ndarray, rank: np.ndarray, ranks: np.ndarray, kind: np.ndarray, name: np.ndarray,
              offset: np.ndarray) -> np.ndarray | None:
    """Ranks x positions: each rank's op at each position of the first rank's ops (in graph order),
    matched by kind, name and occurrence in time (the k-th ``gloo:all_reduce`` of each rank,
    whichever thread ran it); None unless every rank has the same ops."""
    frame = pd.DataFrame({"id": ops, "rank": rank[ops], "what": pd.Series(kind[ops]) + "/" + name[ops],
                          "offset": offset[ops]}).sort_values(["rank", "what", "offset", "id"], kind="stable")
    frame["nth"] = frame.groupby(["rank", "what"], sort=False).cumcount()
    first = frame[frame["rank"] == ranks[0]].sort_values("id")
    first = first.assign(position=np.arange(len(first)))
    placed = frame.merge(first[["what", "nth", "position"]], on=["what", "nth"], how="left")
    counts = placed.groupby("rank").size()
    if placed["position"].isna().any() or (counts != len(first)).any() or len(counts) != len(ranks):
        return None
    by_rank = np.empty((len(ranks), len(first)), np.int64)
    by_rank[np.searchsorted(ranks, placed["rank"].to_numpy()), placed["position"].to_numpy(np.int64)] = \
        placed["id"].to_numpy()
    return by_rank


def _median_of(members: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per row of ``members`` (node ids, -1 for none), the median of ``values`` over its nodes."""
    padded = np.where(members >= 0, values[np.maximum(members, 0)], np.nan)
    return np.nanmedian(padded, axis=1)


def _fold_edges(edges: pd.DataFrame, node_of: np.ndarray, drop_loops: bool) -> tuple[pd.DataFrame, np.ndarray,
                                                                                     np.ndarray]:
    """``edges`` between the folded nodes their ends fold to, one per pair (in order of its first
    edge; median lag; the first edge's other columns); and the whole graph's edges keyed by
    folded edge and destination, sorted, with their ids (see :attr:`MedianRank.edge_key`)."""
    src, dst = node_of[edges["src"].to_numpy(np.int64)], node_of[edges["dst"].to_numpy(np.int64)]
    keep = src != dst if drop_loops else np.ones(len(src), bool)
    kept = np.flatnonzero(keep)
    pairs, first, which = np.unique(src[kept] * len(node_of) + dst[kept], return_index=True, return_inverse=True)
    by_first = np.argsort(first, kind="stable")  # folded edges in order of their first edge
    renumber = np.empty(len(pairs), np.int64)
    renumber[by_first] = np.arange(len(pairs))
    lag = pd.Series(edges["lag_ns"].to_numpy(np.float64)[kept]).groupby(renumber[which]).median().to_numpy()
    folded = edges.iloc[kept[first[by_first]]].reset_index(drop=True).assign(
        src=src[kept[first[by_first]]], dst=dst[kept[first[by_first]]])
    folded["lag_ns"] = lag
    key = renumber[which] * len(node_of) + edges["dst"].to_numpy(np.int64)[kept]
    order = np.argsort(key, kind="stable")
    return folded, key[order], kept[order]
