"""A partial run (a rank missing, or without its metadata or trace) is said by every command that
reads runs and by the dashboard; ``--strict`` refuses it with a one-line error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dpro.run_format import open_run
from tools.testing.browser import start_dashboard

from .conftest import assert_one_line_error, dpro

COMMANDS = [("info",), ("replay",), ("critical-path",), ("whatif", "--fuse-ops"), ("optimize",), ("diagnose",)]
GAP = "rank 1 of the job's 2 wrote nothing"


@pytest.fixture(scope="module")
def partial_run(recorded_run: Path, tmp_path_factory) -> Path:
    """The recorded 2-rank run with rank 1's files gone (its host lost them, say)."""
    run = tmp_path_factory.mktemp("partial") / "run"
    shutil.copytree(recorded_run, run, ignore=shutil.ignore_patterns("derived"))
    shutil.rmtree(run / "ranks" / "1")
    return run


def test_a_whole_run_has_no_gaps(recorded_run: Path) -> None:
    assert open_run(recorded_run).gaps == []


def test_gaps_name_each_missing_part(recorded_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(recorded_run, run, ignore=shutil.ignore_patterns("derived"))
    (run / "ranks" / "1" / "trace.json.gz").unlink()
    assert open_run(run).gaps == ["rank 1 wrote no trace"]
    (run / "ranks" / "1" / "meta.json").write_text("{not json")
    assert open_run(run).gaps == ["rank 1's meta.json is unreadable", "rank 1 wrote no trace"]
    (run / "ranks" / "1" / "meta.json").unlink()
    assert open_run(run).gaps == ["rank 1 wrote no meta.json", "rank 1 wrote no trace"]
    meta = json.loads((run / "ranks" / "0" / "meta.json").read_text())
    (run / "ranks" / "0" / "meta.json").write_text(json.dumps({**meta, "world_size": 9}))
    assert open_run(run).gaps[0] == "ranks 2-8 of the job's 9 wrote nothing"


def test_a_missing_trace_says_why(recorded_run: Path, tmp_path: Path) -> None:
    """Not saved (as the node recorded it), the node lost, the rank stopped inside the window, the
    window not reached: told apart from the run's own files (window: steps 3-5 of 12)."""
    run = tmp_path / "run"
    shutil.copytree(recorded_run, run, ignore=shutil.ignore_patterns("derived"))
    (run / "ranks" / "1" / "trace.json.gz").unlink()
    steps = run / "ranks" / "1" / "steps.csv"
    whole = steps.read_text().splitlines()
    steps.write_text("\n".join(whole[:6]) + "\n")  # the header and steps 0-4
    assert open_run(run).why_no_trace(1) == "rank 1 stopped at step 4, inside the profiling window (steps 3-5)"
    steps.write_text("\n".join(whole[:3]) + "\n")  # steps 0-1
    assert open_run(run).why_no_trace(1) == "rank 1 ran 2 steps: the profiling window (from step 3) was not reached"
    node_file, = run.glob("nodes/*/node.json")
    node = json.loads(node_file.read_text())
    node_file.write_text(json.dumps({k: v for k, v in node.items() if k not in ("ended_ns", "exit_code", "signal")}))
    opened = open_run(run)
    assert opened.why_no_trace(1).startswith(f"rank 1's node {node_file.parent.name} was lost (no end record) after step")
    assert any(gap.startswith(f"node {node_file.parent.name} was lost") for gap in opened.gaps)
    node_file.write_text(json.dumps({**node, "lost": [{"file": "ranks/1/trace.json.gz", "why": "disk full", "rank": 1}]}))
    assert open_run(run).why_no_trace(1) == "rank 1's trace was not saved: disk full"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_every_command_warns_of_a_partial_run_and_strict_refuses_it(partial_run: Path, command: tuple[str, ...]) -> None:
    result = dpro(command[0], partial_run, *command[1:])
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning: partial run")]
    assert len(warnings) == 1 and GAP in warnings[0], result.stderr
    assert_one_line_error(dpro(command[0], partial_run, *command[1:], "--strict"), GAP, "--strict")


@pytest.mark.parametrize("gap", ["no trace", "unreadable meta", "undecodable trace"])
def test_a_rank_without_its_trace_or_metadata_is_warned_and_the_others_analysed(recorded_run: Path, tmp_path: Path,
                                                                               gap: str) -> None:
    """Each command run twice: the second reads the stored analysis and still says what is missing."""
    run = tmp_path / "run"
    shutil.copytree(recorded_run, run, ignore=shutil.ignore_patterns("derived"))
    trace = run / "ranks" / "1" / "trace.json.gz"
    if gap == "no trace":
        trace.unlink()
    elif gap == "undecodable trace":  # its host's disk filled while it was written, say
        trace.write_bytes(trace.read_bytes()[:2000])
    else:
        (run / "ranks" / "1" / "meta.json").write_text("{not json")
    for command in (("replay", "--json"), ("whatif", "--fuse-ops", "--json"), ("replay", "--json")):
        result = dpro(command[0], run, *command[1:])
        assert result.returncode == 0, result.stderr
        warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning: partial run")]
        assert len(warnings) == 1 and "rank 1" in warnings[0], result.stderr
        ranks = [r["rank"] for r in json.loads(result.stdout)["per_rank"]]
        assert ranks == ([0, 1] if gap == "unreadable meta" else [0]), ranks
    assert_one_line_error(dpro("replay", run, "--strict"), "rank 1")
    diagnosed = dpro("diagnose", run)
    assert diagnosed.returncode == 0 and "Warning: partial run" in diagnosed.stderr, diagnosed.stderr
    if gap == "undecodable trace":
        assert "truncated gzip" in warnings[0]
        assert_one_line_error(dpro("info", run, "--strict"), "rank 1's trace cannot be decoded", "truncated gzip")
        info = dpro("info", run, "--json")
        assert info.returncode == 0 and "rank 1's trace cannot be decoded" in info.stderr
        assert [r["trace_error"] is not None for r in json.loads(info.stdout)["per_rank"]] == [False, True]


def test_the_dashboard_names_a_rank_whose_trace_cannot_be_decoded(recorded_run: Path, tmp_path: Path) -> None:
    from dashboard.runs import RunView
    from dpro.analysis import RunAnalysis
    from dpro.errors import PartialRunWarning

    run = tmp_path / "run"
    shutil.copytree(recorded_run, run, ignore=shutil.ignore_patterns("derived"))
    (run / "ranks" / "0" / "trace.json.gz").write_text("not a trace")
    with pytest.warns(PartialRunWarning, match="rank 0's trace cannot be decoded"):
        view = RunView(RunAnalysis.open(run, workers=1)).prepare()
    assert view.has_replay and view.analysis.analysed_ranks == [1], view.missing
    assert any("rank 0's trace cannot be decoded" in gap for gap in view.gaps), view.gaps
    assert set(view.lanes.lane_rank.tolist()) == {1}


def test_a_whole_run_of_one_rank_has_nothing_unclosed(tmp_path: Path) -> None:
    """A collective whose group is one rank closes alone: no warning on a whole run (a real
    1-rank H100 trace, whose 15 all-reduces no other rank matches; copied, so that its stored
    analysis is written outside the repository)."""
    from .conftest import ROOT

    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "data" / "runs" / "h100-ddp-1rank", run)
    result = dpro("replay", run, "--json")
    assert result.returncode == 0 and "Warning" not in result.stderr, result.stderr
    assert json.loads(result.stdout)["unclosed_collectives"] == []


