"""The run model: a run opened once, its analysis stored and reused, its per-rank stage fanned out."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

import dpro.analysis.run as run_model
import dpro.graph.kineto as kineto
import dpro.replayer.simulate as simulate
from dpro.analysis import RunAnalysis
from dpro.cli import main
from dpro.code_hash import feeding_modules
from tools.source_view import installed_view

from .conftest import dpro


@pytest.fixture
def fresh_run(recorded_run: Path, tmp_path: Path) -> Path:
    """A copy of the recorded run without any derived data."""
    copy = tmp_path / "run"
    shutil.copytree(recorded_run, copy, ignore=shutil.ignore_patterns("derived"))
    return copy


def forbid(monkeypatch: pytest.MonkeyPatch, *targets: tuple[object, str]) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the stored analysis should have been used")

    for owner, name in targets:
        monkeypatch.setattr(owner, name, refuse)


def test_a_second_replay_and_critical_path_decode_no_trace_and_build_no_graph(
        fresh_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = {cmd: dpro(cmd, fresh_run, "--json") for cmd in ("replay", "critical-path")}
    assert all(r.returncode == 0 for r in first.values()), [r.stderr for r in first.values()]
    assert (fresh_run / "derived" / "analysis-aligned" / "graph.json").is_file()
    forbid(monkeypatch, (kineto, "parse"), (run_model, "map_ranks"), (run_model, "build_graph"), (simulate, "replay"))
    for cmd, earlier in first.items():
        again = CliRunner().invoke(main, [cmd, str(fresh_run), "--json"])
        assert again.exit_code == 0, again.output
        assert json.loads(again.output) == json.loads(earlier.stdout)


def test_the_stored_analysis_equals_a_fresh_one(fresh_run: Path) -> None:
    built = RunAnalysis.open(fresh_run)
    built_graph, built_replay = built.graph, built.replay()
    assert built.built
    read = RunAnalysis.open(fresh_run)
    graph, replayed = read.graph, read.replay()
    assert not read.built
    pd.testing.assert_frame_equal(graph.nodes, built_graph.nodes, check_dtype=False)
    pd.testing.assert_frame_equal(graph.edges, built_graph.edges, check_dtype=False)
    assert graph.step_ns == built_graph.step_ns and graph.clock_offsets_ns == built_graph.clock_offsets_ns
    assert replayed.step_ns == built_replay.step_ns and replayed.critical_path == built_replay.critical_path
    pd.testing.assert_frame_equal(read.collectives, built.collectives, check_dtype=False)


def test_a_changed_input_or_option_rebuilds(fresh_run: Path) -> None:
    RunAnalysis.open(fresh_run).graph
    clock = fresh_run / "ranks" / "1" / "clock.json"
    os.utime(clock, ns=(clock.stat().st_atime_ns, clock.stat().st_mtime_ns + 10**9))
    changed = RunAnalysis.open(fresh_run)
    changed.graph
    assert changed.built, "a newer clock.json is another input"
    unaligned = RunAnalysis.open(fresh_run, align=False)
    unaligned.graph
    assert unaligned.built and (fresh_run / "derived" / "analysis-unaligned").is_dir()
    again = RunAnalysis.open(fresh_run)
    again.graph
    assert not again.built, "each option keeps its own stored analysis"


def test_another_code_version_rebuilds(fresh_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    RunAnalysis.open(fresh_run).graph
    monkeypatch.setattr(run_model, "code_hash", lambda *modules: "another version")
    analysis = RunAnalysis.open(fresh_run)
    analysis.graph
    assert analysis.built


def test_an_edit_to_any_module_that_feeds_the_analysis_rebuilds_it(fresh_run: Path, tmp_path: Path) -> None:
    """The stored analysis's code key is every module the run model imports, found from the
    imports: an edit to ``dpro/analysis/fanout.py`` (never listed by hand) rebuilds it, an edit
    to the dashboard does not. The edits are made in a copy of the source, run in its place."""
    view = installed_view(tmp_path / "source")
    assert "dpro.analysis.fanout" in feeding_modules("dpro.analysis.run")

    def replay_key() -> str:
        env = {**os.environ, "PYTHONPATH": str(view)}
        result = subprocess.run([sys.executable, "-m", "dpro", "replay", str(fresh_run), "--json"], cwd=tmp_path,
                                env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        return json.loads((fresh_run / "derived" / "analysis-aligned" / "graph.json").read_text())["key"]["code"]

    def edit(module: str) -> None:
        link = view / module
        text = link.read_text()
        link.unlink()
        link.write_text(text + "\n# an edit\n")

    first = replay_key()
    edit("dpro/dashboard/app.py")
    assert replay_key() == first, "the dashboard does not feed the analysis"
    edit("dpro/analysis/fanout.py")
    assert replay_key() != first, "fanout.py feeds the graph: its edit rebuilds the analysis"


def test_a_read_only_run_keeps_its_analysis_in_the_users_cache(fresh_run: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folders = [p for p in [fresh_run, *fresh_run.rglob("*")] if p.is_dir()]
    for folder in folders:
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        first = RunAnalysis.open(fresh_run)
        first.graph
        again = RunAnalysis.open(fresh_run)
        again.graph
        assert first.built and not again.built
        assert not (fresh_run / "derived").exists()
        stored = list((tmp_path / "cache" / "dpro" / "runs").glob("*/analysis-aligned/graph.json"))
        assert len(stored) == 1
        assert (stored[0].parents[1] / "traces" / "0" / "meta.json").is_file(), "trace caches there too"
    finally:
        for folder in folders:
            folder.chmod(stat.S_IRWXU)


def test_the_pool_and_a_dask_cluster_give_the_graph_of_a_serial_analysis(recorded_run: Path) -> None:
    from distributed import LocalCluster

    serial = RunAnalysis.open(recorded_run, cache=False, workers=1).graph
    pooled = RunAnalysis.open(recorded_run, cache=False, workers=2).graph
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        on_dask = RunAnalysis.open(recorded_run, cache=False, scheduler=cluster.scheduler_address).graph
    for other in (pooled, on_dask):
        pd.testing.assert_frame_equal(other.nodes, serial.nodes)
        pd.testing.assert_frame_equal(other.edges, serial.edges)
        assert other.step_ns == serial.step_ns


def test_an_unreachable_scheduler_is_a_one_line_error(fresh_run: Path) -> None:
    from .conftest import assert_one_line_error

    import os

    quick = {**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "3s"}  # Dask's own setting, honoured
    assert_one_line_error(dpro("replay", fresh_run, "--scheduler", "tcp://127.0.0.1:9", env=quick), "Dask scheduler")


def test_a_progress_bar_on_a_terminal_and_none_when_piped(fresh_run: Path) -> None:
    piped = dpro("replay", fresh_run, "--workers", "1")
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    script = shutil.which("script")
    if script is None:
        pytest.skip("util-linux `script` is needed for a pseudo-terminal")
    shutil.rmtree(fresh_run / "derived")
    command = f"stty cols 100 rows 30; {sys.executable} -m dpro replay {fresh_run} --workers 1"  # a sized terminal
    on_terminal = subprocess.run([script, "-qec", command, "/dev/null"], capture_output=True, text=True, timeout=300)
    assert on_terminal.returncode == 0 and "decoding traces" in on_terminal.stdout, on_terminal.stdout[-500:]


def test_critical_path_prints_a_summary_and_all_on_request(fresh_run: Path) -> None:
    summary = dpro("critical-path", fresh_run)
    assert summary.returncode == 0, summary.stderr
    lines = summary.stdout.splitlines()
    assert lines[0].startswith("critical path of rank") and "compute" in summary.stdout
    assert len(lines) <= 30, "one screen"
    everything = dpro("critical-path", fresh_run, "--all")
    path = json.loads(dpro("critical-path", fresh_run, "--json").stdout)["path"]
    assert len(everything.stdout.splitlines()) >= len(path)
