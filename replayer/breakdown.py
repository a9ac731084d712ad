"""What a rank's predicted step waits on: its critical path, split into kinds of time.

The critical path of rank ``r`` is the chain of nodes whose edges bound one another's start,
ending at the node of ``r`` that ends last in the predicted step. Each stretch of it is:

- ``compute``: an op of ``r`` (a GPU kernel or copy, or a CPU op that launches nothing the path
  then waits for);
- ``launch_bound``: CPU ops of ``r`` whose launch the path's next GPU op waited for (the GPU
  was starved by the CPU);
- ``communication``: sends of a collective, once every rank has arrived (exposed: nothing of
  ``r``'s ran in its place), and what a rank's own end of it took beyond the others'; also
  split by the collective's process group (``communication_by_group_ms``: a mesh's data- and
  tensor-parallel groups, a pipeline's sends);
- ``waiting``: ops and gaps of other ranks (``r`` was waiting for a slower rank to arrive);
- ``idle``: gaps between ``r``'s own ops on the path (scheduling, Python overhead, latency).

The stretches add up to the path's span, from its first node to its end; none is negative.

    >>> breakdown(graph, replay(graph), rank=0)            # doctest: +SKIP
    {'rank': 0, 'span_ms': 81.2, 'compute_ms': 60.1, 'communication_ms': 12.3, ...}
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpro.graph.dataflow import DataflowGraph

from dpro.replayer.result import Replay

CATEGORIES = ("compute", "launch_bound", "communication", "waiting", "idle")


def rank_critical_path(graph: DataflowGraph, result: Replay, rank: int | None = None) -> list[int]:
    """The nodes of the critical path ending at ``rank``'s last-ending node (any rank if None)."""
    ranks = graph.nodes["rank"].to_numpy()
    candidates = np.flatnonzero(ranks == rank) if rank is not None else np.arange(len(ranks))
    v = int(candidates[np.argmax(result.end_ns[candidates])])
    src = graph.edges["src"].to_numpy()
    path = [v]
    while result.cause_edge[v] >= 0:
        v = int(src[result.cause_edge[v]])
        path.append(v)
    return path[::-1]


def breakdown(graph: DataflowGraph, result: Replay, rank: int | None = None) -> dict[str, Any]:
    """Milliseconds of each category (see the module docstring) on ``rank``'s critical path."""
    nodes, edges = graph.nodes, graph.edges
    path = rank_critical_path(graph, result, rank)
    owner = int(nodes.at[path[-1], "rank"]) if rank is None else rank
    kinds = nodes["kind"].to_numpy()
    ranks = nodes["rank"].to_numpy()
    edge_kind = edges["kind"].to_numpy()
    start, end = result.start_ns, result.end_ns
    totals = dict.fromkeys(CATEGORIES, 0.0)
    groups = nodes["pg_name"].astype(object).fillna("").astype(str).to_numpy() if "pg_name" in nodes \
        else np.full(len(nodes), "", object)
    by_group: dict[str, float] = {}
    launch_bound = _launch_bound(path, kinds, edge_kind, result.cause_edge)
    frontier = start[path[0]]
    for i, v in enumerate(path):
        # v's stretch runs from its start to the next node's start (a launched kernel may start
        # before its launching op ends: the op's stretch ends there); past v's end, it is a gap.
        # Stretches never run backwards: a node the path reaches through a negative lag (a
        # thread that woke before its collective's recorded end) starts at the frontier.
        begin = max(start[v], frontier)
        upto = max(start[path[i + 1]] if i + 1 < len(path) else end[v], begin)
        took, gap = max(min(end[v], upto) - begin, 0.0), max(upto - max(end[v], begin), 0.0)
        frontier = upto
        mine = ranks[v] == owner
        if kinds[v] in ("transfer", "collective"):  # a rank's end of a collective: the part it took beyond the others
            totals["communication"] += took
            by_group[groups[v]] = by_group.get(groups[v], 0.0) + took
        elif not mine:
            totals["waiting"] += took
        else:
            totals["launch_bound" if v in launch_bound else "compute"] += took
        if gap > 0:
            after = path[i + 1] if i + 1 < len(path) else v
            totals["idle" if mine and ranks[after] == owner else "waiting"] += gap
    span = frontier - start[path[0]]
    return {"rank": owner, "span_ms": float(span) / 1e6, **{f"{k}_ms": float(v) / 1e6 for k, v in totals.items()},
            "communication_by_group_ms": {g: float(t) / 1e6 for g, t in sorted(by_group.items())}, "nodes": len(path)}


def mean_breakdown(graph: DataflowGraph, result: Replay) -> dict[str, float]:
    """Ms of the critical path's span and of each category, the mean over the ranks."""
    parts = [breakdown(graph, result, r) for r in sorted(graph.step_ns)]
    return {c: float(np.mean([p[f"{c}_ms"] for p in parts])) for c in ("span", *CATEGORIES)}


def _launch_bound(path: list[int], kinds: np.ndarray, edge_kind: np.ndarray, cause: np.ndarray) -> set[int]:
    """CPU nodes of the path whose following GPU node was bound by a launch from them, and the
    CPU nodes just before them on the path up to the previous GPU node."""
    out: set[int] = set()
    run: list[int] = []
    for v in path:
        if kinds[v] == "cpu":
            run.append(v)
        else:
            if kinds[v] == "gpu" and run and cause[v] >= 0 and edge_kind[cause[v]] == "launch":
                out.update(run)
            run = []
    return out
