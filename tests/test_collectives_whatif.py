"""Collective schedules, their decomposition in the graph, the alpha-beta link model, the
what-if API, incremental re-replay and the critical-path breakdown."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpro.graph.collectives import kernel_algorithm, nccl_log_algorithms, schedule
from dpro.analysis import RunAnalysis
from dpro.graph.dataflow import DataflowGraph
from dpro.graph.decompose import Matched, decompose
from dpro.replayer.breakdown import CATEGORIES, breakdown, rank_critical_path
from dpro.replayer.cost import AlphaBeta, fit_alpha_beta
from dpro.replayer.simulate import Replayer, replay
from dpro.replayer.graph_edits import WhatIf, WhatIfError

FIXTURES = Path(__file__).parent / "fixtures"


def job_step(result) -> float:
    return float(np.mean(list(result.step_ns.values())))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_all_reduce_sends_each_chunk_around_the_ring_twice(n: int) -> None:
    sends = schedule("all_reduce", n, "ring")
    assert sends.steps == 2 * (n - 1) and (np.diff(sends.step) >= 0).all()
    for step in range(2 * (n - 1)):
        in_step = sends.step == step
        assert sorted(zip(sends.src[in_step], sends.dst[in_step])) == sorted((r, (r + 1) % n) for r in range(n))
    assert sends.fraction[sends.src == 0].sum() == pytest.approx(2 * (n - 1) / n)


@pytest.mark.parametrize("n", [2, 5, 8])
def test_other_schedules(n: int) -> None:
    tree = schedule("all_reduce", n, "tree")
    half = len(tree) // 2
    up = Counter(tree.src[:half].tolist())
    assert set(up) == set(range(n)) - {0} and set(up.values()) == {1}, "every non-root sends up once"
    assert Counter(tree.dst[half:].tolist()) == Counter({r: 1 for r in range(1, n)})
    assert Counter(schedule("broadcast", n, root=1).dst.tolist()) == Counter({r: 1 for r in range(n) if r != 1})
    assert Counter(schedule("reduce", n).src.tolist()) == Counter({r: 1 for r in range(1, n)})
    assert sorted(schedule("all_to_all", n).pairs()) == sorted((a, b) for a in range(n) for b in range(n) if a != b)
    assert schedule("_all_gather_base", n).steps == schedule("reduce_scatter", n).steps == n - 1
    assert schedule("send", 2).pairs() == [(0, 1)]
    assert len(schedule("all_reduce", 1)) == 0


def test_nccl_algorithm_sources() -> None:
    # No GPU here: lines in the format NCCL writes with NCCL_DEBUG_SUBSYS=TUNING (src/enqueue.cc,
    # both the 2.19+ form naming the collective and the older numeric form).
    found = nccl_log_algorithms([FIXTURES / "nccl" / "tuning.log"])
    assert found == {("all_reduce", 26214400): "ring", ("all_reduce", 4096): "tree",
                     ("all_gather", 1048576): "ring", ("*", 8388608): "ring"}
    assert kernel_algorithm("ncclKernel_AllReduce_RING_LL_Sum_float") == "ring"
    assert kernel_algorithm("ncclDevKernel_AllReduce_Sum_f32_TREE_LL(ncclDevKernelArgsStorage<4096ul>)") == "tree"
    assert kernel_algorithm("ncclDevKernel_SendRecv") is None


def test_decomposition_keeps_the_measured_end_and_waits_for_the_slowest_rank() -> None:
    # Four ranks reach one all-reduce at 0, 10, 20 and 40 ns; it took 60 ns once all had come.
    nodes = pd.DataFrame({"rank": [0, 1, 2, 3], "kind": "cpu", "resource": [f"r{r}/cpu/9" for r in range(4)],
                          "name": "gloo:all_reduce", "dur_ns": [100.0, 90.0, 80.0, 60.0],
                          "offset_ns": [0.0, 10.0, 20.0, 40.0], "coll_name": "all_reduce"})
    no_edges = pd.DataFrame({"src": [], "dst": [], "lag_ns": [], "kind": []}).astype({"src": "int64", "dst": "int64"})
    nodes, edges, table = decompose(nodes, no_edges, [Matched("all_reduce", 0, {r: r for r in range(4)}, 4e6)])
    graph = DataflowGraph(nodes.rename(columns={"coll_name": "coll"}), edges, step_ns={r: 1000.0 for r in range(4)})
    sends = nodes[nodes["kind"] == "transfer"]
    assert len(sends) == 4 * 6 and sends["bytes"].eq(1e6).all() and sends["dur_ns"].eq(10.0).all()
    assert table.at[0, "wait_ns"] == [40.0, 30.0, 20.0, 0.0]
    result = replay(graph, copies=1)
    ends = result.end_ns[table.at[0, "done"]]
    assert ends.tolist() == [100.0] * 4, "every rank leaves when the last arrival plus the transfer says"


def test_ranks_that_finished_a_collective_apart_leave_it_apart() -> None:
    """A ring over two hosts: ranks 0 and 2 take their last piece over the slower link and end
    12 ns after the others. Each rank leaves when its own instance ended; a what-if re-times
    that with the sends, never lengthening it, and a dropped call leaves it out."""
    nodes = pd.DataFrame({"rank": [0, 1, 2, 3], "kind": "cpu", "resource": [f"r{r}/cpu/9" for r in range(4)],
                          "name": "gloo:all_gather", "dur_ns": [72.0, 60.0, 72.0, 60.0],
                          "offset_ns": [0.0, 0.0, 0.0, 0.0], "coll_name": "all_gather"})
    no_edges = pd.DataFrame({"src": [], "dst": [], "lag_ns": [], "kind": []}).astype({"src": "int64", "dst": "int64"})
    nodes, edges, table = decompose(nodes, no_edges, [Matched("all_gather", 0, {r: r for r in range(4)}, 4e6)])
    graph = DataflowGraph(nodes.rename(columns={"coll_name": "coll"}), edges, step_ns={r: 1000.0 for r in range(4)},
                          collectives=table)
    done = table.at[0, "done"]
    assert replay(graph, copies=1).end_ns[done].tolist() == [72.0, 60.0, 72.0, 60.0]
    w = WhatIf(graph)
    assert w.set_link_bandwidth(2.0).replay().end_ns[done].tolist() == pytest.approx([36.0, 30.0, 36.0, 30.0])
    assert w.set_link_bandwidth(0.5).replay().end_ns[done].tolist() == pytest.approx([132.0, 120.0, 132.0, 120.0])
    assert w.drop_collective("all_gather", 0).replay().end_ns[done].tolist() == pytest.approx([0.0] * 4)


def _all_gather_across_two_hosts(dur_ns: float, nbytes: float) -> DataflowGraph:
    """One all-gather of ``nbytes`` between rank 0 (host a) and rank 1 (host b), ``dur_ns`` on each."""
    nodes = pd.DataFrame({"rank": [0, 1], "kind": "cpu", "resource": ["r0/cpu/9", "r1/cpu/9"],
                          "name": "gloo:all_gather", "dur_ns": [dur_ns, dur_ns], "offset_ns": [0.0, 0.0],
                          "coll_name": "all_gather"})
    no_edges = pd.DataFrame({"src": [], "dst": [], "lag_ns": [], "kind": []}).astype({"src": "int64", "dst": "int64"})
    nodes, edges, table = decompose(nodes, no_edges, [Matched("all_gather", 0, {0: 0, 1: 1}, nbytes)])
    return DataflowGraph(nodes.rename(columns={"coll_name": "coll"}), edges, step_ns={0: 1e7, 1: 1e7},
                         collectives=table, hosts={0: "a", 1: "b"})


def test_a_call_moved_to_a_class_with_no_model_scales_all_its_time_per_byte() -> None:
    """A 2-rank all-gather across hosts asked within one, where the run measured none: its
    sends' time per byte, not only the wire's share, scales by the two classes' wire rates; the
    latency stays. Within its own class a faster link speeds the wire's share only."""
    graph = _all_gather_across_two_hosts(dur_ns=1e6, nbytes=2e6)
    model = {("all_gather", "inter"): AlphaBeta(alpha_ns=1000.0, beta_bytes_per_ns=0.1, points=7,
                                                wire_bytes_per_ns=0.25)}  # 10 ns a byte, of which the wire's 4
    sends = np.asarray(graph.collectives.at[0, "sends"])
    per_send = 1e6  # the bytes each of the two sends carries
    w = WhatIf(graph, model=model).regroup([("all_gather", 0)], 2, "intra", rate=10.0)
    assert w.durations[sends] == pytest.approx((1000 + per_send * 10 / 10) * w._residual[sends])
    w = WhatIf(graph, model=model).regroup([("all_gather", 0)], 2, "inter", sharing=2.0)
    assert w.durations[sends] == pytest.approx((1000 + per_send * (6 + 4 / 2)) * w._residual[sends])


