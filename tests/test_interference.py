"""Compute and communication slow each other where they overlap (``dpro.replayer.interference``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpro.graph.dataflow import DataflowGraph
from dpro.replayer.interference import Interference, NodeClasses, _covered, from_calibration, from_graph, overlap
from dpro.replayer.simulate import replay
from dpro.replayer.graph_edits import WhatIf
from dpro.run_records import Calibration


@pytest.mark.parametrize("seed", range(4))
def test_covered_length_agrees_with_counting_on_a_grid(seed: int) -> None:
    rng = np.random.default_rng(seed)
    start = rng.integers(0, 90, 12).astype(float)
    end = start + rng.integers(0, 20, 12)
    q_start = rng.integers(0, 100, 30).astype(float)
    q_end = q_start + rng.integers(0, 30, 30)
    busy = np.zeros(200, bool)
    for s, e in zip(start.astype(int), end.astype(int)):
        busy[s:e] = True
    expected = [busy[int(s):int(e)].sum() for s, e in zip(q_start, q_end)]
    assert _covered(start, end, q_start, q_end).tolist() == expected


def one_rank_graph() -> DataflowGraph:
    """Rank 0's main thread runs a (0-10), b (10-30) and c (30-40); its communication thread runs
    a collective whose send to rank 1 takes 15-25; every 100 ns."""
    nodes = pd.DataFrame({"rank": [0, 0, 0, 0, 0], "kind": ["cpu", "cpu", "cpu", "transfer", "collective"],
                          "resource": ["r0/cpu/1", "r0/cpu/1", "r0/cpu/1", "link/0->1", "r0/cpu/2"],
                          "name": ["aten::mm", "aten::mm", "aten::add", "send", "all_reduce"],
                          "dur_ns": [10.0, 20.0, 10.0, 10.0, 0.0], "offset_ns": [0.0, 10.0, 30.0, 15.0, 25.0],
                          "coll": [None, None, None, "all_reduce", "all_reduce"], "bytes": [np.nan] * 5,
                          "events": [1, 1, 1, 0, 0]})
    edges = pd.DataFrame({"src": [0, 1, 3], "dst": [1, 2, 4], "lag_ns": [0.0, 0.0, 0.0],
                          "kind": ["order", "order", "transfer"]})
    wraps = pd.DataFrame({"src": [2, 3, 4], "dst": [0, 3, 4], "lag_ns": [60.0, 90.0, 100.0]})
    return DataflowGraph(nodes, edges, step_ns={0: 100.0}, start_ns={0: 0.0}, wraps=wraps)


def test_overlap_is_the_share_of_each_op_beside_the_other_kind() -> None:
    graph = one_rank_graph()
    result = replay(graph)
    fractions = overlap(NodeClasses.of(graph), result.start_ns, result.end_ns, result.step_ns)
    # b runs 10-30 beside the send's 15-25; the send runs wholly beside b; the collective's own
    # thread is neither compute nor a send
    assert fractions.tolist() == [0.0, 0.5, 0.0, 1.0, 0.0]


def test_the_next_steps_communication_counts_too() -> None:
    graph = one_rank_graph()
    nodes = graph.nodes.copy()
    nodes.loc[3, "dur_ns"] = 90.0  # 15-105: the previous step's send runs until 5
    graph = DataflowGraph(nodes, graph.edges, step_ns=graph.step_ns, start_ns=graph.start_ns, wraps=graph.wraps)
    start, end = nodes["offset_ns"].to_numpy(), (nodes["offset_ns"] + nodes["dur_ns"]).to_numpy()
    fractions = overlap(NodeClasses.of(graph), start, end, {0: 100.0})
    assert fractions[:3].tolist() == [0.5, 0.75, 1.0]


def test_a_send_counts_on_both_of_its_ranks_and_the_next_step_too() -> None:
    # rank 0 computes 0-10 and 80-100; rank 1 computes 0-10 and sends to rank 0 at 85-105,
    # i.e. into rank 0's next step, whose first op (0-10, shifted by the period) it covers at 100-105
    nodes = pd.DataFrame({"rank": [0, 0, 1, 1], "kind": ["cpu", "cpu", "cpu", "transfer"],
                          "resource": ["r0/cpu/1", "r0/cpu/1", "r1/cpu/1", "link/1->0"],
                          "name": ["a", "b", "a", "send"], "dur_ns": [10.0, 20.0, 10.0, 20.0],
                          "offset_ns": [0.0, 80.0, 0.0, 85.0], "coll": [None] * 4, "bytes": [np.nan] * 4,
                          "events": [1, 1, 1, 0]})
    graph = DataflowGraph(nodes, pd.DataFrame({"src": [], "dst": [], "lag_ns": [], "kind": []}),
                          step_ns={0: 100.0, 1: 100.0})
    start, end = nodes["offset_ns"].to_numpy(), (nodes["offset_ns"] + nodes["dur_ns"]).to_numpy()
    fractions = overlap(NodeClasses.of(graph), start, end, graph.step_ns)
    # rank 0's a: the previous step's send covers -15..5 of it; b: 85-100 of 80-100; rank 1's a:
    # the send is its own, but its compute at 0-10 meets the previous step's send at -15..5;
    # the send: rank 0's b covers 85-100 (rank 1 computes nothing then), and the next step's a 100-105
    assert fractions.tolist() == [0.5, 0.75, 0.5, 1.0]


def test_ops_are_re_timed_only_where_a_change_moves_their_overlap() -> None:
    graph = one_rank_graph()
    slow = Interference(compute=1.0, comm=0.5, source="test")
    plain = WhatIf(graph, model={}).replay()
    aware = WhatIf(graph, model={}, interference=slow).replay()
    assert aware.start_ns.tolist() == plain.start_ns.tolist() and aware.end_ns.tolist() == plain.end_ns.tolist()
    # the send gone, b no longer shares the cores: recorded 20 ns at half overlap, alone 20 / 1.5
    changed = WhatIf(graph, model={}, interference=slow).scale(0.0, kind="transfer").replay()
    assert changed.end_ns[1] - changed.start_ns[1] == pytest.approx(20 / 1.5)
    assert changed.end_ns[0] - changed.start_ns[0] == 10.0 and changed.end_ns[2] - changed.start_ns[2] == 10.0
    unaware = WhatIf(graph, model={}).scale(0.0, kind="transfer").replay()
    assert unaware.end_ns[1] - unaware.start_ns[1] == 20.0


def test_slowdowns_from_the_calibration_are_medians_never_below_zero() -> None:
    def calibration(compute_beside: float, comm_beside: float) -> Calibration:
        return Calibration.from_json({"collectives": {"interference": {
            "compute_alone_ns": 100.0, "compute_beside_comm_ns": compute_beside,
            "comm_alone_ns": 200.0, "comm_beside_compute_ns": comm_beside}}})
    found = from_calibration({0: calibration(150.0, 300.0), 1: calibration(130.0, 100.0), 2: calibration(90, 150.0)})
    assert (found.compute, found.comm, found.source) == (pytest.approx(0.3), 0.0, "calibration")
    assert from_calibration({0: Calibration.from_json({"profiler": {}})}) is None and from_calibration({}) is None
    skipped = {"collectives": {"interference": {"skipped": "on a GPU"}}}
    assert from_calibration({0: Calibration.from_json(skipped)}) is None


def test_the_recorded_step_gives_the_slowdown_of_the_same_op_alone_and_overlapped() -> None:
    graph = one_rank_graph()
    fractions = np.array([0.0, 1.0, 0.0, 1.0, 0.0])  # a alone (10 ns), b overlapped (20 ns): both aten::mm
    assert from_graph(graph, fractions) is None  # one op found both ways is too few
    threads = [graph.nodes.assign(resource=graph.nodes["resource"].replace("r0/cpu/1", f"r0/cpu/1{i}"))
               for i in range(3)]  # the same on three threads: three ops found both ways
    many = DataflowGraph(pd.concat(threads, ignore_index=True), graph.edges, step_ns=graph.step_ns)
    assert from_graph(many, np.tile(fractions, 3)) == (pytest.approx(1.0), 3)
    assert from_graph(many, np.tile([0.0, 0.5, 0.0, 1.0, 0.0], 3)) is None  # half overlapped counts neither way
