"""The quiet testbed's parts: the emulated-device job recorded by dpro, the measuring protocol,
the frozen-model check; and the disturbed profiling window flagged by dpro."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import warnings
from types import SimpleNamespace

import numpy as np
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
    # DDP's default buckets: only the first (about 1 MiB) is all-reduced during the backward, so a
    # layer's backward leaves the path only if that one call outlasts the rest of the backward
    # (under 1 MB buckets, in CI on 2026-11-28, one all-reduce outlasted the next layer's backward)
    result = dpro("record", "-o", run, "--skip", "3", "--warmup", "1", "--steps", "2", "--", *TORCHRUN,
                  "--nproc-per-node=2", JOB, "--spec", spec.to_json(), "--steps", "9")
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
    ratios = _held_over_spec(events, spec, ways=1)
    assert ratios.shape == (2, len(spec.layers))
    _assert_held_as_set(ratios)


def test_the_tensor_parallel_form_holds_each_layer_split_over_its_group(tmp_path):
    spec = draw_job(5)
    run = tmp_path / "run"
    result = dpro("record", "-o", run, "--skip", "3", "--warmup", "1", "--steps", "2", "--no-calibrate", "--",
                  *TORCHRUN, "--nproc-per-node=2", JOB, "--spec", spec.to_json(), "--steps", "9", "--form", "tp",
                  "--tp", "2")
    assert result.returncode == 0, result.stderr
    from dpro.analysis import RunAnalysis
    analysis = RunAnalysis.open(run)
    assert analysis.parallelism.mesh["shape"] == [1, 2] and analysis.parallelism.tensor_parallel
    events = analysis.tables(0).events
    # half the layer's time each: the whole would hold every op at least twice as long
    ratios = _held_over_spec(events, spec, ways=2)
    assert ratios.shape[1] == len(spec.layers)
    _assert_held_as_set(ratios)
    # one all-reduce of each layer's output, one of each layer's input gradient but the first's
    calls = analysis.graph.collectives
    assert len(calls) == 2 * len(spec.layers) - 1 and set(calls["coll"]) == {"all_reduce"}


def _held_over_spec(events, spec, ways: int) -> np.ndarray:
    """Each profiled step's forward ``hold`` ops (rows: steps, columns: layers in order) over the
    time the spec sets each, split ``ways`` ways."""
    held = events[events["name"] == "dpro_testbed::hold"].sort_values("start_ns")
    spec_ns = np.array([1e3 * (l.forward_fixed_us + l.forward_per_sample_us * spec.batch) / ways
                        for l in spec.layers])
    return np.stack([g["dur_ns"].to_numpy(np.float64) / spec_ns for _, g in held.groupby("step")])


def _assert_held_as_set(ratios: np.ndarray) -> None:
    """A sleep never ends early, and overshoots only when the thread waits for a core: a little
    here, up to 2.7x a step in a loaded CI (2026-11-29), so the quickest quarter of the ops shows
    the time the spec sets."""
    assert ratios.min() >= 0.95, ratios
    assert np.quantile(ratios, 0.25) <= 1.3, ratios


class _Counting:
    """A stand-in for the testbed's clusters that returns each configuration's next value."""

    def __init__(self, values: dict[str, list[float]]) -> None:
        self.values = {k: list(v) for k, v in values.items()}
        self.order: list[str] = []
        self.steal: dict[str, list[float | None]] = {}
        self.log = lambda m: None

    def measure(self, config: Config) -> float:
        self.order.append(config.name)
        return self.values[config.name].pop(0)

    def record(self, config: Config, run_dir) -> None:
        self.order.append(f"record {config.name} into {run_dir.name}")


def test_interleaved_runs_rounds_in_fresh_orders_and_records_sources_once(tmp_path):
    job = draw_job(1)
    configs = [Config(f"c{i}", job, 100) for i in range(4)]
    bed = _Counting({c.name: [1.0, 2.0, 3.0] for c in configs})
    medians = interleaved(bed, configs, repeats=3, seed=7, record_into=tmp_path, sources=["c1", "c3"])
    assert medians == {c.name: [1.0, 2.0, 3.0] for c in configs}
    recorded = [i for i, o in enumerate(bed.order) if o.startswith("record")]
    assert len(recorded) == 2
    assert all(bed.order[i + 1] == bed.order[i].split()[1] for i in recorded)  # each just before its round-1 run
    measured = [o for o in bed.order if not o.startswith("record")]
    rounds = [measured[i:i + 4] for i in (0, 4, 8)]
    assert all(sorted(r) == ["c0", "c1", "c2", "c3"] for r in rounds)
    assert max(recorded) < 6  # both in the first round (its 4 runs and 2 recordings)
    assert len({tuple(r) for r in rounds}) > 1  # not one fixed order
    assert spread_pct([100.0, 103.0, 101.0]) == pytest.approx(3.0)


def test_a_run_the_hypervisor_took_the_cpu_from_is_run_again_once_the_cpu_is_back(monkeypatch):
    # No hypervisor here steals on demand: /proc/stat's reader is a fake that, around each run,
    # counts 100 ticks busy and the next of ``stolen`` (in ticks) stolen; the spins before a run
    # made again read the next of ``spins``, on a clock that only the spins and pauses move
    from benchmarks.testbed import protocol

    stolen, clock = [300, 100, 2], {"busy": 0, "steal": 0}
    spins, now, started, logged = [0.4, 0.2, 0.01, 0.03], {"s": 0.0}, [], []

    def times():
        return {**dict.fromkeys(("nice", "system", "idle", "iowait", "irq", "softirq"), 0),
                "user": clock["busy"], "steal": clock["steal"]}, None

    def run():
        started.append(now["s"])
        clock["busy"] += 100
        clock["steal"] += stolen.pop(0)
        return float(len(stolen))

    def spin(seconds):
        now["s"] += seconds
        return spins.pop(0)

    monkeypatch.setattr(protocol, "read_cpu_times", times)
    monkeypatch.setattr(protocol, "spin_stolen_share", spin)
    monkeypatch.setattr(protocol, "time", SimpleNamespace(monotonic=lambda: now["s"],
                                                          sleep=lambda s: now.update(s=now["s"] + s)))
    bed = protocol.Testbed(log=logged.append)
    config = Config("c", draw_job(1), 100)
    assert bed._unstolen(config, "measuring", run) == (0, pytest.approx(2 / 102))  # the third run, 2% stolen
    assert [str(s) for s in bed.stolen] == ["measuring c: 75% of the CPU stolen, 2.0 ms",
                                            "measuring c: 50% of the CPU stolen, 1.0 ms"]
    first = 3 * protocol.SPIN_S + 2 * protocol.STEAL_POLL_S  # three spins, two pauses
    assert bed.waits == [protocol.Wait(first, 3, 0.01), protocol.Wait(protocol.SPIN_S, 1, 0.03)]
    assert not any(w.gave_up for w in bed.waits)
    assert started == [0.0, first, first + protocol.SPIN_S]  # each rerun after its wait
    assert spins == [] and bed.repeated()[-1].startswith("checks of the CPU before them: 2, ")

    stolen[:], spins[:] = [300, 300, 300], [0.5] * 200  # a hypervisor that never gives it back
    assert bed._unstolen(config, "recording", run) == (0, pytest.approx(0.75))  # the last kept, however stolen
    assert len(bed.stolen) == 4 and stolen == []
    assert [(w.seconds >= protocol.STEAL_WAIT_S, w.share, w.gave_up) for w in bed.waits[2:]] == [(True, 0.5, True)] * 2
    assert sum("on anyway" in m for m in logged) == 2
    assert bed.repeated()[-1].endswith(f"; 2 went on after {protocol.STEAL_WAIT_S:g} s, still over 5%")

    stolen[:], spins[:] = [300, 0], [None]  # no steal in /proc/stat: nothing to wait for
    bed._unstolen(config, "measuring", run)
    assert bed.waits[-1] == protocol.Wait(protocol.SPIN_S, 1, None) and not bed.waits[-1].gave_up


def test_a_spin_keeps_every_cpu_busy_and_reads_the_share_the_hypervisor_took():
    from benchmarks.testbed.protocol import spin_stolen_share
    from dpro.collectors.counters.procstat import BUSY_STATES, read_cpu_times

    before, missing = read_cpu_times()
    if missing:
        pytest.skip(missing)
    share = spin_stolen_share(0.5)
    after = read_cpu_times()[0]
    ticks = sum(after[s] - before[s] for s in (*BUSY_STATES, "steal"))
    wanted = len(os.sched_getaffinity(0)) * 0.5 * os.sysconf("SC_CLK_TCK")
    assert ticks >= 0.8 * wanted, (ticks, wanted)  # every CPU busy, not a sleep
    assert share == pytest.approx((after["steal"] - before["steal"]) / ticks, abs=0.1)


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
    for changed in ("replayer/simulate.py", "benchmarks/fidelity.py"):  # the model, or the harness scoring it
        file = model_tree / changed
        before = file.read_text()
        file.write_text(before + "\n# a change after the freeze\n")
        state = frozen.check(path, model_tree)
        assert not state.held_out and state.why.startswith("NOT held out")
        file.write_text(before)
        assert frozen.check(path, model_tree).held_out
    replayer = model_tree / "replayer" / "simulate.py"
    replayer.write_text(replayer.read_text() + "\n# a change after the freeze\n")
    with pytest.raises(SystemExit, match="commit the model first"):
        frozen.freeze(12, path, model_tree)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "c"], cwd=model_tree,
                   check=True)
    with pytest.raises(SystemExit, match="was used before"):
        frozen.freeze(11, path, model_tree)
    assert frozen.freeze(12, path, model_tree).held_out
    (model_tree / "graph" / "new.py").write_text("X = 1\n")
    subprocess.run(["git", "add", "."], cwd=model_tree, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "n"], cwd=model_tree, check=True)
    drawn = frozen.freeze(path=path, root=model_tree)  # a seed drawn now, none used before
    assert drawn.held_out and drawn.seed not in (11, 12)
    assert json.loads(path.read_text())["used_seeds"] == [11, 12, drawn.seed]


WINDOW_TRIES = 3


@pytest.mark.parametrize("slow", [False, True])
def test_a_disturbed_profiling_window_is_flagged(tmp_path, slow):
    """A window whose steps hold 40 ms more is flagged, an undisturbed one is not. The machine
    may disturb a window too (a loaded CI's window ran 36% slower, its hypervisor's share
    unrecorded): an undisturbed job's flagged window is recorded again, as the warning tells a
    user, up to :data:`WINDOW_TRIES` recordings, each flagged one warned of (``-ra`` lists it)
    with its stolen CPU."""
    from dpro.anomaly.run.nodes import steal_shares
    from dpro.run_format import open_run

    flagged = []
    for attempt in range(1 if slow else WINDOW_TRIES):
        run = tmp_path / f"run{attempt}"
        job = ["--steps", "16", *(["--slow", "5", "7"] if slow else [])]
        result = dpro("record", "-o", run, "--skip", "4", "--warmup", "1", "--steps", "3", "--no-calibrate", "--",
                      *TORCHRUN, "--nproc-per-node=2", JOBS / "disturbed_window.py", *job)
        assert result.returncode == 0, result.stderr
        replay, info = dpro("replay", run), dpro("info", run)
        assert replay.returncode == 0 and info.returncode == 0, replay.stderr + info.stderr
        window = json.loads(dpro("replay", run, "--json").stdout)["window"]
        said = ["warning: the profiling window's steps ran" in out for out in (replay.stdout, info.stdout)]
        assert said == [window["disturbed"]] * 2, (replay.stdout, info.stdout)
        if window["disturbed"] == slow:
            break
        flagged.append({"slowdown_pct": round(window["slowdown_pct"], 1), "stolen_cpu": steal_shares(open_run(run))})
        warnings.warn(f"an undisturbed job's profiling window was flagged, recorded again: {flagged[-1]}")
    assert window["disturbed"] == slow, (f"flagged in every recording: {flagged}" if flagged else
                                         f"a window 40 ms a step slower not flagged: {window}")
    if slow:
        assert window["slowdown_pct"] > 50


def test_each_case_is_the_change_between_its_configurations():
    from dpro.analysis.whatif import Change

    from benchmarks.fidelity import _bytes_ratio, cases, change_of, job_configs
    from benchmarks.testbed.spec import JobSpec, Layer

    grid, beyond = job_configs(5, 0)
    base, small, slow, fast, small_fast = grid
    rate = base.rate_mbit
    assert change_of(small_fast, base) == Change(bucket_cap_mb=25.0, bandwidth_scale=0.5)
    assert change_of(slow, beyond[1]) == Change(bandwidth_scale=rate / (rate // 2), compress="fp16")
    assert change_of(base, beyond[4]) == Change(world_size=4, ranks_per_host=1)
    assert change_of(base, beyond[3]) == Change(accumulate=2)
    assert change_of(small, beyond[0]) == Change(bucket_cap_mb=25.0, first_bucket_mb=0.1)
    with pytest.raises(ValueError):
        change_of(beyond[1], base)  # a source never has a hook
    all_cases = cases(grid, beyond)
    assert len(all_cases) == 5 * 4 + 5 * 5 and all(c.source in grid for c in all_cases)
    assert {c.family for c in all_cases} >= {"buckets", "bandwidth", "buckets+bandwidth", "fp16", "powersgd",
                                            "accumulation", "first bucket", "2 -> 4 hosts"}
    spec = JobSpec(0, (Layer(64 * 64, 1.0, 1.0), Layer(64 * 2, 1.0, 1.0)), 2.0)
    psgd = Config("p", spec, 100, comm_hook="powersgd:2")
    # the 64x64 matrix sends 2 x (64 + 64); the 2x64 one is not worth compressing and goes whole
    assert _bytes_ratio(psgd) == pytest.approx((256 + 128) / (4096 + 128))


def test_a_stalled_profiled_step_is_left_out_of_the_typical_step(tmp_path):
    run = tmp_path / "run"
    # five profiled steps, one stalled: the window's median stays a plain step's even when the
    # machine's load slows another (with three, one such step made two of three look stalled)
    result = dpro("record", "-o", run, "--skip", "4", "--warmup", "1", "--steps", "5", "--no-calibrate", "--",
                  *TORCHRUN, "--nproc-per-node=2", JOBS / "disturbed_window.py", "--steps", "18", "--slow", "6", "6")
    assert result.returncode == 0, result.stderr
    from dpro.analysis import RunAnalysis

    analysis = RunAnalysis.open(run)
    assert analysis.stalled_steps == [6]
    assert analysis.graph.steps == [5, 7, 8, 9]
    replay = json.loads(dpro("replay", run, "--json").stdout)
    assert abs(replay["error_pct"]) < 25, replay["error_pct"]  # the stalled step's 40 ms would be +95% alone


def test_the_sends_diagnostic_compares_sends_of_a_like_size():
    from benchmarks.parallel_sends import _median_sends

    coll = np.array(["all_gather"] * 4 + ["all_reduce"] * 3)
    nbytes = np.array([100.0, 110.0, 120.0, 1000.0, 10.0, 400.0, 410.0])
    ns = np.array([1.0, 2.0, 3.0, 50.0, 9.0, 7.0, 8.0])
    found = _median_sends(coll, nbytes, ns, np.full(7, 4))
    # the 1000-byte gather is more than twice the median (115): left out of the time
    assert found["all_gather"] == {"bytes": 115.0, "ns": 2.0, "sends": 3, "group": 4}
    # around another run's size: only the sends near it count, and a collective with none is left out
    around = _median_sends(coll, nbytes, ns, np.full(7, 4), {"all_gather": 900.0, "all_reduce": 10_000.0})
    assert around == {"all_gather": {"bytes": 900.0, "ns": 50.0, "sends": 1, "group": 4}}


def test_the_sends_diagnostic_reads_the_medians_from_the_benchmarks_json(tmp_path):
    from benchmarks.parallel_sends import _measured

    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps({"rows": [], "result": {"measured": {"s1j0-fsdp": [1.0, 2.0, 3.0]}}}))
    bad.write_text(json.dumps({"rows": []}))
    assert _measured(good) == {"s1j0-fsdp": [1.0, 2.0, 3.0]}
    with pytest.raises(SystemExit, match="not the --json output of python -m benchmarks.parallel"):
        _measured(bad)