def test_a_call_moved_onto_another_class_model_leaves_its_old_links_residual() -> None:
    """The recorded sends ran 4x their class's model (say, two rings sharing the link); moved
    to a class the run has a model of, a send is timed by that model alone, while within its
    own class it keeps the 4x."""
    graph = _all_gather_across_two_hosts(dur_ns=4e6, nbytes=2e5)
    model = {("all_gather", "inter"): AlphaBeta(alpha_ns=0.0, beta_bytes_per_ns=0.1, points=7),
             ("all_gather", "intra"): AlphaBeta(alpha_ns=0.0, beta_bytes_per_ns=1.0, points=7)}
    sends = np.asarray(graph.collectives.at[0, "sends"])
    per_send = 1e5
    w = WhatIf(graph, model=model)
    assert w._residual[sends] == pytest.approx(4.0)
    assert w.fork().regroup([("all_gather", 0)], 2, "intra").durations[sends] == pytest.approx(per_send / 1.0)
    assert w.fork().regroup([("all_gather", 0)], 2, "inter", sharing=2.0).durations[sends] == pytest.approx(
        4 * per_send / 0.1 / 2), "re-timed, with its residual"


def test_alpha_beta_fit() -> None:
    sizes = np.array([1e3, 1e4, 1e5, 1e6])
    fit = fit_alpha_beta(sizes, 5_000 + sizes / 12.5)  # 5 us, 12.5 GB/s
    assert fit.alpha_ns == pytest.approx(5_000) and fit.beta_bytes_per_ns == pytest.approx(12.5)
    one = fit_alpha_beta(np.array([1e6, 1e6]), np.array([1e5, 1e5]))
    assert one.alpha_ns == 0 and one.beta_bytes_per_ns == pytest.approx(10.0)


