"""Faults while recording, injected into real jobs: a full disk before and during the window, a
read-only run folder, a node killed mid-run, a rank killed in the window, SIGTERM during the
shapes step, the run folder removed while recording. For each: the exit code ``dpro record``
leaves with (the job's), what was kept, what ``dpro info`` and ``dpro replay`` say, and never a
traceback. The small disks are real tmpfs mounts (root)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from dpro.run_format import open_run

from .conftest import JOBS, ROOT, TORCHRUN, assert_one_line_error, dpro

pytestmark = [pytest.mark.privileged, pytest.mark.slow]
PACED = JOBS / "paced.py"
WINDOW = ["--skip", "4", "--warmup", "1", "--steps", "2"]  # profiled steps 5-6, the shapes step 8


@contextlib.contextmanager
def small_disk(where: Path, size: str, *options: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (read-only with ``ro``), unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small disk needs root")
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", where], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", where], check=False)


def record(run: Path, *job: str, options: tuple[str, ...] = ("--no-calibrate",)) -> subprocess.Popen:
    """``dpro record`` of the paced 2-rank job, started."""
    command = [sys.executable, "-m", "dpro", "record", "-o", run, *WINDOW, *options, "--",
               *TORCHRUN, "--nproc-per-node=2", PACED, *job]
    return subprocess.Popen(list(map(str, command)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_step(run: Path, rank: int, step: int, process: subprocess.Popen, timeout: float = 120) -> None:
    """Until ``rank`` has timed ``step`` (its row in steps.csv)."""
    deadline = time.monotonic() + timeout
    path = run / "ranks" / str(rank) / "steps.csv"
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        try:
            if len(pd.read_csv(path)) > step:
                return
        except (OSError, ValueError, pd.errors.EmptyDataError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} did not reach step {step} in {timeout} s")


DPRO_CODE = re.compile(r'File "%s/(%s)/' % (re.escape(str(ROOT)), "|".join(
    ("dpro", "collectors", "graph", "replayer", "optimizer", "anomaly", "dashboard"))))


def finished(process: subprocess.Popen, timeout: float = 180) -> tuple[int, str, str]:
    """The recording's exit code and output, with no traceback through dpro's code (torchrun
    prints its own when a worker fails or it is stopped: the job's output)."""
    out, err = process.communicate(timeout=timeout)
    assert not DPRO_CODE.search(err), err
    return process.returncode, out, err


def said(*args: object) -> tuple[int, str]:
    """An analysis command's exit code and all it printed (never a traceback)."""
    done = dpro(*args)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout + done.stderr


def test_a_disk_full_before_the_window_skips_the_window_and_strict_record_fails(tmp_path: Path) -> None:
    """The calibration counts a step's events: the window would not fit, so it is skipped; under
    --strict-record that loss is exit code 1 (the job itself exited 0)."""
    with small_disk(tmp_path / "disk", "160k") as disk:
        run = disk / "run"
        code, _, err = finished(record(run, "--steps", "14", "--step-s", "0.05", options=("--strict-record",)))
        assert code == 1 and "Error: " in err and "--strict-record; the job's exit code was 0" in err, err
        assert "not saved: ranks/0/trace.json.gz" in err and "disk full" in err and "window was skipped" in err
        node, = open_run(run).node_records
        assert node.exit_code == 0 and any(x.file == "ranks/0/trace.json.gz" for x in node.lost)
        code, text = said("info", run)
        assert code == 0 and "rank 0's trace was not saved: disk full" in text, text
        code, text = said("replay", run)
        assert code == 1 and "not saved: disk full" in text and "window was not reached" not in text, text
        code, text = said("diagnose", run)
        assert code == 0 and "not saved: disk full" in text, text
        from dashboard.runs import RunView
        from dpro.analysis import RunAnalysis

        assert "not saved: disk full" in RunView(RunAnalysis.open(run, cache=False)).prepare().no_replay
        assert not list(run.glob("ranks/*/.*trace*"))  # nothing half-written


def test_a_disk_filled_during_the_window_loses_the_trace_not_the_job(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "4m") as disk:
        run = disk / "run"
        job = record(run, "--steps", "14", "--step-s", "0.3")
        wait_for_step(run, 0, 5, job)  # inside the window: fill the disk
        with contextlib.suppress(OSError), open(disk / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 65536)
        code, _, err = finished(job)
        assert code == 0, err
        assert "not saved: ranks/" in err and "disk full" in err, err
        (disk / "filler").unlink()
        code, text = said("info", run)
        assert code == 0 and "not saved" in text and "disk full" in text, text
        assert "window was not reached" not in text
        code, text = said("replay", run)
        assert code in (0, 1) and ("disk full" in text), text


def test_a_read_only_run_folder_runs_the_job_unrecorded_unless_strict(tmp_path: Path) -> None:
    with small_disk(tmp_path / "ro", "1m", "ro") as folder:
        job = [sys.executable, str(JOBS / "exit_with.py"), "3"]
        done = dpro("record", "-o", folder / "run", "--no-calibrate", "--", *job)
        assert done.returncode == 3, done.stderr  # the job ran, and its exit code is dpro's
        assert "read-only file system; the job runs unrecorded" in done.stderr and "Traceback" not in done.stderr
        assert_one_line_error(dpro("record", "-o", folder / "run", "--strict-record", "--", *job),
                              "read-only file system", "not started")


def test_a_removed_run_folder_is_said_and_the_job_ends_as_it_would(tmp_path: Path) -> None:
    run = tmp_path / "run"
    job = record(run, "--steps", "14", "--step-s", "0.1")
    wait_for_step(run, 0, 2, job)
    shutil.rmtree(run)
    code, _, err = finished(job)
    assert code == 0, err
    assert "its folder was removed" in err, err
    assert not run.exists()  # not made again by dpro
    done = dpro("record", "-o", tmp_path / "run2", "--strict-record", "--no-calibrate", *WINDOW, "--",
                *TORCHRUN, "--nproc-per-node=2", PACED, "--steps", "14", "--step-s", "0.05")
    assert done.returncode == 0, done.stderr  # all saved: --strict-record passes the job's exit code


def test_a_rank_killed_in_the_window_is_said_and_the_other_analysed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    job = record(run, "--steps", "14", "--step-s", "0.3")
    wait_for_step(run, 1, 5, job)  # rank 1 is in its profiled steps
    os.kill(json.loads((run / "ranks" / "1" / "meta.json").read_text())["pid"], signal.SIGKILL)
    code, _, err = finished(job)
    assert code == 1, err  # torchrun's exit code for a failed worker
    code, text = said("info", run)
    assert code == 0 and "rank 1 stopped at step" in text and "inside the profiling window" in text, text
    code, text = said("replay", run)
    assert code in (0, 1) and "Traceback" not in text


def test_sigterm_in_the_shapes_step_keeps_the_trace(tmp_path: Path) -> None:
    run = tmp_path / "run"
    job = record(run, "--steps", "14", "--step-s", "0.3")
    wait_for_step(run, 0, 7, job)  # step 8, the shapes step, is running
    job.send_signal(signal.SIGTERM)
    code, _, err = finished(job)
    opened = open_run(run)
    node, = opened.node_records  # dpro leaves as the job (torchrun) left: its exit code, or its signal
    assert code != 0 and (code == node.exit_code or (code == -signal.SIGTERM and node.signal == "SIGTERM")), err
    assert all(opened.trace_path(r) for r in opened.ranks)
    assert not any((opened.rank_dir(r) / "trace-shapes.json.gz").exists() for r in opened.ranks)
    code, text = said("replay", run)
    assert code == 0, text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_node_killed_mid_run_is_lost_with_its_last_step(tmp_path: Path) -> None:
    """Two nodes of one job on this machine (two dpro record --join, two torchrun agents meeting
    at a c10d rendezvous); node 1, its recorder and its job, killed with SIGKILL."""
    run, port = tmp_path / "run", _free_port()
    nodes = []
    for node_rank in (0, 1):
        command = [sys.executable, "-m", "dpro", "record", "--join", "-o", run, "--no-calibrate", *WINDOW, "--",
                   sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node_rank}",
                   "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                   "--rdzv-id=faults", PACED, "--steps", "40", "--step-s", "0.2"]
        nodes.append(subprocess.Popen(list(map(str, command)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
        time.sleep(1)  # node 0's agent hosts the rendezvous: it outlives node 1
    try:
        wait_for_step(run, 1, 3, nodes[1])
        _kill_tree(nodes[1].pid)  # the node's recorder, its torchrun and its ranks (in sessions of their own)
        nodes[1].communicate(timeout=30)
        code, _, err = finished(nodes[0])
    finally:
        for node in nodes:
            _kill_tree(node.pid)
    assert code != 0, err  # the job failed on node 0 too
    opened = open_run(run)
    lost = [n for n in opened.node_records if not n.ended]
    assert len(lost) == 1 and "--node_rank=1" in lost[0].command
    assert "--node_rank=<per node>" in opened.job_command
    code, text = said("info", run)
    assert code == 0 and "None" not in text, text
    assert f"node {lost[0].name}: lost (no end record) after step" in text, text


def _kill_tree(root: int) -> None:
    """SIGKILL ``root`` and every process under it (a node lost at once)."""
    from dpro.collectors.connections import descendants

    for pid in [root, *descendants(root)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_on_a_full_disk_the_nodes_end_fits_the_room_its_start_kept(tmp_path: Path) -> None:
    """node.json is written at the start with room to spare; at the end, on a full disk, it is
    rewritten within that room (its losses cut to fit and counted), never left torn."""
    from dpro.collectors.record import _reserved, _save_node_facts

    with small_disk(tmp_path / "disk", "64k") as disk:
        path = disk / "node.json"
        facts = {"host": "h", "command": ["torchrun", "train.py"], "started_ns": 1}
        path.write_text(_reserved(facts))
        with contextlib.suppress(OSError), open(disk / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
        lost = [{"file": f"ranks/{i}/trace.json.gz", "why": "disk full", "detail": "x" * 200, "rank": i, "step": 9}
                for i in range(200)]
        more: list = []
        _save_node_facts(path, {**facts, "ended_ns": 2, "exit_code": 0, "lost": lost}, disk, more)
        saved = json.loads(path.read_text())
        assert saved["ended_ns"] == 2 and saved["lost_more"] > 0 and len(saved["lost"]) + saved["lost_more"] == 200
        assert more == []
