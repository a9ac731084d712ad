"""Recording overhead: the example job's step time under ``dpro record`` against the same job
without dpro (outside the profiling window) and against the same job profiled by a bare
torch.profiler with the same settings (inside the window).

The three configurations run interleaved, round after round, in an order rotated every round,
so that drift in the machine's speed hits all three alike; the ratio reported is the median over
rounds of each round's paired ratio (the spread over rounds is printed with it), which is what
keeps this VM's run-to-run noise (a few percent, at times more) out of the result. A third row
measures dpro's own cost per step directly, in one process: the step hook called many times. Every side times a step the same way: the wall time
between two consecutive returns from ``optimizer.step()`` (dpro from its step hook, the others
from the script's ``--step-times``). Steps 0 (set-up), the profiler's warm-up and the step that
writes the trace are left out of every side.

    python -m benchmarks --only recording_overhead [--quick]
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


def _hook_cost_us(tmp: Path, calls: int = 20000) -> float:
    """Microseconds that dpro's step hook costs per step (timing a step, appending it to
    steps.csv), in a process of its own with the hooks installed as the bootstrap installs them."""
    code = f"""
import os, time
os.environ.update(DPRO_RUN_DIR={str(tmp / 'hook-run')!r}, DPRO_SKIP="1000000000", RANK="0")
os.makedirs(os.environ["DPRO_RUN_DIR"])
from dpro.collectors import hooks
hooks.install()
import torch
hooks.user_step()  # attach: rank directory, metadata
start = time.perf_counter()
for _ in range({calls}):
    hooks.user_step()
print((time.perf_counter() - start) / {calls} * 1e6)
"""
    return float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                text=True).stdout.split()[-1])


def _row(metric: str, case: str, ours: float, theirs: float, ratio: float, goal: float) -> dict:
    return {"benchmark": "recording overhead", "case": case, "metric": metric, "dpro": ours,
            "baseline": theirs, "ratio": ratio, "goal": f"<= {goal}x", "met": ratio <= goal}


def run(quick: bool = False) -> list[dict]:
    rounds = 3 if quick else 9
    sides = {"plain": [], "bare": [], "dpro_out": [], "dpro_in": []}
    ratios_out, ratios_in = [], []
    with tempfile.TemporaryDirectory(prefix="dpro-bench-") as d:
        tmp = Path(d)
        for i in range(rounds):
            results = {}
            configs = [("plain", _plain), ("dpro", _dpro), ("bare", _bare_profiler)]
            for name, fn in configs[i % 3:] + configs[:i % 3]:
                results[name] = fn(tmp, str(i))
            (dpro_out, dpro_in), plain, bare = results["dpro"], results["plain"], results["bare"]
            for key, values in (("plain", plain), ("bare", bare), ("dpro_out", dpro_out), ("dpro_in", dpro_in)):
                sides[key] += values
            ratios_out.append(np.median(dpro_out) / np.median(plain))
            ratios_in.append(np.median(dpro_in) / np.median(bare))
        hook_us = _hook_cost_us(tmp)
    median_step_ms = float(np.median(sides["plain"]))
    case = f"example LM, 2 ranks gloo, {rounds} rounds"
    spread = lambda r: f"rounds {min(r):.3f}-{max(r):.3f}x"  # noqa: E731
    return [
        _row(f"median step ms outside the window, vs no dpro ({spread(ratios_out)})", case,
             float(np.median(sides["dpro_out"])), median_step_ms, float(np.median(ratios_out)), 1.01),
        _row(f"median step ms inside the window, vs bare torch.profiler ({spread(ratios_in)})", case,
             float(np.median(sides["dpro_in"])), float(np.median(sides["bare"])), float(np.median(ratios_in)), 1.05),
        _row("step hook cost (us per step) against the median step time", "in-process, 20k steps",
             hook_us, median_step_ms * 1000, 1 + hook_us / (median_step_ms * 1000), 1.01),
    ]