@pytest.fixture(scope="module")
def run_graph(recorded_run: Path) -> DataflowGraph:
    return RunAnalysis.open(recorded_run).graph


def test_what_if_on_a_recorded_run(run_graph: DataflowGraph) -> None:
    base = job_step(replay(run_graph))
    assert job_step(WhatIf(run_graph).replay()) == pytest.approx(base), "no change, no difference"
    assert job_step(WhatIf(run_graph).set_link_bandwidth(0.05).replay()) > base * 1.05
    assert job_step(WhatIf(run_graph).set_link_bandwidth(0.05, link_class_="inter").replay()) == pytest.approx(base), \
        "one host: no link between hosts to slow down"
    assert job_step(WhatIf(run_graph).scale(0.5, kind="cpu").replay()) < base * 0.95
    # (by how much depends on how much of the step the measured, contended all-reduces hide:
    # 0.91x in one recording of this fixture, so a clear speed-up, not a fixed share, is asserted)
    assert job_step(WhatIf(run_graph).scale(2.0, name=r"^aten::|^autograd::").replay()) > base * 1.01
    reduces = run_graph.collectives[run_graph.collectives["coll"] == "all_reduce"]
    first = reduces.iloc[0]
    bigger = WhatIf(run_graph).set_collective_bytes("all_reduce", int(first["occurrence"]), 50 * first["bytes"])
    assert job_step(bigger.replay()) > base
    with pytest.raises(WhatIfError):
        WhatIf(run_graph).set_collective_bytes("all_to_all", 0, 10)
    assert len(reduces) >= 3, "the recorded fixture has several DDP buckets"
    # DDP's buckets fused into one all-reduce: still a valid, replayable job, with fewer sends
    fused = WhatIf(run_graph).fuse_buckets([sorted(reduces["occurrence"])])
    assert job_step(fused.replay()) > 0
    kept = np.asarray(reduces.loc[reduces["occurrence"].idxmax(), "sends"])
    # a 2-rank ring: 4 sends of half the data each carry twice the fused bytes
    assert fused._bytes[kept].sum() == pytest.approx(2 * reduces["bytes"].sum())
    gone = np.concatenate([np.asarray(s) for s in reduces.loc[reduces["occurrence"] != reduces["occurrence"].max(), "sends"]])
    assert (fused.durations[gone] == 0).all(), "the other buckets' sends vanish"


def test_incremental_replay_matches_a_full_one(run_graph: DataflowGraph) -> None:
    rng = np.random.default_rng(1)
    replayer = Replayer(run_graph)
    replayer.replay()
    dur = run_graph.nodes["dur_ns"].to_numpy().copy()
    for _ in range(3):
        dur[rng.choice(len(dur), 5, replace=False)] *= rng.uniform(0.2, 3.0, 5)
        again, fresh = replayer.replay(dur), Replayer(run_graph).replay(dur)
        assert np.array_equal(again.start_ns, fresh.start_ns) and np.array_equal(again.cause_edge, fresh.cause_edge)
        assert again.step_ns == fresh.step_ns