def test_a_ddp_entry_whose_collection_failed_is_left_out(recorded_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(recorded_run, run, ignore=shutil.ignore_patterns("derived"))
    for rank in (0, 1):
        meta = run / "ranks" / str(rank) / "meta.json"
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "ddp": [{"error": "AttributeError: gone"}]}))
    assert dpro("replay", run).returncode == 0
    assert_one_line_error(dpro("whatif", run, "--bucket-cap-mb", "1"), "no DDP bucket layout")


def test_the_replay_names_the_collectives_it_could_not_close(partial_run: Path, recorded_run: Path) -> None:
    unclosed = json.loads(dpro("replay", partial_run, "--json").stdout)["unclosed_collectives"]
    assert unclosed and {u["rank"] for u in unclosed} == {0} and "all_reduce" in {u["coll"] for u in unclosed}
    assert "not closed" in dpro("replay", partial_run).stdout
    assert json.loads(dpro("replay", recorded_run, "--json").stdout)["unclosed_collectives"] == []


def test_the_dashboard_says_the_run_is_partial(browser, partial_run: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    assert_one_line_error(dpro("dashboard", partial_run, "--strict"), GAP)
    server, url = start_dashboard(str(partial_run))
    browser.get_log("browser")  # drop what earlier pages of this session's browser logged
    try:
        browser.get(url + "/")
        WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.ID, "partial-run"))
        assert GAP in browser.find_element(By.ID, "partial-run").text
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        server.terminate()
        server.wait(timeout=30)
