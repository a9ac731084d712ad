"""Recording overhead: the example job's step time under ``dpro record`` against the same job
without dpro (outside the profiling window) and against the same job profiled by a bare
torch.profiler with the same settings (inside the window).

The three configurations run interleaved, round after round, on the same machine, so that drift
in the machine's speed hits all three alike. Every side times a step the same way: the wall time
between two consecutive returns from ``optimizer.step()`` (dpro from its step hook, the others
from the script's ``--step-times``). Steps 0 (set-up), the profiler's warm-up and the step that
writes the trace are left out of every side.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from dpro.run_format import open_run

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_lm.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
SKIP, WARMUP, PROFILED = 10, 2, 10
STEPS = 70
WINDOW = range(SKIP + WARMUP, SKIP + WARMUP + PROFILED)
OUTSIDE = [s for s in range(1, STEPS) if not SKIP <= s <= SKIP + WARMUP + PROFILED]


def _run(command: list[str]) -> None:
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _durations_from_ends(prefix: Path, steps: list[int] | range) -> list[float]:
    out = []
    for rank in (0, 1):
        ends = np.loadtxt(f"{prefix}.{rank}", dtype=np.int64)
        out += [(ends[s] - ends[s - 1]) / 1e6 for s in steps]
    return out


def _plain(tmp: Path, tag: str) -> list[float]:
    times = tmp / f"plain-{tag}"
    _run([*TORCHRUN, str(EXAMPLE), f"--steps={STEPS}", f"--step-times={times}"])
    return _durations_from_ends(times, OUTSIDE)


def _bare_profiler(tmp: Path, tag: str) -> list[float]:
    times = tmp / f"bare-{tag}"
    _run([*TORCHRUN, str(EXAMPLE), f"--steps={STEPS}", f"--step-times={times}",
          f"--torch-profiler={tmp / f'bare-traces-{tag}'}", f"--profiler-window={SKIP},{WARMUP},{PROFILED}"])
    return _durations_from_ends(times, WINDOW)


def _dpro(tmp: Path, tag: str) -> tuple[list[float], list[float]]:
    run_dir = tmp / f"dpro-{tag}"
    _run([sys.executable, "-m", "dpro", "record", "-o", str(run_dir), f"--skip={SKIP}",
          f"--warmup={WARMUP}", f"--steps={PROFILED}", "--", *TORCHRUN, str(EXAMPLE), f"--steps={STEPS}"])
    run = open_run(run_dir)
    outside, inside = [], []
    for rank in run.ranks:
        steps = run.steps(rank).set_index("step")["dur_ns"] / 1e6
        outside += steps.loc[OUTSIDE].tolist()
        inside += steps.loc[list(WINDOW)].tolist()
    return outside, inside


def run(quick: bool = False) -> list[dict]:
    rounds = 2 if quick else 5
    plain, bare, dpro_out, dpro_in = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="dpro-bench-") as d:
        tmp = Path(d)
        for i in range(rounds):
            plain += _plain(tmp, str(i))
            outside, inside = _dpro(tmp, str(i))
            dpro_out += outside
            dpro_in += inside
            bare += _bare_profiler(tmp, str(i))
    rows = []
    for metric, ours, theirs, baseline_name, goal in (
        ("median step ms outside the window", dpro_out, plain, "no dpro", 1.01),
        ("median step ms inside the window", dpro_in, bare, "bare torch.profiler", 1.05),
    ):
        ratio = float(np.median(ours) / np.median(theirs))
        rows.append({"benchmark": "recording overhead", "case": f"example LM, 2 ranks gloo, vs {baseline_name}",
                     "metric": f"{metric} ({len(ours)} vs {len(theirs)} steps)",
                     "dpro": float(np.median(ours)), "baseline": float(np.median(theirs)),
                     "ratio": ratio, "goal": f"<= {goal}x", "met": ratio <= goal})
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import format_table

    print(format_table(run(quick="--quick" in sys.argv)))
