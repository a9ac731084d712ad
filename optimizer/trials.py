"""Measured trials: the job run briefly under each candidate strategy, interleaved with the job
as it is, and the measured best recommended (``dpro optimize RUN --trial -- CMD``, ``dpro tune``).

Each trial is ``dpro record --apply`` of the user's own command into a folder of its own
(``--no-calibrate``, the profiling window placed after the steps measured, so no measured step
is profiled): the script and its data are never changed. Once every rank has timed
:data:`WARMUP_STEPS` + ``steps`` steps after its first, the job is stopped (its whole session:
``dpro record``, the launcher, the ranks); its figure is the mean over ranks of each rank's
median over the ``steps`` measured steps. The candidates and the baseline (no strategy) run in
``rounds`` rounds, each in a new random order; a strategy's figure is the median of its rounds.
A trial that exits with an error or does not time its steps within ``timeout_s`` is stopped
and reported, and the others go on; none starts once the budget would be overrun.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpro.errors import DproError
from dpro.run_format import Run

__all__ = ["Trial", "WARMUP_STEPS", "best", "run_trials"]

WARMUP_STEPS = 3  # steps after the first left out (DDP re-buckets, PowerSGD starts at its 2nd step)
POLL_S = 0.25
STOP_GRACE_S = 10.0


@dataclass
class Trial:
    """One strategy's trials: ``measured_ms`` per round that ran; ``failed``: why it stopped."""

    name: str
    settings: dict[str, Any]
    predicted_step_ms: float | None = None
    measured_ms: list[float] = field(default_factory=list)
    failed: str | None = None
    left_out: list[str] = field(default_factory=list)  # settings --apply could not apply in the job

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.measured_ms) if self.measured_ms else None

    def as_dict(self, baseline_ms: float | None) -> dict[str, Any]:
        m = self.median_ms
        return {"name": self.name, "settings": self.settings, "predicted_step_ms": self.predicted_step_ms,
                "measured_ms": self.measured_ms, "median_ms": m, "failed": self.failed, "left_out": self.left_out,
                "measured_speedup": None if m is None or not baseline_ms else baseline_ms / m}


def run_trials(command: list[str], trials: list[Trial], folder: Path, steps: int = 20, rounds: int = 2,
               budget_s: float = 1200.0, timeout_s: float = 300.0, seed: int = 0,
               log: Callable[[str], None] = lambda line: None) -> list[Trial]:
    """Run every trial ``rounds`` times, interleaved (see the module docstring); ``trials[0]``
    is the baseline. Folders go under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    started, slowest = time.monotonic(), 0.0
    rng = random.Random(seed)
    for k in range(rounds):
        order = list(trials)
        rng.shuffle(order)
        for trial in order:
            if trial.failed:
                continue
            if time.monotonic() - started + slowest > budget_s:
                log(f"trials: the {budget_s:g} s budget ran out before round {k + 1} of {trial.name}")
                return trials
            begun = time.monotonic()
            _run_one(command, trial, folder / f"{trial.name}-round{k + 1}", steps, timeout_s)
            slowest = max(slowest, time.monotonic() - begun)
            log(f"trials: round {k + 1} {trial.name}: " + (
                f"failed: {trial.failed}" if trial.failed else f"{trial.measured_ms[-1]:.1f} ms"))
    return trials


def best(trials: list[Trial]) -> Trial | None:
    """The measured fastest trial (the baseline among them), or None if none measured."""
    measured = [t for t in trials if t.median_ms is not None]
    return min(measured, key=lambda t: t.median_ms) if measured else None


def _run_one(command: list[str], trial: Trial, out: Path, steps: int, timeout_s: float) -> None:
    """Record one trial of ``trial`` into ``out`` and add its figure, or say why it failed."""
    needed = WARMUP_STEPS + steps + 1  # step 0 has no start
    apply = []
    if trial.settings:
        strategy = out.parent / f"{out.name}.strategy.json"
        strategy.write_text(json.dumps({"name": trial.name, "settings": trial.settings}))
        apply = ["--apply", str(strategy)]
    argv = [sys.executable, "-m", "dpro", "record", "-o", str(out), "--force", "--no-calibrate",
            "--skip", str(needed), "--warmup", "0", "--steps", "1", *apply, "--", *command]
    log = out.parent / f"{out.name}.log"
    with open(log, "w") as output:
        job = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        run = Run(out, {})
        while job.poll() is None and time.monotonic() < deadline and not _timed(run, needed):
            time.sleep(POLL_S)
        done = _timed(run, needed)
        exited = job.poll()
        _stop(job)
    trial.left_out += [x for r in run.ranks for x in run.rank_meta(r).applied.left_out
                       if x not in trial.left_out]
    if done:
        trial.measured_ms.append(_figure(run, needed))
    elif exited is None:
        trial.failed = f"stopped after {timeout_s:g} s without timing {needed} steps on every rank (see {log})"
    else:
        last = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        trial.failed = f"the job exited with {exited} before {needed} steps: {last[0][:200]}"


def _timed(run: Run, needed: int) -> bool:
    """Whether every rank of the job has timed ``needed`` steps."""
    try:
        ranks = run.ranks
        world = max((run.rank_meta(r).world_size or 0 for r in ranks), default=0)
        return bool(ranks) and len(ranks) >= world and all(len(run.steps(r)) >= needed for r in ranks)
    except (DproError, ValueError):  # a file being written: not yet
        return False


def _figure(run: Run, needed: int) -> float:
    """The mean over ranks of each rank's median step (ms) over the measured steps."""
    medians = []
    for r in run.ranks:
        s = run.steps(r)
        medians.append(float(s[(s["step"] > WARMUP_STEPS) & (s["step"] < needed)]["dur_ns"].median()) / 1e6)
    return statistics.fmean(medians)


def _stop(job: subprocess.Popen) -> None:
    """Stop the trial's whole session: ``dpro record`` forwards SIGTERM to the job; whatever is
    left after :data:`STOP_GRACE_S` is killed."""
    session = job.pid
    if job.poll() is None:
        job.send_signal(signal.SIGTERM)
        try:
            job.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    for pid in _session_members(session):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if job.poll() is None:
        job.wait()


def _session_members(session: int) -> list[int]:
    """The processes still in ``session`` (the trial's ``dpro record`` started it)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session:  # after the name: state, ppid, pgrp, session
            members.append(int(entry.name))
    return members
