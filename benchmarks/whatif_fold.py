"""Identical-rank folding of what-if predictions (``dpro optimize --fold-ranks``): the seconds a
prediction takes with every rank replayed and folded onto the median rank, and how far the
folded prediction is from the other.

Two kinds of runs:

- **identical ranks**: :mod:`benchmarks.synthetic_runs` runs of 8 and 64 ranks, every rank a
  copy of one real A100 trace; folding is exact there, so the predictions must agree (goal:
  within 0.1%);
- **a recorded CPU job**: the example's GPT, 4 ranks of gloo on loopback, whose ranks differ
  as recorded ranks do (skew, stragglers); what folding costs in accuracy there is printed
  (no goal).

Each prediction is made :data:`REPEATS` times each way, alternating; medians and ranges. The
changes: links half and twice as fast, and operator fusion (for the CPU job also a 1 MB bucket
cap and fp16 compression).

    python -m benchmarks whatif_fold [--quick]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dpro.analysis.run import RunAnalysis
from dpro.analysis.whatif import Change, predict
from dpro.cli.options import table

from benchmarks.synthetic_runs import make_run

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_lm.py"
REPEATS = 5
SYNTHETIC_RANKS = (8, 64)
COMMON = (Change(bandwidth_scale=0.5), Change(bandwidth_scale=2.0), Change(fuse_ops=True))
DDP_CHANGES = (Change(bucket_cap_mb=1.0), Change(compress="fp16"))
GOAL_IDENTICAL_PCT = 0.1


def _record(run: Path) -> Path:
    """The example's GPT, 4 ranks on loopback, recorded by dpro."""
    if not (run / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "dpro", "record", "-o", run, "--skip", "5", "--warmup", "1",
                        "--steps", "2", "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node=4", EXAMPLE, "--steps", "16", "--d-model", "64", "--layers", "2",
                        "--seq-len", "32", "--bucket-cap-mb", "0.05"], check=True, capture_output=True, timeout=600)
    return run


def _timed(analysis: RunAnalysis, change: Change, fold: bool) -> tuple[float, dict]:
    start = time.perf_counter()
    found = predict(analysis, change, fold=fold)
    return time.perf_counter() - start, found


def _case(name: str, analysis: RunAnalysis, changes: tuple[Change, ...], repeats: int) -> list[dict]:
    rows = []
    predict(analysis, Change())  # the run's graph and per-rank measurements, read once before timing
    for change in changes:
        seconds: dict[bool, list[float]] = {False: [], True: []}
        found: dict[bool, dict] = {}
        for _ in range(repeats):
            for fold in (False, True):
                took, found[fold] = _timed(analysis, change, fold)
                seconds[fold].append(took)
        label = ", ".join(f"{k}={v}" for k, v in vars(change).items() if v is not None)
        every, folded = found[False]["predicted_step_ms"], found[True]["predicted_step_ms"]
        rows.append({"case": name, "change": label, "every_s": seconds[False], "folded_s": seconds[True],
                     "every_ms": every, "folded_ms": folded, "folded": found[True].get("ranks_folded"),
                     "diff_pct": 100 * (folded / every - 1)})
    return rows


def run(quick: bool = False) -> list[dict]:
    repeats = 2 if quick else REPEATS
    results = []
    with tempfile.TemporaryDirectory(prefix="dpro-bench-fold-") as folder:
        for n in SYNTHETIC_RANKS[:1] if quick else SYNTHETIC_RANKS:
            print(f"whatif_fold: {n} identical ranks", file=sys.stderr, flush=True)
            run_dir = make_run(Path(folder) / f"synthetic-{n}", n)
            results += _case(f"{n} identical ranks (A100 trace copies)", RunAnalysis.open(run_dir), COMMON, repeats)
        print("whatif_fold: recording a 4-rank CPU job", file=sys.stderr, flush=True)
        recorded = _record(Path(folder) / "gpt-4-ranks")
        results += _case("4 recorded ranks (GPT, gloo)", RunAnalysis.open(recorded), COMMON + DDP_CHANGES, repeats)
    print("What-if predictions, every rank replayed and folded onto the median rank "
          f"({repeats} of each, alternating; medians, ranges):")
    print(table([("run", "change", "every rank s", "folded s", "speed-up", "every rank ms", "folded ms", "folded - every",
                  "folded?")] +
                [(r["case"], r["change"], _spread(r["every_s"]), _spread(r["folded_s"]),
                  f"{statistics.median(r['every_s']) / statistics.median(r['folded_s']):.2f}x", f"{r['every_ms']:.2f}",
                  f"{r['folded_ms']:.2f}", f"{r['diff_pct']:+.2f}%", "yes" if r["folded"] else "no") for r in results]))
    rows = []
    for r in results:
        every_s, folded_s = statistics.median(r["every_s"]), statistics.median(r["folded_s"])
        rows.append({"benchmark": "whatif_fold", "case": f"{r['case']}: {r['change']}",
                     "metric": "seconds per prediction folded (baseline: every rank replayed)", "dpro": folded_s,
                     "baseline": every_s, "ratio": folded_s / every_s, "goal": "(measured, no goal)", "met": True})
        identical = "identical" in r["case"]
        rows.append({"benchmark": "whatif_fold", "case": f"{r['case']}: {r['change']}",
                     "metric": "|folded - every rank| % of the predicted step (baseline: 0, every rank replayed)",
                     "dpro": abs(r["diff_pct"]), "baseline": 0.0, "ratio": abs(r["diff_pct"]),
                     "goal": f"<= {GOAL_IDENTICAL_PCT}" if identical else "(measured, no goal)",
                     "met": bool(r["folded"]) and abs(r["diff_pct"]) <= GOAL_IDENTICAL_PCT if identical else True})
    return rows


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"
