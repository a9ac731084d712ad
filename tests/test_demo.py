"""``dpro demo``: the command the README's first line runs (recorded from the installed wheel in
``tests/test_package.py``), quiet, on one screen, every command it suggests runnable as printed;
and the job's stderr sorted by ``dpro record`` (torch's messages about profiling to the node's log)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dpro.run_format import JOB_STDERR_FILE, open_run

from .conftest import assert_one_line_error, dpro

SUMMARY_LINES = 40  # the bound on the summary screen


def test_demo_refuses_a_window_longer_than_the_job(tmp_path: Path) -> None:
    assert_one_line_error(dpro("demo", "-o", tmp_path / "d", "--train-steps", "5"), "does not fit")
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
def test_the_demo_is_quiet_and_every_command_it_suggests_runs_as_printed(tmp_path: Path) -> None:
    """``make demo``'s command with ``--open`` (which it suggests), stopped with Ctrl+C once its
    dashboard answers; then each command it printed, from the same folder."""
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data")}  # the health history here
    env.pop("OMP_NUM_THREADS", None)  # as on a newcomer's shell
    demo = subprocess.Popen([sys.executable, "-m", "dpro", "demo", "-o", "run", "--open"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _answers(demo, timeout=600)
    finally:
        demo.send_signal(signal.SIGINT)
        stdout, stderr = demo.communicate(timeout=60)
    said = stdout + stderr
    for noise in ("FutureWarning", "DeprecationWarning", "USDT", "CPUAllocator", "OMP_NUM_THREADS", "Traceback"):
        assert noise not in said, said
    assert re.search(r"step +\d+ +loss", stdout), stdout  # the job's own output still shows
    summary = stdout[stdout.index("Recorded 2 ranks"):stdout.index("Dash is running")].splitlines()
    assert len(summary) <= SUMMARY_LINES, summary
    for surface in ("step", "replay", "path", "what if", "optimize"):
        assert any(line.startswith(f"  {surface} ") for line in summary), (surface, summary)
    assert "\n\n\n" not in stderr, stderr  # no line ends left over from torch's messages
    log = next(open_run(tmp_path / "run").root.glob(f"nodes/*/{JOB_STDERR_FILE}"))
    assert "USDT" in log.read_text()  # kept, where the node's facts say (dpro info shows them)

    commands = [shlex.split(m) for m in re.findall(r"^ *\$ (dpro .*)$", stdout, re.M)]
    assert [c[1] for c in commands] == ["info", "replay", "critical-path", "whatif", "optimize", "dashboard", "health"]
    for command in commands:
        argv = [sys.executable, "-m", "dpro", *command[1:]]
        if command[1] == "dashboard":
            server = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True)
            try:
                _answers(server, timeout=120)
            finally:
                server.terminate()
                server.wait(timeout=30)
            continue
        ran = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        healthy_or_not = (0, 1) if command[1] == "health" else (0,)  # its exit code is its verdict
        assert ran.returncode in healthy_or_not and "Traceback" not in ran.stderr, (command, ran.stderr[-2000:])


def _answers(process: subprocess.Popen, timeout: float) -> None:
    """Wait until a dashboard answers at the address the demo printed (``process`` still running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        try:
            with urllib.request.urlopen("http://127.0.0.1:8050/", timeout=5) as page:
                assert page.status == 200
                return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"no dashboard answered at http://127.0.0.1:8050/ within {timeout:.0f} s")


CHATTER = ("USDT:2026-11-27 04:10:35 10237:10237 SyncActivityProfilerHandler.cpp:52] profiler_start",
           "[rank1]:[W1127 04:10:36.669411830 CPUAllocator.cpp:245] Memory block of unknown size was allocated "
           "before the profiling started, profiler results will not include the deallocation event")
JOB = f"""
import sys, time
w = sys.stderr.write
w({CHATTER[0]!r} + "\\n"); w("job: starting\\n\\n"); w({CHATTER[1]!r} + "\\n")
w("USDT: a line of the job's own that only looks like one\\n")
w({CHATTER[0]!r}); w({CHATTER[0]!r}); w("\\n"); w("\\n")  # two ranks' markers, then their line ends
w("progress 50%\\r"); sys.stderr.flush(); time.sleep(1.5)  # a partial line is passed on before its line ends
w("progress 100%\\n"); sys.exit(3)
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_record_keeps_torchs_profiling_messages_off_the_terminal(tmp_path: Path, verbose: bool) -> None:
    run = tmp_path / "run"
    job = subprocess.Popen([sys.executable, "-m", "dpro", "record", "-o", run, "--no-calibrate",
                            *(["-v"] if verbose else []), "--", sys.executable, "-c", JOB], stderr=subprocess.PIPE)
    early = b""  # read as bytes: the progress bar's "\r" as written
    while b"progress 50%\r" not in early:
        chunk = os.read(job.stderr.fileno(), 4096)
        assert chunk, early
        early += chunk
    assert b"100%" not in early and job.poll() is None  # the partial line arrived while the job still ran
    rest = job.communicate(timeout=120)[1]
    assert job.returncode == 3  # the job's exit code
    shown = (early + rest).decode()
    for line in ("job: starting\n\n", "USDT: a line of the job's own that only looks like one\n",
                 "progress 50%\rprogress 100%\n"):
        assert line in shown, shown
    log = next(run.glob(f"nodes/*/{JOB_STDERR_FILE}"), None)
    if verbose:
        assert all(c in shown for c in CHATTER) and log is None
    else:
        assert not any(c in shown for c in CHATTER) and shown.count("\n\n") == 1, shown  # the job's blank line
        assert log.read_text() == f"{CHATTER[0]}\n{CHATTER[1]}\n{CHATTER[0]}{CHATTER[0]}\n"
        assert "3 line(s) of torch's messages" in dpro("info", run).stdout


def test_a_job_run_on_a_terminal_writes_its_stderr_to_a_terminal(tmp_path: Path) -> None:
    """dpro's stderr a terminal (a pseudo-terminal here): the job's is one too, and sorted the same."""
    import pty

    ours, theirs = pty.openpty()
    job = f"import sys; w = sys.stderr.write; w('tty %s\\n' % sys.stderr.isatty()); w({CHATTER[0]!r} + '\\n')"
    record = subprocess.Popen([sys.executable, "-m", "dpro", "record", "-o", tmp_path / "run", "--no-calibrate", "--",
                               sys.executable, "-c", job], stderr=theirs, stdout=subprocess.DEVNULL)
    os.close(theirs)
    shown = b""
    while True:
        try:
            chunk = os.read(ours, 4096)
        except OSError:  # every writer closed
            break
        if not chunk:
            break
        shown += chunk
    os.close(ours)
    assert record.wait(timeout=60) == 0
    assert b"tty True" in shown and b"USDT" not in shown, shown
    assert "USDT" in next((tmp_path / "run").glob(f"nodes/*/{JOB_STDERR_FILE}")).read_text()
