"""``dpro record`` on real torchrun jobs (gloo, 2 ranks on CPU) and real Python processes."""

from __future__ import annotations

import gzip
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpro.collectors.counters import CounterKey, Snapshot
from dpro.run_format import open_run

from .conftest import EXAMPLE, FAKES, JOBS, SMALL_LM, TORCHRUN, assert_one_line_error, dpro


def test_run_directory_is_complete_for_both_ranks(recorded_run: Path) -> None:
    run = open_run(recorded_run)
    assert run.manifest["format_version"] == "1.5"
    assert run.manifest["options"] == {"skip": 3, "warmup": 1, "steps": 2, "calibrate": True, "probe": False}
    assert run.ranks == [0, 1]
    [node] = run.nodes()
    assert node["exit_code"] == 0 and node["signal"] is None
    assert "NVML" in node["collectors"]["gpu"] and "netdev" in node["collectors"]["counters"]
    assert "did not use NCCL" in node["collectors"]["nccl"]
    for rank in (0, 1):
        meta = json.loads((run.rank_dir(rank) / "meta.json").read_text())  # as the job wrote it
        assert (meta["rank"], meta["world_size"], meta["local_rank"]) == (rank, 2, rank)
        assert meta["backend"] == "gloo"
        assert meta["process_groups"][0]["ranks"] == [0, 1]
        assert meta["versions"]["torch"].startswith("2.")
        assert meta["profiler_window"] == {"skip": 3, "warmup": 1, "steps": 2}
        [ddp] = meta["ddp"]
        assert ddp["has_rebuilt_buckets"] and ddp["module"] == "TinyGPT" and len(ddp["buckets"]) >= 3
        names = [p["name"] for b in ddp["buckets"] for p in b["params"]]
        assert "head.weight" in names and "tok.weight" in names and len(names) == len(set(names))
        assert sum(b["numel"] for b in ddp["buckets"]) == sum(p["numel"] for b in ddp["buckets"]
                                                              for p in b["params"])
        clock = json.loads((run.rank_dir(rank) / "clock.json").read_text())
        assert clock["offset_ns"] is not None
        if rank == 1:  # one host: the offset is within the measurement's own error bound
            assert clock["rtt_ns"] > 0 and abs(clock["offset_ns"]) <= clock["uncertainty_ns"] + 1_000_000


