"""Identical-rank folding of what-if replays (``dpro.replayer.median_rank``): exact on identical
ranks, refused where the ranks run different ops, and used by ``dpro optimize --fold-ranks``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.synthetic_runs import make_run
from dpro.analysis.run import RunAnalysis
from dpro.analysis.whatif import Change, predict
from dpro.graph.dataflow import DataflowGraph
from dpro.replayer.median_rank import median_rank
from dpro.replayer.simulate import Replayer
from dpro.replayer.graph_edits import WhatIf

from tests.conftest import dpro

RANKS = 4


@pytest.fixture(scope="module")
def identical(tmp_path_factory) -> DataflowGraph:
    """A 4-rank run whose ranks are copies of one real A100 trace: identical ranks."""
    return RunAnalysis.open(make_run(tmp_path_factory.mktemp("identical") / "run", RANKS)).graph


def test_identical_ranks_fold_onto_one_rank_exactly(identical: DataflowGraph) -> None:
    folded = median_rank(identical)
    assert folded is not None and folded.ranks == list(range(RANKS))
    assert len(folded.graph.nodes) < len(identical.nodes) / (RANKS - 1)
    whole = Replayer(identical).replay()
    mapped = folded.unfold(Replayer(folded.graph).replay(folded.fold(identical.nodes["dur_ns"].to_numpy(np.float64))))
    assert mapped.step_ns == pytest.approx(whole.step_ns, rel=1e-9)
    np.testing.assert_allclose(mapped.end_ns, whole.end_ns, rtol=0, atol=1.0)
    bound = np.flatnonzero(mapped.cause_edge >= 0)
    assert len(bound) > len(identical.nodes) / 2
    assert (identical.edges["dst"].to_numpy()[mapped.cause_edge[bound]] == bound).all()  # each node's own edge


def test_a_change_folded_predicts_what_every_rank_replayed_predicts(identical: DataflowGraph) -> None:
    for change in (lambda w: w.set_link_bandwidth(0.25), lambda w: w.scale(0.5, kind="gpu")):
        every, folded = WhatIf(identical), WhatIf(identical, fold=True)
        change(every), change(folded)
        mine, theirs = folded.replay(), every.replay()
        assert mine.step_ns == pytest.approx(theirs.step_ns, rel=1e-9) and folded.folded and not every.folded
        np.testing.assert_allclose(mine.end_ns, theirs.end_ns, rtol=0, atol=1.0)
        assert np.abs(theirs.end_ns - Replayer(identical).replay().end_ns).max() > 1e5  # the change changed times


def test_ranks_that_run_different_ops_are_not_folded(identical: DataflowGraph) -> None:
    nodes = identical.nodes.copy()
    nodes["name"] = nodes["name"].astype(str)
    renamed = nodes.index[(nodes["rank"] == 2) & (nodes["kind"] == "cpu")][5]
    nodes.loc[renamed, "name"] = "aten::not_on_the_other_ranks"
    assert median_rank(DataflowGraph(nodes, identical.edges, identical.step_ns, wraps=identical.wraps)) is None
    w = WhatIf(DataflowGraph(nodes, identical.edges, identical.step_ns, wraps=identical.wraps), fold=True)
    assert w.replay().step_ns == pytest.approx(Replayer(identical).replay().step_ns, rel=1e-9) and not w.folded


def test_a_recorded_run_folds_and_its_prediction_says_so(recorded_run: Path) -> None:
    analysis = RunAnalysis.open(recorded_run)
    folded = predict(analysis, Change(bucket_cap_mb=1.0), fold=True)
    every = predict(analysis, Change(bucket_cap_mb=1.0))
    assert folded["ranks_folded"] is True and "ranks_folded" not in every
    assert len({p["unanchored_step_ms"] for p in folded["per_rank"]}) == 1  # every rank the median rank's time
    assert predict(analysis, Change(), fold=True)["predicted_step_ms"] == pytest.approx(
        predict(analysis, Change())["predicted_step_ms"])  # the recorded configuration anchors both


def test_optimize_fold_ranks_switch(recorded_run: Path) -> None:
    result = dpro("optimize", recorded_run, "--json", "--budget", "30", "--fold-ranks")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["search"]["tricks"]["fold"] is True and data["strategies"]
