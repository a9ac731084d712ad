"""The global dataflow graph and its replay, on real recorded runs and the real GPU traces in tests/data."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import networkx as nx
import numpy as np
import pandas as pd
import pytest

from dpro.analysis import RunAnalysis
from dpro.graph.alignment import agreed_interval, refine_offsets
from dpro.graph.dataflow import DataflowGraph, _nested_lags_rescaled, _without_profiler, graph_from_traces
from dpro.graph.kineto import load_trace
from dpro.graph.matching import match
from dpro.graph.reduction import reduce_trace
from dpro.graph.typical import WAKE_SLACK_NS, typical_step
from dpro.graph.vocabulary import SYMMETRIC_FAMILIES, collective_family
from dpro.replayer.simulate import ReplayError, replay
from dpro.run_records import Calibration

from .conftest import DATA, JOBS, assert_one_line_error, dpro

# How closely a CPU job's collectives bound its ranks' clock offsets (gloo ranges open late).
ALIGN_NS = 100_000


@pytest.fixture(scope="module")
def run_graph(recorded_run: Path) -> DataflowGraph:
    return RunAnalysis.open(recorded_run).graph


def test_collectives_are_matched_and_decomposed_into_ring_transfers(run_graph: DataflowGraph) -> None:
    nodes, edges, table = run_graph.nodes, run_graph.edges, run_graph.collectives
    assert set(table["coll"]) >= {"all_reduce"}, "DDP's gradient all-reduces are matched across ranks"
    for row in table.itertuples():
        assert row.ranks == [0, 1]
        sends = nodes.loc[row.sends]
        if row.coll == "all_reduce":  # ring over 2 ranks: 2 steps, each rank sends to the other
            assert sorted(sends["resource"]) == ["link/0->1", "link/0->1", "link/1->0", "link/1->0"]
            assert sends["dur_ns"].sum() == pytest.approx(2 * row.transfer_ns)
            assert row.bytes > 0, "sized from the DDP bucket layout"
        for v in row.sends:  # both ends must have joined before a send
            joined = edges[(edges["dst"] == v) & (edges["kind"] == "arrive")]
            assert sorted(nodes.loc[joined["src"], "rank"]) == [0, 1]
        for rank, done in zip(row.ranks, row.done):
            assert nodes.at[done, "rank"] == rank and nodes.at[done, "kind"] == "collective"
            assert set(edges[edges["dst"] == done]["kind"]) == {"arrive", "transfer"}
    enqueue = edges[edges["kind"] == "enqueue"]
    assert len(enqueue) >= 2 * len(table)
    for src, dst in zip(enqueue["src"], enqueue["dst"]):  # issued from another thread of the same rank
        assert nodes.at[src, "rank"] == nodes.at[dst, "rank"] and nodes.at[src, "resource"] != nodes.at[dst, "resource"]
    waits = edges[edges["kind"] == "wait"]
    assert set(nodes.loc[waits["src"], "kind"]) == {"collective"}, "the main thread waits for a rank's collective end"
    # a waiter may wake a little before the communication thread closes the collective's range
    assert (waits["lag_ns"] >= -WAKE_SLACK_NS).all()


def test_collective_instances_are_numbered_by_issue_across_communication_threads(run_graph: DataflowGraph) -> None:
    # gloo runs collectives on two threads; numbering them thread by thread once crossed the
    # ranks' collectives. The k-th all-reduce must be the k-th to start on every rank.
    nodes, edges = run_graph.nodes, run_graph.edges
    arrivals = edges[(edges["kind"] == "arrive") & (nodes.loc[edges["dst"], "kind"].to_numpy() == "collective")]
    for rank in (0, 1):
        mine = arrivals[nodes.loc[arrivals["src"], "rank"].to_numpy() == rank]
        names = nodes.loc[mine["dst"], "name"].to_numpy()
        ar = [(nodes.at[s, "offset_ns"], int(n.split("#")[1])) for s, n in zip(mine["src"], names)
              if n.startswith("all_reduce#")]
        assert [k for _, k in sorted(ar)] == sorted(k for _, k in ar)


def test_clock_offsets_are_kept_when_consistent_and_clamped_when_not(recorded_run: Path) -> None:
    analysis = RunAnalysis.open(recorded_run)
    each = pd.concat([reduce_trace(analysis.run.trace_path(r), r).instances for r in analysis.ranks])
    instances = match(each)
    # without a collective matched between the ranks no offset moves (the CI's one failure here
    # was either that or crossed bounds: say which, should it come back)
    symmetric = instances[instances["coll_name"].map(collective_family).isin(SYMMETRIC_FAMILIES)]
    assert set(symmetric["rank"]) == {0, 1}, each.groupby(["rank", "step"])["coll_name"].value_counts().to_string()
    recorded = analysis.recorded_offsets
    # One machine, one clock: the true offsets are 0. A gloo range may open a little late on a
    # loaded machine, so the collectives bound them to within tens of microseconds (15 us in 1 of
    # 42 recordings here), never to a step's milliseconds.
    assert abs(refine_offsets(instances, {0: 0, 1: 0})[1]) < ALIGN_NS
    # The ping-pong's error grows with the round trip on a loaded machine (once -273 us of a
    # 645 us round trip, up to 2 ms); the collectives only ever move it closer to the truth.
    refined = refine_offsets(instances, recorded)
    assert abs(refined[1]) <= max(abs(recorded[1]), ALIGN_NS) and analysis.offsets == refined
    wrong = refine_offsets(instances, {0: 0, 1: 10**9})  # a second off: no collective could overlap
    assert abs(wrong[1]) < 50_000_000


def test_an_instance_whose_bounds_miss_the_offset_is_outvoted_not_trusted() -> None:
    """Three all-reduces bound rank 1's offset to [-100, 100] us; a fourth, whose ranges were
    taken late, to [400, 900] us. The bounds cross: the offset the most agree on stands, and a
    wrong one moves into it (keeping it, as before, left a second's error in place)."""
    def instance(rank: int, k: int, start_us: float, dur_us: float) -> dict:
        return {"rank": rank, "step": 5, "pg_name": "", "coll_name": "all_reduce", "occurrence": k, "peer": -1,
                "start_ns": int(start_us * 1000), "dur_ns": int(dur_us * 1000), "nbytes": 1024.0}
    rows = [instance(0, 0, 0, 200), instance(1, 0, 100, 100),  # low -100, high 200
            instance(0, 1, 1000, 150), instance(1, 1, 1050, 50),  # low -100, high 100
            instance(0, 2, 2000, 250), instance(1, 2, 2100, 100),  # low -150, high 200
            instance(0, 3, 3000, 100), instance(1, 3, 3500, 400)]  # low 400, high 900: late
    instances = pd.DataFrame(rows)
    assert refine_offsets(instances, {0: 0, 1: 0}) == {0: 0, 1: 0}
    assert refine_offsets(instances, {0: 0, 1: 10**9}) == {0: 0, 1: 100_000}
    assert refine_offsets(instances, {0: 0, 1: -10**9}) == {0: 0, 1: -100_000}
    assert refine_offsets(instances.iloc[:6], {0: 0, 1: 10**9}) == {0: 0, 1: 100_000}, "all agree: the intersection"


def test_the_agreed_interval_counts_touching_bounds_and_takes_the_best_region_nearest() -> None:
    def agreed(low: list[int], high: list[int], near: int) -> tuple[int, int]:
        return agreed_interval(np.array(low, np.int64), np.array(high, np.int64), near)

    assert agreed([0, 10], [10, 20], 0) == (10, 10), "bounds that only touch agree there"
    assert agreed([0, 5, 5], [10, 5, 8], 100) == (5, 5), "a bound of one point"
    # two regions, each inside two of four bounds: the one nearer the given offset
    assert agreed([0, 2, 20, 22], [5, 8, 25, 30], -50) == (2, 5)
    assert agreed([0, 2, 20, 22], [5, 8, 25, 30], 50) == (22, 25)
    assert agreed([0, 2, 20, 22], [5, 8, 25, 30], 21) == (22, 25)
    assert agreed([-2, 0, 1], [2, 1, 3], 10**9) == (1, 1), "three agree on one point only"


def test_where_no_structure_repeats_the_step_of_the_median_time_stands_for_all(tmp_path: Path) -> None:
    """Three steps, each of its own structure (as where gloo's worker threads take the
    collectives in turn): the typical step is the one of the median time, not the first, which
    the machine slowed here."""
    events, ts = [], 1_000_000.0
    for step, (last, took) in enumerate((("b", 1900.0), ("c", 1000.0), ("d", 1100.0)), start=5):
        events += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                    "ts": ts, "dur": took},
                   {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": ts + 10, "dur": took / 2},
                   {"ph": "X", "cat": "cpu_op", "name": last, "pid": 1, "tid": 1, "ts": ts + took / 2 + 20,
                    "dur": took / 3}]
        ts += took + 50
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}))
    no_collectives = pd.DataFrame({"step": pd.Series([], dtype="int64"), "event": pd.Series([], dtype="int64"),
                                   "nbytes": pd.Series([], dtype="float64"), "occurrence": pd.Series([], dtype="int64")})
    step = typical_step(load_trace(trace, cache=False), 0, [5, 6, 7], no_collectives)
    assert step.nodes["name"].astype(str).tolist() == ["a", "d"] and step.step_ns == 1_100_000