def test_trace_covers_exactly_the_profiled_steps(recorded_run: Path) -> None:
    with gzip.open(recorded_run / "ranks" / "1" / "trace.json.gz") as f:
        trace = json.load(f)
    steps = sorted(e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#4", "ProfilerStep#5"]
    assert trace["distributedInfo"]["rank"] == 1
    names = {e.get("name") for e in trace["traceEvents"]}
    assert any("allreduce" in str(n) for n in names), "the DDP all-reduce is in the trace"


def test_every_step_is_timed(recorded_run: Path) -> None:
    run = open_run(recorded_run)
    for rank in (0, 1):
        steps = run.steps(rank)
        assert steps["step"].tolist() == list(range(12))
        assert pd.isna(steps.loc[0, "start_ns"]) and steps["dur_ns"].iloc[1:].gt(0).all()
        assert steps["phase"].tolist() == [""] * 3 + ["warmup"] + ["profiled"] * 2 + [""] + ["shapes"] + [""] * 4
        # what dpro does between two steps (loading its collectors after the first, calibrating,
        # starting or stopping the profiler, writing the trace) belongs to no step; elsewhere one
        # step starts as the previous ends
        gaps = steps["start_ns"].iloc[1:].to_numpy() - steps["end_ns"].iloc[:-1].to_numpy()
        dpro_work = np.isin(steps["step"].iloc[1:].to_numpy(), [1, 3, 4, 5, 6, 7, 8])
        # (a shared machine stalls a process for a few ms now and then: the median, and a bound)
        assert (gaps >= 0).all() and np.median(gaps[~dpro_work]) < 1_000_000, gaps
        assert (gaps[~dpro_work] < 20_000_000).all(), gaps
        calibration = json.loads((run.rank_dir(rank) / "calibration.json").read_text())
        profiler = calibration["profiler"]
        assert gaps[steps["step"].iloc[1:].to_numpy() == 3][0] > profiler["forward"]["span_ns"] + profiler["backward"]["span_ns"]
        assert profiler["backward"]["events"] > 0 and profiler["forward"]["events"] > 0, "both classes of events seen"


def test_info_json_summarizes_the_run(recorded_run: Path) -> None:
    result = dpro("info", recorded_run, "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["ranks"] == [0, 1] and info["hosts"] and info["slowest_rank"] in (0, 1)
    for rank, entry in enumerate(info["per_rank"]):
        assert entry["rank"] == rank and entry["host"] == info["hosts"][0]
        assert entry["steps_timed"] == 11 and entry["events"] > 100
        assert 0 < entry["step_ms"]["median"] <= entry["step_ms"]["p90"]
        assert entry["profiled_steps"] == [4, 5]
    text = dpro("info", recorded_run)
    assert text.returncode == 0 and "median ms" in text.stdout and "slowest rank" in text.stdout


@pytest.mark.parametrize("code", ["0", "3"])
def test_exit_code_of_a_python_job_passes_through(tmp_path: Path, code: str) -> None:
    result = dpro("record", "-o", tmp_path / "run", "--skip", "1", "--warmup", "0", "--steps", "1", "--no-calibrate",
                  "--", sys.executable, JOBS / "exit_with.py", code)
    assert result.returncode == int(code), result.stderr
    run = open_run(tmp_path / "run")
    assert run.nodes()[0]["exit_code"] == int(code) and len(run.steps(0)) == 5


def test_failing_torchrun_job_fails_dpro_record(tmp_path: Path) -> None:
    result = dpro("record", "-o", tmp_path / "run", "--", *TORCHRUN, "--nproc-per-node=2",
                  JOBS / "exit_with.py", "7")
    assert result.returncode != 0
    assert open_run(tmp_path / "run").nodes()[0]["exit_code"] == result.returncode


def test_job_killed_by_a_signal_kills_dpro_with_it(tmp_path: Path) -> None:
    result = dpro("record", "-o", tmp_path / "run", "--", sys.executable, JOBS / "exit_with.py", "SIGKILL")
    assert result.returncode == -signal.SIGKILL
    assert open_run(tmp_path / "run").nodes()[0]["signal"] == "SIGKILL"


def _wait_for_steps(run_dir: Path, ranks: int, steps: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = [run_dir / "ranks" / str(r) / "steps.csv" for r in range(ranks)]
        if all(f.exists() and len(f.read_text().splitlines()) > steps for f in files):
            return
        time.sleep(0.2)
    raise AssertionError(f"the job did not reach {steps} steps on {ranks} ranks in {timeout} s")


def test_sigterm_mid_run_leaves_a_readable_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # The profiling window starts at step 2 and is longer than the job will live: the SIGTERM
    # arrives inside it, and each rank saves the partial trace before dying.
    proc = subprocess.Popen([sys.executable, "-m", "dpro", "record", "-o", str(run_dir), "--skip", "2",
                             "--warmup", "0", "--steps", "100000", "--no-calibrate", "--", *TORCHRUN, "--nproc-per-node=2",
                             str(EXAMPLE), "--steps", "100000", *SMALL_LM],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_steps(run_dir, ranks=2, steps=6)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode != 0
    run = open_run(run_dir)
    assert run.nodes()[0]["ended_ns"] > 0
    for rank in (0, 1):
        steps = run.steps(rank)
        assert len(steps) >= 6 and steps["dur_ns"].iloc[1:].gt(0).all()
        assert run.rank_meta(rank).rank == rank
        assert run.trace_path(rank) is not None, f"rank {rank} saved no partial trace"
    info = dpro("info", run_dir, "--json")
    assert info.returncode == 0, info.stderr
    assert all(r["events"] > 0 for r in json.loads(info.stdout)["per_rank"])


@pytest.mark.parametrize("how, failure", [
    ("profiler", "torch.profiler at step"),
    ("fds", "optimizer step hook"),
    ("hooks", None),
])
def test_script_that_breaks_dpro_hooks_still_finishes(tmp_path: Path, how: str, failure: str | None) -> None:
    result = dpro("record", "-o", tmp_path / "run", "--skip", "3", "--warmup", "0", "--steps", "2",
                  "--", sys.executable, JOBS / "hostile.py", how)
    assert result.returncode == 0, result.stderr
    assert "training finished" in result.stdout
    run = open_run(tmp_path / "run")
    errors = run.rank_dir(0) / "errors.log"
    if failure is None:  # the hooks were removed: dpro saw the first steps, then nothing, silently
        assert not errors.exists() and len(run.steps(0)) == 2
    else:
        assert failure in errors.read_text()
        logged = errors.read_text().count(" pid ")  # one header line per failure
        assert f"rank 0: {logged} failure(s) in dpro's hooks" in result.stderr
        if how == "fds":  # dpro's files were closed (or their numbers reused) at step 1: it
            log = errors.read_text()  # stood down before starting the profiler
            assert ("Bad file descriptor" in log or "closed or replaced dpro's steps.csv" in log)
            assert run.trace_path(0) is None


def test_dpro_step_marks_steps_without_an_optimizer(tmp_path: Path) -> None:
    result = dpro("record", "-o", tmp_path / "run", "--skip", "2", "--warmup", "0", "--steps", "2", "--no-calibrate",
                  "--", sys.executable, JOBS / "manual_steps.py")
    assert result.returncode == 0, result.stderr
    run = open_run(tmp_path / "run")
    assert run.steps(0)["step"].tolist() == list(range(6))
    assert run.trace_path(0) is not None


def test_users_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "marker"
    (site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = dpro("record", "-o", tmp_path / "run", "--", sys.executable, JOBS / "exit_with.py", "0", env=env)
    assert result.returncode == 0, result.stderr
    assert marker.read_text() == "ran" and len(open_run(tmp_path / "run").steps(0)) == 5


def test_secret_environment_values_are_redacted(tmp_path: Path) -> None:
    env = {**os.environ, "HF_TOKEN": "hf_secret_value", "DPRO_TEST_PLAIN": "visible"}
    result = dpro("record", "-o", tmp_path / "run", "--", sys.executable, JOBS / "exit_with.py", "0", env=env)
    assert result.returncode == 0, result.stderr
    meta_text = (tmp_path / "run" / "ranks" / "0" / "meta.json").read_text()
    environment = json.loads(meta_text)["environment"]
    assert environment["HF_TOKEN"] == "<redacted>" and environment["DPRO_TEST_PLAIN"] == "visible"
    assert "hf_secret_value" not in meta_text


def test_nccl_debug_is_left_alone_when_the_user_set_it(tmp_path: Path) -> None:
    env = {**os.environ, "NCCL_DEBUG": "WARN"}
    result = dpro("record", "-o", tmp_path / "run", "--", sys.executable, JOBS / "exit_with.py", "0", env=env)
    assert result.returncode == 0
    assert "set by the user" in open_run(tmp_path / "run").nodes()[0]["collectors"]["nccl"]


def test_nic_counters_are_read_from_a_recorded_sysfs_tree(tmp_path: Path) -> None:
    # No RDMA NIC exists on the test machine: a sysfs tree in the real layout and counter names
    # of an mlx5 port stands in for it (the real /sys is read in every other test).
    root = tmp_path / "sys"
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    for kind, counters in {"counters": {"port_xmit_data": 1000, "port_rcv_data": 2000, "symbol_error": 0},
                           "hw_counters": {"np_cnp_sent": 5, "out_of_sequence": 1}}.items():
        (port / kind).mkdir(parents=True)
        for name, value in counters.items():
            (port / kind / name).write_text(f"{value}\n")
    stats = root / "class" / "net" / "ib0" / "statistics"
    stats.mkdir(parents=True)
    (stats / "rx_bytes").write_text("42\n")
    result = dpro("record", "-o", tmp_path / "run", "--sysfs-root", root, "--",
                  sys.executable, JOBS / "exit_with.py", "0")
    assert result.returncode == 0, result.stderr
    [node_dir] = (tmp_path / "run" / "nodes").iterdir()
    start = Snapshot.from_dict(json.loads((node_dir / "counters-start.json").read_text()))
    assert start.values[CounterKey("rdma", "mlx5_0/1", "port_xmit_data")] == 1000
    assert start.values[CounterKey("rdma_hw", "mlx5_0/1", "np_cnp_sent")] == 5
    assert {k: v for k, v in start.values.items() if k.source == "netdev"} == {CounterKey("netdev", "ib0", "rx_bytes"): 42}
    end = Snapshot.from_dict(json.loads((node_dir / "counters-end.json").read_text()))
    assert end.values.keys() == start.values.keys() and end.time_ns > start.time_ns
    note = json.loads((node_dir / "node.json").read_text())["collectors"]["counters"]
    assert "rdma 1 device(s)" in note and "netdev 1 device(s)" in note


def test_existing_output_is_never_overwritten_without_force(tmp_path: Path) -> None:
    out = tmp_path / "run"
    job = ["--", sys.executable, JOBS / "exit_with.py", "0"]
    assert dpro("record", "-o", out, *job).returncode == 0
    assert_one_line_error(dpro("record", "-o", out, *job), "not empty", "--force")
    first_created = open_run(out).manifest["created_ns"]
    assert dpro("record", "-o", out, "--force", *job).returncode == 0
    assert open_run(out).manifest["created_ns"] > first_created
    other = tmp_path / "not-a-run"
    other.mkdir()
    (other / "notes.txt").write_text("precious")
    assert_one_line_error(dpro("record", "-o", other, "--force", *job), "not a dpro run")
    assert (other / "notes.txt").read_text() == "precious"


def test_nodes_join_one_run_and_merge_local_runs(tmp_path: Path) -> None:
    # Two "nodes" of a job: each records one rank (RANK set as a launcher would).
    def node(out: Path, rank: int, *flags: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2"}
        return dpro("record", "-o", out, *flags, "--", sys.executable, JOBS / "exit_with.py", "0", env=env)

    shared = tmp_path / "shared-run"
    assert node(shared, 0, "--join").returncode == 0
    assert node(shared, 1, "--join").returncode == 0
    run = open_run(shared)
    assert run.ranks == [0, 1] and len(run.nodes()) == 2
    # a pipeline's ranks switch micro-batches for the probe at one step: a node with another window is refused
    assert_one_line_error(node(shared, 2, "--join", "--probe"), "--probe")
    assert node(tmp_path / "p", 0, "--probe", "--steps", "3").returncode == 0
    assert_one_line_error(node(tmp_path / "p", 1, "--join", "--probe", "--steps", "4"), "--steps 3", "same window")
    assert node(tmp_path / "np", 0, "--steps", "3").returncode == 0
    assert node(tmp_path / "np", 1, "--join", "--steps", "4").returncode == 0, "no probe: windows may differ"

    assert node(tmp_path / "a", 0).returncode == 0 and node(tmp_path / "b", 1).returncode == 0
    merged = dpro("merge", tmp_path / "m", tmp_path / "a", tmp_path / "b")
    assert merged.returncode == 0, merged.stderr
    assert open_run(tmp_path / "m").ranks == [0, 1] and len(open_run(tmp_path / "m").nodes()) == 2
    assert_one_line_error(dpro("merge", tmp_path / "m2", tmp_path / "a", tmp_path / "a"), "rank 0 is in both")


def test_gpu_samples_through_nvml(tmp_path: Path) -> None:
    # No GPU exists on the test machine: the driver library libnvidia-ml.so.1 is replaced by a
    # stand-in with the real NVML C signatures (tests/fakes/fake_nvml.c, two GPUs); the real
    # pynvml binding and dpro's sampler run unchanged on top of it.
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is needed to build the stand-in NVML library")
    lib = tmp_path / "nvml" / "libnvidia-ml.so.1"
    lib.parent.mkdir()
    subprocess.run([gcc, "-shared", "-fPIC", "-o", lib, FAKES / "fake_nvml.c"], check=True)
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib.parent), "STEPS": "40"}
    result = dpro("record", "-o", tmp_path / "run", "--gpu-interval", "0.02", "--",
                  sys.executable, JOBS / "exit_with.py", "0", env=env)
    assert result.returncode == 0, result.stderr
    [node_dir] = (tmp_path / "run" / "nodes").iterdir()
    assert json.loads((node_dir / "node.json").read_text())["collectors"]["gpu"] == "sampled 2 GPU(s) every 20 ms"
    samples = pd.read_csv(node_dir / "gpu-samples.csv")
    assert set(samples["gpu"]) == {0, 1} and len(samples) >= 2
    gpu1 = samples[samples["gpu"] == 1].iloc[0]
    assert (gpu1["util_gpu_pct"], gpu1["sm_clock_mhz"], gpu1["power_w"], gpu1["mem_used_mib"]) == (91, 1410, 350.0, 20480)
    assert gpu1["throttle_reasons"] == 0x20 and gpu1["pcie_rx_kib_s"] == 2000 and gpu1["nvlink_tx_kib"] == 5000
    # the samples are read back: the stand-in's GPU 1 is always in a thermal slowdown
    diagnosis = dpro("diagnose", tmp_path / "run", "--json")
    assert diagnosis.returncode == 0, diagnosis.stderr
    gpus = [s for s in json.loads(diagnosis.stdout)["suspects"] if s["kind"] == "gpu"]
    assert [s["name"].rsplit("/", 1)[1] for s in gpus] == ["gpu1"]
    assert gpus[0]["evidence"]["reasons"] == {"software thermal slowdown": 1.0}


def _default_sigint() -> None:
    """SIGINT's default action, whatever this process inherited: a test runner started in the
    background of a shell without job control ignores SIGINT, and so would the job (as it
    would without dpro), which is not what is tested here."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_job_owns_the_terminal(tmp_path: Path) -> None:
    # A real pseudo-terminal (util-linux `script`): the job reads from it, and Ctrl-C typed on it
    # reaches the job, which dies of SIGINT; dpro then ends the same way (status 130).
    script = shutil.which("script")
    if script is None:
        pytest.skip("util-linux `script` is needed for a pseudo-terminal")
    job = f"{sys.executable} -m dpro record -o {tmp_path / 'run'} -- {sys.executable} -c "
    read = subprocess.run([script, "-qec", job + "'print(\"got\", input())'; echo status=$?", "/dev/null"],
                          input="hello\n", capture_output=True, text=True, timeout=60)
    assert "got hello" in read.stdout and "status=0" in read.stdout, read.stdout
    shutil.rmtree(tmp_path / "run")
    interrupted = subprocess.Popen([script, "-qec", job + "'import time; print(\"ready\", flush=True); time.sleep(60)'; "
                                    "echo status=$?", "/dev/null"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                   preexec_fn=_default_sigint)
    # Ctrl-C once the job runs its own code (a fixed wait lost the race on a loaded machine)
    assert select.select([interrupted.stdout], [], [], 60)[0] and "ready" in interrupted.stdout.readline()
    out, _ = interrupted.communicate("\x03", timeout=60)
    assert "KeyboardInterrupt" in out and "status=130" in out, out
    assert open_run(tmp_path / "run").nodes()[0]["signal"] == "SIGINT"


def test_a_node_whose_empty_nccl_folder_another_node_removed_finishes_its_record(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes of one run share its folder: one may remove the empty nccl/ between another's look and its listing."""
    from dpro.collectors.record import _nccl_logs_note

    folder = tmp_path / "nccl"
    folder.mkdir()
    listing = Path.iterdir

    def removed_meanwhile(self: Path):
        if self == folder:
            folder.rmdir()
        return listing(self)

    monkeypatch.setattr(Path, "iterdir", removed_meanwhile)
    assert _nccl_logs_note(folder) == "; no NCCL log written (the job did not use NCCL)"
