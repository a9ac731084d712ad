"""``dpro whatif``: a recorded job's step time under another configuration."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks.testbed.protocol import JOB as TESTBED_JOB
from benchmarks.testbed.spec import draw_job
from dpro.analysis import RunAnalysis
from dpro.replayer.linkmodel import wire_rates
from dpro.run_format import open_run
from tools.testing.netns import NetnsCluster, can_build_namespaces, record_across_hosts

from .conftest import JOBS, assert_one_line_error, dpro


def whatif(run: Path, *args: str) -> dict:
    result = dpro("whatif", run, *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize(("args", "fragment"), [
    ((), "nothing to change"),
    (("--bucket-cap-mb", "0"), "--bucket-cap-mb"),
    (("--bucket-cap-mb", "lots"), "--bucket-cap-mb"),
    (("--bandwidth-scale", "-2"), "--bandwidth-scale"),
    (("--compress", "zip"), "'zip' is not one of fp16, bf16, powersgd:RANK"),
    (("--compress", "powersgd:0"), "a rank of at least 1"),
    (("--compress", "powersgd:x"), "a rank of at least 1"),
    (("--world-size", "1"), "--world-size"),
    (("--ranks-per-host", "2"), "--ranks-per-host goes with --world-size"),
    (("--world-size", "8"), "inter-host links"),  # recorded on one host: no measured link between hosts
])
def test_bad_options_are_one_line_errors(recorded_run: Path, args: tuple[str, ...], fragment: str) -> None:
    assert_one_line_error(dpro("whatif", recorded_run, *args), fragment)


def test_a_run_without_ddp_has_no_buckets_to_change(tmp_path: Path) -> None:
    result = dpro("record", "-o", tmp_path / "run", "--skip", "2", "--warmup", "0", "--steps", "2", "--no-calibrate",
                  "--", sys.executable, JOBS / "manual_steps.py")
    assert result.returncode == 0, result.stderr
    assert_one_line_error(dpro("whatif", tmp_path / "run", "--bucket-cap-mb", "1"), "no DDP bucket layout")
    assert_one_line_error(dpro("whatif", tmp_path / "run", "--compress", "bf16"), "no DDP bucket layout")
    assert_one_line_error(dpro("whatif", tmp_path / "missing", "--compress", "bf16"), "is not a directory")


def test_the_recorded_bucket_cap_rebuilds_the_recorded_buckets_and_predicts_the_baseline(recorded_run: Path) -> None:
    recorded = open_run(recorded_run).rank_meta(0).ddp[0].bucket_bytes
    out = whatif(recorded_run, "--bucket-cap-mb", "0.05")
    assert out["buckets_bytes"] == recorded and len(recorded) > 1
    assert out["link_model"] == "calibration"
    assert out["predicted_step_ms"] == pytest.approx(out["baseline_step_ms"], rel=1e-9)
    assert {"baseline_step_ms", "predicted_step_ms", "per_rank"} <= out.keys() and len(out["per_rank"]) == 2


def test_a_larger_cap_fuses_the_buckets_and_compression_is_applied_to_them(recorded_run: Path) -> None:
    recorded = open_run(recorded_run).rank_meta(0).ddp[0].bucket_bytes
    fused = whatif(recorded_run, "--bucket-cap-mb", "100")
    assert fused["buckets_bytes"] == [sum(recorded)]
    compressed = whatif(recorded_run, "--bucket-cap-mb", "100", "--compress", "fp16")
    assert compressed["change"] == {"bucket_cap_mb": 100.0, "compress": "fp16"}
    assert compressed["compression"]["bytes_ratio"] == 0.5 and compressed["compression"]["hook_ms"] > 0
    low_rank = whatif(recorded_run, "--compress", "powersgd:1")["compression"]
    higher_rank = whatif(recorded_run, "--compress", "powersgd:4")["compression"]
    assert 0 < low_rank["bytes_ratio"] < higher_rank["bytes_ratio"] < 1, "factors of rank 1 send the least"
    assert 0 < low_rank["hook_ms"] < higher_rank["hook_ms"]


def test_interference_comes_from_the_calibration_and_can_be_left_out(recorded_run: Path) -> None:
    aware = whatif(recorded_run, "--bucket-cap-mb", "100")
    assert aware["interference"]["source"] == "calibration"
    unaware = whatif(recorded_run, "--bucket-cap-mb", "100", "--no-interference")
    assert unaware["interference"] is None
    # the recorded configuration replays alike either way; only the change is re-timed
    assert unaware["replayed_step_ms"] == pytest.approx(aware["replayed_step_ms"], rel=1e-12)
    if aware["interference"]["compute"] > 0 or aware["interference"]["comm"] > 0:
        assert unaware["unanchored_step_ms"] != aware["unanchored_step_ms"]


def test_the_table_names_the_change_and_every_rank(recorded_run: Path) -> None:
    result = dpro("whatif", recorded_run, "--world-size", "4", "--ranks-per-host", "4")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "change: world-size 4, ranks-per-host 4"
    assert [line.split()[0] for line in lines[2:5]] == ["0", "1", "job"]
    assert lines[-1].startswith("interference: compute ") and lines[-1].endswith("(from calibration)")


def test_fused_ops_shorten_the_step(recorded_run: Path) -> None:
    result = dpro("whatif", recorded_run, "--fuse-ops", "--json")
    assert result.returncode == 0, result.stderr
    predicted = json.loads(result.stdout)
    assert predicted["change"] == {"fuse_ops": True} and 0 < predicted["fusion"]["cpu"]["forward_share"] < 1
    assert predicted["predicted_step_ms"] < predicted["baseline_step_ms"]


@pytest.mark.privileged
def test_a_faster_link_predicts_the_speed_up_of_a_job_bound_by_it(tmp_path: Path) -> None:
    """The replay's step boundary is no longer the recorded period: a job waiting on a slow link
    between two hosts is predicted faster when the link is. The job is the testbed's emulated
    device (its compute off the CPU), so that its profiled window runs like its other steps (the
    example's CPU-bound window once replayed at 1.8x its unprofiled steps here)."""
    reason = can_build_namespaces()
    if reason:
        pytest.skip(reason)
    run = tmp_path / "run"
    spec = draw_job(3, compute_ms=(30, 50), grad_mib=(0.5, 1.0))
    with NetnsCluster(2, rates={0: "20mbit", 1: "20mbit"}) as cluster:
        results = record_across_hosts(cluster, run, [TESTBED_JOB, "--spec", spec.to_json(), "--steps", "20"],
                                      record_args=("--skip", "6", "--warmup", "1", "--steps", "4"), timeout=300)
    assert all(r.returncode == 0 for r in results), "\n".join(  # whole, not a list pytest would cut
        f"--- host {i}: exit {r.returncode}\n{r.stderr[-4000:]}" for i, r in enumerate(results))
    analysis = RunAnalysis(open_run(run))
    wire = wire_rates(analysis.calibrations, analysis.hosts)
    assert set(wire) == {"inter"} and 0.7 < wire["inter"] * 8e3 / 20 < 1.3, "the calibration's streams found tc's rate"
    same = whatif(run, "--bandwidth-scale", "1")
    faster = whatif(run, "--bandwidth-scale", "4")
    assert same["predicted_step_ms"] == pytest.approx(same["baseline_step_ms"], rel=1e-9)
    assert faster["predicted_step_ms"] < 0.6 * faster["baseline_step_ms"], faster