def test_program_order_stays_on_one_thread(run_graph: DataflowGraph) -> None:
    nodes, order = run_graph.nodes, run_graph.edges[run_graph.edges["kind"] == "order"]
    same = nodes.loc[order["src"], "resource"].to_numpy() == nodes.loc[order["dst"], "resource"].to_numpy()
    assert same.all() and (order["lag_ns"] >= 0).all()
    g = run_graph.to_networkx()
    assert nx.is_directed_acyclic_graph(g) and g.number_of_nodes() == len(nodes)


def test_replay_predicts_the_recorded_step_time(run_graph: DataflowGraph) -> None:
    # How close is measured by benchmarks/replay_accuracy.py; this checks that the replay of a
    # short, noisy 2-step recording tracks the job's step time at all. (Per rank, two steps
    # mostly measure how the ranks' skew changed between them; the job's mean does not.) The
    # bound sits outside the noise: over 20 recordings of this job on 2 shared cores the error
    # had a median of 3.4% and a maximum of 30.3% (one all-reduce of 66 KB took 0.07-4.2 ms, a
    # single sample the template keeps), so 25% failed one run in 20. On the faster machine of
    # 2026-12-07, over 42 recordings (12 quiet, 30 beside a busy core): median 7%, maximum 57.8%;
    # 45% failed 2 of them and a CI run (52%, no other process running).
    result = replay(run_graph)
    predicted, measured = np.mean(list(result.step_ns.values())), np.mean(list(run_graph.step_ns.values()))
    assert abs(predicted / measured - 1) < 0.75
    slower = run_graph.nodes["dur_ns"].to_numpy() * np.where(run_graph.nodes["kind"] == "transfer", 10, 1)
    assert np.mean(list(replay(run_graph, durations=slower).step_ns.values())) > predicted * 1.02, \
        "ten times slower collectives make a slower step"