def test_breakdown_adds_up_and_names_the_slow_rank(run_graph: DataflowGraph) -> None:
    result = replay(run_graph)
    # On a short recording the all-reduce may overlap the step entirely (off the critical
    # path); with transfers 20 times slower it cannot.
    slow_links = run_graph.nodes["dur_ns"].to_numpy() * np.where(run_graph.nodes["kind"] == "transfer", 20.0, 1.0)
    exposed = replay(run_graph, durations=slow_links)
    for rank in (0, 1):
        parts = breakdown(run_graph, result, rank)
        assert sum(parts[f"{c}_ms"] for c in CATEGORIES) == pytest.approx(parts["span_ms"])
        assert parts["compute_ms"] > 0
        assert breakdown(run_graph, exposed, rank)["communication_ms"] > parts["communication_ms"]
    # Rank 1 made three times as busy as rank 0. (On this 2-core machine one recorded rank can
    # be several times busier than the other: a fixed factor once left rank 1 the faster.)
    busy = run_graph.nodes[run_graph.nodes["kind"] != "transfer"].groupby("rank")["dur_ns"].sum()
    factor = 3.0 * max(1.0, busy[0] / busy[1])
    slower_rank1 = run_graph.nodes["dur_ns"].to_numpy() * np.where(run_graph.nodes["rank"] == 1, factor, 1.0)
    slowed = replay(run_graph, durations=slower_rank1)
    assert breakdown(run_graph, slowed, 0)["waiting_ms"] > breakdown(run_graph, slowed, 1)["waiting_ms"], \
        "rank 0 waits for the slow rank 1"


def test_breakdown_tells_a_gpu_starved_by_its_cpu() -> None:
    # A CPU thread launches three kernels, each launch slower than the kernel: the GPU waits.
    nodes = pd.DataFrame({"rank": 0, "kind": ["cpu"] * 3 + ["gpu"] * 3,
                          "resource": ["r0/cpu/1"] * 3 + ["r0/gpu/7"] * 3, "name": list("abcxyz"),
                          "dur_ns": [100.0] * 3 + [10.0] * 3, "offset_ns": [0.0, 100.0, 200.0, 95.0, 195.0, 295.0],
                          "coll": None, "bytes": np.nan})
    edges = pd.DataFrame({"src": [0, 1, 0, 1, 2, 3, 4], "dst": [1, 2, 3, 4, 5, 4, 5],
                          "lag_ns": [0, 0, -5, -5, -5, 0, 0],
                          "kind": ["order", "order", "launch", "launch", "launch", "order", "order"]})
    graph = DataflowGraph(nodes, edges, step_ns={0: 305.0})
    parts = breakdown(graph, replay(graph, copies=1), 0)
    assert parts["launch_bound_ms"] * 1e6 == pytest.approx(295.0) and parts["compute_ms"] * 1e6 == pytest.approx(10.0)


def test_breakdown_never_runs_backwards_through_a_thread_that_woke_early() -> None:
    # Rank 0's main thread (a, then b) waits for a send (c), but woke 40 ns before the send's
    # recorded end: b, next on the critical path after c, starts before c did.
    nodes = pd.DataFrame({"rank": 0, "kind": ["cpu", "cpu", "transfer"],
                          "resource": ["r0/cpu/1", "r0/cpu/1", "link/0-1"], "name": ["a", "b", "send"],
                          "dur_ns": [10.0, 60.0, 30.0], "offset_ns": [0.0, 60.0, 70.0], "coll": None, "bytes": np.nan})
    edges = pd.DataFrame({"src": [0, 0, 2], "dst": [1, 2, 1], "lag_ns": [0, 60, -40], "kind": ["order", "order", "wait"]})
    graph = DataflowGraph(nodes, edges, step_ns={0: 130.0})
    result = replay(graph, copies=1)
    assert result.start_ns[1] < result.start_ns[2] and rank_critical_path(graph, result, 0) == [0, 2, 1], \
        "b, on the critical path after the send it waited for, starts before it"
    parts = breakdown(graph, result, 0)
    assert all(parts[f"{c}_ms"] >= 0 for c in CATEGORIES), parts
    assert sum(parts[f"{c}_ms"] for c in CATEGORIES) == pytest.approx(parts["span_ms"])
