"""`dpro diagnose` on real recorded 2-rank gloo jobs: a rank made slow is named, with the
cause, and a healthy job's output is well formed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import EXAMPLE, SMALL_LM, TORCHRUN, dpro


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("straggler") / "run"
    done = subprocess.run([sys.executable, "-m", "dpro", "record", "-o", str(run), "--skip", "4", "--warmup", "1",
                           "--steps", "4", "--", *TORCHRUN, "--nproc-per-node=2", str(EXAMPLE), "--steps", "14",
                           *SMALL_LM, "--slow-rank", "1", "--slow-ms", "40"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return run


def test_a_slow_rank_is_named_first_as_a_compute_straggler(straggler_run: Path) -> None:
    out = dpro("diagnose", straggler_run, "--json")
    assert out.returncode == 0, out.stderr
    first = json.loads(out.stdout)["suspects"][0]
    assert (first["kind"], first["rank"]) == ("rank", 1)
    assert first["evidence"]["cause"].startswith("compute") and first["evidence"]["late_ms"] > 20
    text = dpro("diagnose", straggler_run)
    assert text.returncode == 0 and text.stdout.splitlines()[0].split()[1:4] == ["rank", "rank", "1"]


def test_diagnose_json_shape_on_a_healthy_run(recorded_run: Path) -> None:
    out = dpro("diagnose", recorded_run, "--json")
    assert out.returncode == 0, out.stderr
    suspects = json.loads(out.stdout)["suspects"]
    assert isinstance(suspects, list)
    for s in suspects:  # a busy test machine may make one rank consistently slower: allowed, well formed
        assert set(s) == {"kind", "name", "rank", "host", "score", "evidence"}
        assert s["kind"] in ("rank", "host", "nic", "link", "switch", "path")
    assert [s["score"] for s in suspects] == sorted((s["score"] for s in suspects), reverse=True)
