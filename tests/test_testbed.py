"""The quiet testbed's parts: the emulated-device job recorded by dpro, the measuring protocol,
the frozen-model check; and the disturbed profiling window flagged by dpro."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from benchmarks.testbed import frozen
from benchmarks.testbed.protocol import JOB, Config, interleaved, spread_pct
from benchmarks.testbed.spec import draw_job
from tests.conftest import JOBS, ROOT, TORCHRUN, dpro


def test_drawn_jobs_are_reproducible_and_varied():
    assert draw_job(3) == draw_job(3)
    jobs = [draw_job(s) for s in range(30)]
    assert {j.shape for j in jobs} == {"even", "embedding", "head"}
    for j in jobs:
        assert 60 <= j.compute_ms <= 140 and 2 * 2**20 <= j.grad_bytes <= 6.1 * 2**20
        assert all(layer.forward_fixed_us > 0 and layer.forward_per_sample_us > 0 for layer in j.layers)


def test_custom_op_job_records_with_the_op_on_the_critical_path(tmp_path):
    spec = draw_job(5)
    run = tmp_path / "run"
    result = dpro("record", "-o", run, "--skip", "3", "--warmup", "1", "--steps", "2", "--", *TORCHRUN,
                  "--nproc-per-node=2", JOB, "--spec", spec.to_json(), "--steps", "9", "--bucket-cap-mb", "1")
    assert result.returncode == 0, result.stderr
    path = dpro("critical-path", run, "--json")
    assert path.returncode == 0, path.stderr
    names = [p["name"] for p in json.loads(path.stdout)["path"]]
    # the backward of every layer is on the path (the forward's ops are nested in DDP's forward)
    assert names.count("autograd::engine::evaluate_function: _HoldBackward") == len(spec.layers), names
    assert "DistributedDataParallel.forward" in names
    # the op holds its thread for the time the spec sets: each profiled step's forward ops
    from dpro.analysis import RunAnalysis
    events = RunAnalysis.open(run).tables(0).events
    held = events[events["name"] == "dpro_testbed::hold"].groupby("step")["dur_ns"]
    assert (held.count() == len(spec.layers)).all() and len(held) == 2
    expected_ns = 1e3 * sum(l.forward_fixed_us + l.forward_per_sample_us * spec.batch for l in spec.layers)
    assert held.sum().to_numpy() == pytest.approx([expected_ns] * 2, rel=0.1)


class _Counting:
    """A stand-in for the testbed's clusters that returns each configuration's next value."""

    def __init__(self, values: dict[str, list[float]]) -> None:
        self.values = {k: list(v) for k, v in values.items()}
        self.order: list[str] = []
        self.log = lambda m: None

    def measure(self, config: Config) -> float:
        self.order.append(config.name)
        return self.values[config.name].pop(0)


def test_interleaved_runs_rounds_in_fresh_orders():
    job = draw_job(1)
    configs = [Config(f"c{i}", job, 100) for i in range(4)]
    bed = _Counting({c.name: [1.0, 2.0, 3.0] for c in configs})
    medians = interleaved(bed, configs, repeats=3, seed=7)
    assert medians == {c.name: [1.0, 2.0, 3.0] for c in configs}
    rounds = [bed.order[i:i + 4] for i in (0, 4, 8)]
    assert all(sorted(r) == ["c0", "c1", "c2", "c3"] for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # not one fixed order
    assert spread_pct([100.0, 103.0, 101.0]) == pytest.approx(3.0)


@pytest.fixture
def model_tree(tmp_path):
    """A git checkout of the model's sources, to freeze and change."""
    for source in frozen.MODEL_SOURCES:
        src = ROOT / source
        dst = tmp_path / source
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    for argv in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "m"]):
        subprocess.run(["git", *argv], cwd=tmp_path, check=True)
    return tmp_path


def test_a_changed_model_is_not_called_held_out(model_tree):
    path = model_tree / "frozen.json"
    assert not frozen.check(path, model_tree).held_out  # never frozen
    state = frozen.freeze(11, path, model_tree)
    assert state.held_out and state.seed == 11 and "held out" in state.why
    replayer = model_tree / "replayer" / "simulate.py"
    replayer.write_text(replayer.read_text() + "\n# a change after the freeze\n")
    state = frozen.check(path, model_tree)
    assert not state.held_out and state.why.startswith("NOT held out")
    with pytest.raises(SystemExit, match="commit the model first"):
        frozen.freeze(12, path, model_tree)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "c"], cwd=model_tree,
                   check=True)
    with pytest.raises(SystemExit, match="was used before"):
        frozen.freeze(11, path, model_tree)
    assert frozen.freeze(12, path, model_tree).held_out


@pytest.mark.parametrize("slow", [False, True])
def test_a_disturbed_profiling_window_is_flagged(tmp_path, slow):
    run = tmp_path / "run"
    job = ["--steps", "16", *(["--slow", "5", "7"] if slow else [])]
    result = dpro("record", "-o", run, "--skip", "4", "--warmup", "1", "--steps", "3", "--no-calibrate", "--",
                  *TORCHRUN, "--nproc-per-node=2", JOBS / "disturbed_window.py", *job)
    assert result.returncode == 0, result.stderr
    replay, info = dpro("replay", run), dpro("info", run)
    assert replay.returncode == 0 and info.returncode == 0, replay.stderr + info.stderr
    for out in (replay.stdout, info.stdout):
        assert ("warning: the profiling window's steps ran" in out) == slow, out
    window = json.loads(dpro("replay", run, "--json").stdout)["window"]
    assert window["disturbed"] == slow
    if slow:
        assert window["slowdown_pct"] > 50