def test_the_recorded_period_is_no_input_of_a_recorded_graphs_replay(run_graph: DataflowGraph) -> None:
    slower = dataclasses.replace(run_graph, step_ns={r: 1.3 * t for r, t in run_graph.step_ns.items()})
    assert replay(slower).step_ns == replay(run_graph).step_ns
    assert replay(slower, symmetric=False).step_ns == replay(run_graph, symmetric=False).step_ns


def test_the_profilers_cost_is_taken_out_of_an_op_heavy_job(tmp_path: Path) -> None:
    """The replay predicts the steps users run, not the profiled ones: on a job of many tiny ops
    the calibrated cost per event comes out of the ops. (How near the unprofiled steps that
    brings the prediction is measured by ``benchmarks/fidelity.py``: a test cannot time it
    reliably on a shared machine.)"""
    run = tmp_path / "run"
    result = dpro("record", "-o", run, "--skip", "10", "--warmup", "2", "--steps", "8", "--",
                  sys.executable, JOBS / "op_heavy.py", "40")
    assert result.returncode == 0, result.stderr
    analysis = RunAnalysis.open(run)
    cost = analysis.profiler_cost_ns()[0]
    assert cost["forward"] > 0 and cost["backward"] >= 0
    assert analysis.calibrations[0].event_counts["backward"] > 0, "the calibration saw backward functions"
    events = analysis.graph.nodes["events"].sum()
    out = json.loads(dpro("replay", run, "--json").stdout)
    assert out["predicted_step_ms"] < out["profiled_step_ms"] - 0.5 * cost["forward"] * events / 1e6, out


