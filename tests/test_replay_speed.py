"""The replay's compiled kernels, its vectorized unrolling and its symmetric fold, and the
synthetic data-parallel job (behaviour, not timing: benchmarks/replay_speed.py times them)."""

from __future__ import annotations

import dataclasses
import math
import networkx as nx
import numpy as np
import pandas as pd
import pytest

from dpro.graph.dataflow import DataflowGraph
from dpro.replayer.kernels import ReplayError, longest_path
from dpro.replayer.simulate import Replay, _wraps, replay
from dpro.replayer.symmetry import Fold, fold
from dpro.replayer.synthetic import DataParallelJob, bucket_sizes, data_parallel_graph, ring_all_reduce_ns


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
    # measured between steps: the stream's last op (d, ending at 95) to its first (a) in the next
    # step 20 ns later; the CPU thread's (e, ending at 29) to its first (b) 71 ns later
    wraps = pd.DataFrame({"src": [3, 4], "dst": [0, 1], "lag_ns": [20.0, 71.0]})
    return DataflowGraph(nodes, edges, step_ns={0: 100.0}, start_ns={0: 0.0}, wraps=wraps)


def test_wraps_join_each_queue_to_its_next_step() -> None:
    graph = two_thread_graph()
    offset, dur = graph.nodes["offset_ns"].to_numpy(), graph.nodes["dur_ns"].to_numpy()
    src, dst, lag = _wraps(graph, offset, dur)
    # The stream sat idle until a's launch returned (at 10 - 5), so its gap keeps only the
    # 10 ns from the launch to a, not the 20 ns it waited in all; the CPU thread's is kept.
    assert src.tolist() == [3, 4] and dst.tolist() == [0, 1]
    assert lag.tolist() == [15 - 5, 100 - 29]


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


def test_the_recorded_period_is_no_input_of_the_replay() -> None:
    graph = two_thread_graph()
    slower = dataclasses.replace(graph, step_ns={0: 130.0})
    assert replay(slower).step_ns == replay(graph).step_ns == {0: 100.0}
    job = DataParallelJob(ranks=4, params=5_000_000, layers=3, kernels_per_layer=2)
    recorded = data_parallel_graph(job)
    for symmetric in (True, False):
        expected = replay(recorded, symmetric=symmetric).step_ns
        scaled = dataclasses.replace(recorded, step_ns={r: 1.3 * t for r, t in recorded.step_ns.items()})
        assert replay(scaled, symmetric=symmetric).step_ns == expected


def test_buckets_and_the_ring_all_reduce_model() -> None:
    assert bucket_sizes(100_000_000, 25 * 2**20).tolist() == [25 * 2**20] * 15 + [400_000_000 - 15 * 25 * 2**20]
    assert len(bucket_sizes(100_000_000, 25 * 2**20)) == math.ceil(100_000_000 * 4 / (25 * 2**20)) == 16
    assert bucket_sizes(10, 40).tolist() == [40]
    t = ring_all_reduce_ns(np.array([8e9]), ranks=8, alpha_s=1e-5, beta_bytes_per_s=1e9)
    assert t.tolist() == pytest.approx([2 * 7 * (1e-5 + 1.0) * 1e9])
    assert ring_all_reduce_ns(np.array([8e9]), ranks=1, alpha_s=1e-5, beta_bytes_per_s=1e9).tolist() == [0.0]


