"""The replay's compiled kernels, its vectorized unrolling and its symmetric fold, and the
synthetic data-parallel job (behaviour, not timing: benchmarks/replay_speed.py times them)."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pandas as pd
import pytest

from dpro.graph.dataflow import DataflowGraph
from dpro.replayer.kernels import ReplayError, longest_path
from dpro.replayer.simulate import _wraps, replay


def random_dag(seed: int, n: int = 60, m: int = 200) -> tuple[np.ndarray, ...]:
    """Random edges ``u -> v`` with ``u < v`` behind a random relabelling, durations and lags
    (integers, so some starts tie between edges), and earliest starts."""
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = a != b
    label = rng.permutation(n)
    src, dst = label[np.minimum(a, b)[keep]], label[np.maximum(a, b)[keep]]
    lag = rng.integers(-3, 5, len(src)).astype(float)
    return rng.integers(0, 20, n).astype(float), rng.integers(0, 10, n).astype(float), src, dst, lag


@pytest.mark.parametrize("seed", range(5))
def test_longest_path_agrees_with_networkx(seed: int) -> None:
    earliest, dur, src, dst, lag = random_dag(seed)
    n = len(dur)
    has_input = np.bincount(dst, minlength=n) > 0
    start, end, cause = longest_path(np.where(has_input, -np.inf, earliest), dur, src, dst, lag)
    # Longest paths from a source feeding every input-free node: shortest paths with the weights
    # negated, by Bellman-Ford (an algorithm unlike the kernels' sweep in topological order).
    g = nx.DiGraph()
    g.add_nodes_from(range(n + 1))
    for u, v, w in zip(src, dst, lag):
        if not g.has_edge(u, v) or g[u][v]["weight"] > -(dur[u] + w):
            g.add_edge(int(u), int(v), weight=-(dur[u] + w))
    g.add_weighted_edges_from((n, int(v), -earliest[v]) for v in np.flatnonzero(~has_input))
    expected = nx.single_source_bellman_ford_path_length(g, n)
    assert np.array_equal(start, [-expected[v] for v in range(n)])
    assert np.array_equal(end, start + dur)
    for v in range(n):
        incoming = np.flatnonzero(dst == v)
        if incoming.size == 0:
            assert cause[v] == -1 and start[v] == earliest[v]
        else:  # the first of the edges that bind the start
            binding = incoming[end[src[incoming]] + lag[incoming] == start[v]]
            assert cause[v] == binding.min()


def test_a_cycle_is_refused_by_the_kernel() -> None:
    src, dst = np.array([0, 1, 2, 3]), np.array([1, 2, 1, 0])  # 3 -> 0 -> (1 <-> 2)
    with pytest.raises(ReplayError, match="cycle through 2 node"):
        longest_path(np.zeros(4), np.ones(4), src, dst, np.zeros(4))


def two_thread_graph() -> DataflowGraph:
    """One rank: a CPU thread of 3 ops launching 2 kernels on a stream, out of index order."""
    nodes = pd.DataFrame({"rank": [0, 0, 0, 0, 0], "kind": ["gpu", "cpu", "cpu", "gpu", "cpu"],
                          "resource": ["r0/gpu/7", "r0/cpu/1", "r0/cpu/1", "r0/gpu/7", "r0/cpu/1"],
                          "name": list("abcde"), "dur_ns": [50.0, 10.0, 10.0, 30.0, 5.0],
                          "offset_ns": [15.0, 0.0, 12.0, 65.0, 24.0], "coll": [None] * 5})
    edges = pd.DataFrame({"src": [1, 2, 1, 2, 0], "dst": [2, 4, 0, 3, 3], "lag_ns": [2, 2, -5, -5, 0],
                          "kind": ["order", "order", "launch", "launch", "order"]})
    return DataflowGraph(nodes, edges, step_ns={0: 100.0}, start_ns={0: 0.0})


def test_wraps_join_each_queue_to_its_next_step() -> None:
    graph = two_thread_graph()
    offset, dur = graph.nodes["offset_ns"].to_numpy(), graph.nodes["dur_ns"].to_numpy()
    src, dst, lag = _wraps(graph, offset, dur)
    # The stream (whose node comes first) ends with d (65 + 30) and starts with a (15); the CPU
    # thread ends with e (24 + 5) and starts with b (0): the gaps to the next step, 100 ns later.
    assert src.tolist() == [3, 4] and dst.tolist() == [0, 1]
    assert lag.tolist() == [15 + 100 - 95, 100 - 29]


def test_replay_names_the_edge_that_bound_each_start() -> None:
    graph = two_thread_graph()
    result = replay(graph)
    edges = graph.edges
    for v, e in enumerate(result.cause_edge):
        if e >= 0:
            assert edges.at[e, "dst"] == v
            assert result.start_ns[v] == result.end_ns[edges.at[e, "src"]] + edges.at[e, "lag_ns"]
    # With b at 0: a is launched at 5 and ends at 55; d's launch returns at 17, so d waits for a.
    # b is bound by its thread's previous step (a wrap from e), not by an edge of the graph.
    assert result.cause_edge.tolist() == [2, -1, 0, 4, 1]
    assert result.critical_path == [1, 0, 3]
    assert result.step_ns == {0: 100.0}