def test_the_profilers_cost_is_priced_by_class_of_event() -> None:
    nodes = pd.DataFrame({"name": ["aten::mul", "autograd::engine::evaluate_function: MulBackward0", "aten::add"],
                          "dur_ns": [5000, 5000, 100], "events": [4, 4, 1]})
    durations = _without_profiler(nodes, {"forward": 300.0, "backward": 700.0})
    assert durations.tolist() == [5000 - 4 * 300, 5000 - 4 * 700, 0], "never below zero"


def test_a_nested_call_keeps_its_place_inside_its_compensated_op() -> None:
    """A call nested early in a long op (a collective's enqueue) ends the same share of the op's
    duration in after the profiler's cost came out: never before the op starts."""
    edges = pd.DataFrame({"src": [0, 0, 1], "dst": [1, 2, 2], "lag_ns": [-9000, -9000, 500],
                          "kind": ["order", "enqueue", "launch"]})
    out = _nested_lags_rescaled(edges, np.array([10_000.0, 0.0, 1_000.0]), np.array([4_000.0, 0.0, 1_000.0]))
    assert out["lag_ns"].tolist() == [-9000, -3600, 500], "only nested calls' lags follow their op's duration"


def test_runs_calibrated_with_one_price_or_no_backward_price_still_compensate() -> None:
    def costs(profiler: dict) -> dict[str, float]:
        return Calibration.from_json({"profiler": profiler}).event_costs

    assert costs({"main": {"per_event_ns": 550.0}}) == {"forward": 550.0, "backward": 550.0}
    assert costs({"forward": {"per_event_ns": 300.0}, "backward": {"per_event_ns": None}}) == \
        {"forward": 300.0, "backward": 300.0}
    assert costs({"forward": {"per_event_ns": 300.0}, "backward": {"per_event_ns": 700.0}}) == \
        {"forward": 300.0, "backward": 700.0}
    assert costs({}) == {} and costs({"error": "RuntimeError: x"}) == {}
    assert Calibration.from_json({"profiler": {"error": "RuntimeError: x"}}).problems == {"profiler": "RuntimeError: x"}