def test_synthetic_data_parallel_graph() -> None:
    job = DataParallelJob(ranks=8, params=10_000_000, layers=4, kernels_per_layer=2)
    graph = data_parallel_graph(job)
    nodes, edges = graph.nodes, graph.edges
    buckets = math.ceil(job.params * 4 / (25 * 2**20))
    per_rank = 2 * (3 * job.layers * job.kernels_per_layer + 1) + buckets  # CPU ops, kernels, arrivals
    assert nodes["rank"].value_counts().to_dict() == {**dict.fromkeys(range(8), per_rank), -1: buckets}
    shared = np.flatnonzero(nodes["kind"] == "collective")
    assert (nodes.loc[shared, "coll"] == "all_reduce").all() and (nodes.loc[shared, "resource"] == "coll").all()
    assert nodes.loc[shared, "dur_ns"].tolist() == pytest.approx(ring_all_reduce_ns(
        bucket_sizes(job.params, job.bucket_bytes), 8, job.alpha_s, job.beta_bytes_per_s).tolist())
    for v in shared:
        arrivals = edges[(edges["dst"] == v) & (edges["kind"] == "arrive")]["src"]
        assert sorted(nodes.loc[arrivals, "rank"]) == list(range(8)) and (nodes.loc[arrivals, "dur_ns"] == 0).all()
        waiters = edges[(edges["src"] == v) & (edges["kind"] == "wait")]["dst"]
        assert sorted(nodes.loc[waiters, "rank"]) == list(range(8))
        assert set(nodes.loc[waiters, "name"]) == {"optimizer.step"}
    # 40 MB of gradients, 10 MB per layer, in reverse layer order: the first bucket (25 MiB) is
    # complete with layer 1's gradients, the second with layer 0's.
    ready = edges[(edges["kind"] == "enqueue") & (nodes.loc[edges["src"], "rank"].to_numpy() == 0)]["src"]
    assert nodes.loc[ready, "name"].tolist() == ["layer1.backward:kernel", "layer0.backward:kernel"]
    stream = nodes[nodes["resource"] == "r0/gpu/7"]
    for v in ready:  # the layer's last backward kernel
        assert stream.loc[v + 1:, "name"].iloc[0] != stream.at[v, "name"]
    launches = edges[edges["kind"] == "launch"]
    assert (nodes.loc[launches["src"], "kind"] == "cpu").all() and (nodes.loc[launches["dst"], "kind"] == "gpu").all()
    assert nx.is_directed_acyclic_graph(graph.to_networkx())
    # The offsets are the step's own schedule: replayed, the step takes the time it says.
    assert replay(graph).step_ns == pytest.approx(graph.step_ns)


def fold_of(graph: DataflowGraph) -> Fold | None:
    nodes, edges = graph.nodes, graph.edges
    dur, offset = nodes["dur_ns"].to_numpy(np.float64), nodes["offset_ns"].to_numpy(np.float64)
    return fold(nodes["rank"].to_numpy(), dur, offset, edges["src"].to_numpy(), edges["dst"].to_numpy(),
                edges["lag_ns"].to_numpy(np.float64), _wraps(graph, offset, dur))


def assert_same_replay(a: Replay, b: Replay) -> None:
    assert np.array_equal(a.start_ns, b.start_ns) and np.array_equal(a.end_ns, b.end_ns)
    assert a.step_ns == b.step_ns and a.critical_path == b.critical_path
    assert np.array_equal(a.cause_edge, b.cause_edge)


SMALL_JOB = DataParallelJob(ranks=8, params=20_000_000, layers=6, kernels_per_layer=2)


def test_symmetric_fold_equals_the_full_replay() -> None:
    graph = data_parallel_graph(SMALL_JOB)
    folded = fold_of(graph)
    assert folded is not None and len(folded.nodes) == (graph.nodes["rank"] <= 0).sum()
    result = replay(graph)
    assert_same_replay(result, replay(graph, symmetric=False))
    assert len(set(result.step_ns.values())) == 1 and len(result.step_ns) == 8
    shared = np.flatnonzero(graph.nodes["kind"] == "collective")
    assert (graph.edges.loc[result.cause_edge[shared], "kind"] == "arrive").all()


def test_fold_keeps_the_full_replays_choice_among_equal_arrivals() -> None:
    # The last rank's edges first: every collective is bound by all 8 arrivals at once, and
    # the full replay names the first in graph order, rank 7's.
    graph = data_parallel_graph(SMALL_JOB)
    m = len(graph.edges) // 8
    order = np.concatenate([np.arange(r * m, (r + 1) * m) for r in reversed(range(8))])
    graph.edges = graph.edges.iloc[order].reset_index(drop=True)
    result = replay(graph)
    assert_same_replay(result, replay(graph, symmetric=False))
    shared = np.flatnonzero(graph.nodes["kind"] == "collective")
    assert set(graph.nodes.loc[graph.edges.loc[result.cause_edge[shared], "src"], "rank"]) == {7}


@pytest.mark.parametrize("change", ["slower kernels", "longer lag"])
def test_one_different_rank_is_replayed_in_full(change: str) -> None:
    graph = data_parallel_graph(SMALL_JOB)
    symmetric = replay(graph)
    if change == "slower kernels":
        slow = (graph.nodes["rank"] == 3) & (graph.nodes["kind"] == "gpu")
        graph.nodes.loc[slow, "dur_ns"] *= 1.5
    else:
        launch = np.flatnonzero((graph.edges["kind"] == "launch").to_numpy()
                                & (graph.nodes.loc[graph.edges["src"], "rank"] == 3).to_numpy())
        graph.edges.loc[launch[-1], "lag_ns"] += 50e6
    assert fold_of(graph) is None
    result = replay(graph)
    assert_same_replay(result, replay(graph, symmetric=False))
    assert min(result.step_ns.values()) > max(symmetric.step_ns.values()), "rank 3 slows every rank down"
