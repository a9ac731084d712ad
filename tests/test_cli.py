"""The command line itself: help, version, and one-line errors on bad input."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpro import __version__
from dpro.cli import main

from .conftest import assert_one_line_error, dpro


def test_version() -> None:
    result = dpro("--version")
    assert result.returncode == 0 and __version__ in result.stdout


COMMANDS = [[]] + [[name] for name in sorted(main.lazy)] + [["anomaly", name] for name in ("search", "probe", "counters")]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: list[str]) -> None:
    result = dpro(*command, "--help")
    assert result.returncode == 0 and "Usage: dpro" in result.stdout
    assert len(result.stdout.splitlines()) > 3


def test_help_imports_only_the_command_line() -> None:
    # besides the CLI, only modules that import nothing: the error type, the version, the hooks' names
    code = ("import sys; from dpro.cli import main\n"
            "try: main(['--help'])\nexcept SystemExit: pass\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pandas', 'numpy', 'torch', 'numba', 'distributed')\n"
            "               or (m.startswith('dpro.') and not m.startswith('dpro.cli') and m not in ('dpro.errors', 'dpro._version', 'dpro.comm_hooks')))\n"
            "print('IMPORTED', heavy)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "IMPORTED []" in result.stdout, result.stdout[-500:]
    assert "replay" in result.stdout and "diagnose" in result.stdout


def test_record_without_a_command(tmp_path: Path) -> None:
    assert_one_line_error(dpro("record", "-o", tmp_path / "run"), "missing the command")
    assert_one_line_error(dpro("record", "-o", tmp_path / "run2", "--"), "missing the command")


def test_record_of_a_command_that_does_not_exist(tmp_path: Path) -> None:
    assert_one_line_error(dpro("record", "-o", tmp_path / "run", "--", "no-such-program-xyz"),
                          "command not found: no-such-program-xyz")


def test_info_on_a_run_of_an_unknown_major_version(recorded_run: Path, tmp_path: Path) -> None:
    future = tmp_path / "future-run"
    shutil.copytree(recorded_run / "nodes", future / "nodes")
    manifest = json.loads((recorded_run / "run.json").read_text())
    (future / "run.json").write_text(json.dumps({**manifest, "format_version": "2.0"}))
    assert_one_line_error(dpro("info", future), "run format 2.0", "reads 1.x")


def test_info_on_a_single_real_trace() -> None:
    """A public A100 trace (tests/data/NOTICE), read as one trace: its rank, steps and events."""
    from .conftest import ROOT

    result = dpro("info", ROOT / "tests" / "data" / "gpu" / "a100-2rank-ddp-rank0.json.gz", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["kind"] == "trace" and summary["ranks"] == [0]
    assert summary["per_rank"][0]["steps"] > 0 and summary["per_rank"][0]["events"] > 0
    assert dpro("info", ROOT / "tests" / "data" / "gpu" / "a100-2rank-ddp-rank0.json.gz").returncode == 0


@pytest.mark.parametrize("content", [b"", b"not json at all", gzip.compress(b"{\"traceEvents\": [")[:-4],
                                     b"{\"no\": \"events\"}"])
def test_info_on_an_unreadable_trace(tmp_path: Path, content: bytes) -> None:
    trace = tmp_path / "rank0.json.gz"
    trace.write_bytes(content)
    assert_one_line_error(dpro("info", trace), str(trace))


def test_info_on_a_missing_path(tmp_path: Path) -> None:
    assert_one_line_error(dpro("info", tmp_path / "nothing-here"), "no such file or directory")


def test_info_on_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    assert_one_line_error(dpro("info", tmp_path), "not a dpro run directory")


def test_merge_into_a_non_empty_directory(recorded_run: Path, tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    assert_one_line_error(dpro("merge", tmp_path / "taken", recorded_run), "not empty")