def test_replay_command(recorded_run: Path, tmp_path: Path) -> None:
    out = dpro("replay", recorded_run, "--json", "--export", tmp_path / "predicted.json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert {"measured_step_ms", "predicted_step_ms", "error_pct"} <= set(summary)
    assert [r["rank"] for r in summary["per_rank"]] == [0, 1]
    trace = json.loads((tmp_path / "predicted.json").read_text())["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace if e["name"] == "thread_name"}
    assert {e["args"]["name"] for e in trace if e["name"] == "process_name"} == {"rank 0", "rank 1"}
    assert any(n.startswith("link/") for n in names.values()), "sends drawn on link tracks"
    tracks: dict = {}
    for e in (e for e in trace if e["ph"] == "X"):
        assert isinstance(e["pid"], int) and (e["pid"], e["tid"]) in names, "integer ids, every track named"
        tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():  # Perfetto shows no overlap on a track
        spans.sort()
        assert all(b[0] >= a[1] - 1e-3 for a, b in zip(spans, spans[1:]))
    assert dpro("replay", recorded_run, "--no-align").returncode == 0
    path = dpro("critical-path", recorded_run, "--json")
    assert path.returncode == 0, path.stderr
    found = json.loads(path.stdout)
    assert set(found) == {"breakdown", "top_ops", "path"} and len(found["path"]) > 1


def test_replay_of_a_run_without_traces(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text(json.dumps({"format": "dpro-run", "format_version": "1.0"}))
    assert_one_line_error(dpro("replay", tmp_path / "run"), "no trace to analyse")


GPU_TRACES = ["a100-2rank-ddp-rank0", "v100-resnet50-worker0", "v100-1rank-ns-timestamps",
              "sampled-128rank-rank0", "mi250-rocm-toy-train"]


@pytest.mark.parametrize("name", GPU_TRACES)
def test_gpu_trace_graph(name: str) -> None:
    tables = load_trace(DATA / "gpu" / f"{name}.json.gz", cache=False)
    graph = graph_from_traces({tables.meta["rank"]: tables})
    nodes, edges = graph.nodes, graph.edges
    launches = edges[edges["kind"] == "launch"]
    assert len(launches) > 0
    assert set(nodes.loc[launches["src"], "kind"]) == {"cpu"} and set(nodes.loc[launches["dst"], "kind"]) == {"gpu"}
    gpu = nodes[nodes["kind"] == "gpu"]
    assert gpu["resource"].str.contains("/gpu/").all()
    assert set(gpu.index) <= set(launches["dst"]) | set(edges.loc[edges["kind"] == "order", "dst"])
    predicted = replay(graph).step_ns[tables.meta["rank"]]
    assert abs(predicted / graph.step_ns[tables.meta["rank"]] - 1) < 0.05


def test_blocking_sync_makes_the_cpu_wait_for_the_gpu() -> None:
    tables = load_trace(DATA / "gpu" / "v100-resnet50-worker0.json.gz", cache=False)
    graph = graph_from_traces({0: tables})
    syncs = graph.edges[graph.edges["kind"] == "sync"]
    assert len(syncs) >= 1
    assert set(graph.nodes.loc[syncs["src"], "kind"]) == {"gpu"} and set(graph.nodes.loc[syncs["dst"], "kind"]) == {"cpu"}


def test_a_cycle_is_refused() -> None:
    nodes = pd.DataFrame({"rank": [0, 0], "kind": ["cpu", "cpu"], "resource": ["r0/cpu/1"] * 2,
                          "name": ["a", "b"], "dur_ns": [1.0, 1.0], "offset_ns": [0.0, 2.0], "coll": [None, None]})
    edges = pd.DataFrame({"src": [0, 1], "dst": [1, 0], "lag_ns": [0, 0], "kind": ["order", "order"]})
    graph = DataflowGraph(nodes, edges, step_ns={0: 3.0}, start_ns={0: 0.0})
    with pytest.raises(ReplayError, match="cycle"):
        replay(graph)


def test_a_backward_pass_on_autograd_s_device_thread_is_joined_to_the_thread_that_called_it(tmp_path: Path) -> None:
    """On a GPU, autograd runs the backward pass on a thread of its own while the thread that
    called ``backward()`` sits in the call: dpro's own H100 recording (tests/data/runs)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(DATA / "runs" / "h100-ddp-1rank", run)
    analysis = RunAnalysis.open(run)
    graph = analysis.graph
    nodes, edges = graph.nodes, graph.edges
    names = nodes["name"].astype(str)
    backward = names.str.startswith("autograd::engine::evaluate_function").to_numpy()
    device_thread = set(nodes.loc[backward, "resource"])
    assert len(device_thread) == 1, "the backward pass ran on one device thread"
    [thread] = device_thread
    caller = nodes.loc[names.str.startswith("Optimizer.step#").to_numpy(), "resource"].iloc[0]
    assert caller != thread
    call, back = edges[edges["kind"] == "call"], edges[edges["kind"] == "return"]
    assert len(call) == len(back) == 1
    assert nodes.at[int(call["dst"].iloc[0]), "resource"] == thread and nodes.at[int(call["src"].iloc[0]), "resource"] == caller
    assert names.iat[int(back["dst"].iloc[0])].startswith("Optimizer.step#"), "the optimizer steps after the backward"
    result = analysis.replay()
    last = nodes.index[(nodes["resource"] == thread).to_numpy()]
    step_op = int(back["dst"].iloc[0])
    assert result.start_ns[step_op] >= result.end_ns[last].max(), "the optimizer waits for the whole backward pass"
    assert not analysis.calibrations[0].problems, "calibrated on the GPU (NCCL takes no CPU tensor)"
    assert analysis.calibrations[0].device == "cuda:0"
