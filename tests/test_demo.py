"""``dpro demo``: the command the README's first line runs (recorded from the installed wheel in
``tests/test_package.py``)."""

from __future__ import annotations

from pathlib import Path

from .conftest import assert_one_line_error, dpro


def test_demo_refuses_a_window_longer_than_the_job(tmp_path: Path) -> None:
    assert_one_line_error(dpro("demo", "-o", tmp_path / "d", "--train-steps", "5"), "does not fit")
    assert not (tmp_path / "d").exists()
