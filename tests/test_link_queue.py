"""Collectives over the same ranks that ran at once queue on their links (graph.decompose)."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pandas as pd
import pytest

from dpro.graph.decompose import EDGE_COLUMNS, Matched, decompose


def _instances(spans: dict[str, tuple[float, float]]) -> tuple[pd.DataFrame, list[Matched]]:
    """Two ranks' instances of all-reduces ``name -> (arrival, end)``, alike on both ranks."""
    rows, matched = [], []
    for k, (arrive, end) in enumerate(spans.values()):
        ids = {}
        for rank in (0, 1):
            ids[rank] = len(rows)
            rows.append({"rank": rank, "kind": "cpu", "resource": f"r{rank}/cpu/gloo{k}", "name": "gloo:all_reduce",
                         "dur_ns": end - arrive, "offset_ns": arrive, "coll_name": "all_reduce"})
        matched.append(Matched("all_reduce", k, ids, nbytes=1e6, algorithm="ring"))
    return pd.DataFrame(rows), matched


def test_a_collective_issued_while_another_ran_queues_behind_it():
    nodes, matched = _instances({"a": (0.0, 100.0), "b": (50.0, 150.0), "c": (120.0, 180.0)})
    out_nodes, edges, table = decompose(nodes, pd.DataFrame(columns=EDGE_COLUMNS), matched)
    # b's transfer begins when a's ended, c's when b's did; each still ends when measured
    assert table["transfer_ns"].tolist() == pytest.approx([100.0, 50.0, 30.0])
    for c in table.itertuples():
        sends = out_nodes.loc[c.sends]
        assert (sends["offset_ns"] + sends["dur_ns"]).max() == pytest.approx([100.0, 150.0, 180.0][c.occurrence])
    # b's first sends wait for a's done nodes, c's for b's
    for earlier, later in ((0, 1), (1, 2)):
        first = [s for s in table.loc[later, "sends"] if out_nodes.loc[s, "name"].endswith("step 0")]
        into = edges[edges["dst"].isin(first)]
        assert set(table.loc[earlier, "done"]) <= set(into["src"]), into
    graph = nx.DiGraph(list(zip(edges["src"], edges["dst"])))
    assert nx.is_directed_acyclic_graph(graph)


def test_collectives_apart_or_ending_first_keep_their_own_times():
    # c ran inside a (issued later, ended first): it did not wait for a; d came after a ended
    nodes, matched = _instances({"a": (0.0, 100.0), "c": (20.0, 60.0), "d": (130.0, 170.0)})
    out_nodes, edges, table = decompose(nodes, pd.DataFrame(columns=EDGE_COLUMNS), matched)
    assert table["transfer_ns"].tolist() == pytest.approx([100.0, 40.0, 40.0])
    done = np.concatenate(table["done"].to_list())
    sends = np.concatenate(table["sends"].to_list())
    assert not (edges["src"].isin(done) & edges["dst"].isin(sends)).any()
