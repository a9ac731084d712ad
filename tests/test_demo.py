"""``dpro demo``: the command the README's first line runs."""

from __future__ import annotations

import json
from pathlib import Path

from dpro.run_format import open_run

from .conftest import assert_one_line_error, dpro


def test_demo_records_the_example_on_two_ranks(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = dpro("demo", "-o", out, "--train-steps", "14", "--skip", "3", "--warmup", "1", "--steps", "2")
    assert result.returncode == 0, result.stderr
    run = open_run(out)
    assert run.ranks == [0, 1] and all(run.trace_path(r) for r in run.ranks)
    assert "median ms" in result.stdout and f"dpro info {out}" in result.stdout
    info = json.loads(dpro("info", out, "--json").stdout)
    assert [r["steps"] for r in info["per_rank"]] == [14, 14]


def test_demo_refuses_a_window_longer_than_the_job(tmp_path: Path) -> None:
    assert_one_line_error(dpro("demo", "-o", tmp_path / "d", "--train-steps", "5"), "does not fit")
    assert not (tmp_path / "d").exists()
