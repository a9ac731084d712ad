"""Shared fixtures: the ``dpro`` command, small job scripts, and a real recorded 2-rank run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JOBS = Path(__file__).resolve().parent / "jobs"
FAKES = Path(__file__).resolve().parent / "fakes"
EXAMPLE = ROOT / "examples" / "train_lm.py"
DATA = Path(__file__).resolve().parent / "data"  # real traces from public projects; see data/NOTICE
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
# A small, quick configuration of the example job.
SMALL_LM = ["--d-model", "64", "--layers", "1", "--seq-len", "32"]


def dpro(*args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """Run the real ``dpro`` command line and capture its output."""
    return subprocess.run([sys.executable, "-m", "dpro", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """Bad input: a non-zero exit and a single ``Error: ...`` line, never a traceback."""
    assert result.returncode != 0, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="session")
def recorded_run(tmp_path_factory) -> Path:
    """A real 2-rank gloo DDP job recorded by ``dpro record``: 12 steps, steps 4-5 profiled, DDP
    buckets of 0.05 MB (five of them: several all-reduces per step)."""
    run = tmp_path_factory.mktemp("recorded") / "run"
    result = dpro("record", "-o", run, "--skip", "3", "--warmup", "1", "--steps", "2", "--",
                  *TORCHRUN, "--nproc-per-node=2", EXAMPLE, "--steps", "12", *SMALL_LM, "--bucket-cap-mb", "0.05")
    assert result.returncode == 0, result.stderr
    return run




@pytest.fixture(scope="session")
def downloads(tmp_path_factory) -> Path:
    """Where the browser saves what a page downloads."""
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="session")
def browser(downloads):
    """A real headless Chromium driven by Selenium, with the browser console's messages kept
    and downloads saved in ``downloads``."""
    from tools.testing.browser import headless_chromium

    driver = headless_chromium(downloads)
    yield driver
    driver.quit()
