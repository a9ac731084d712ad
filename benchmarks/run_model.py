"""The run model at scale, on runs synthesized from a real GPU trace (:mod:`benchmarks.synthetic_runs`).

- **Stored analysis.** A 64-rank run: ``dpro replay RUN`` and ``dpro critical-path RUN`` the
  first time (traces decoded, graph built and replayed, all stored in ``RUN/derived/``) against
  the next time (read back). Each a separate process, as a user runs them; medians of 3.
- **Fan-out.** A 256-rank run analysed from scratch (every trace decoded, reduced, the graph
  built; nothing read from or written to a cache) in one process, with the process pool (one
  worker per core) and on a 2-worker Dask ``LocalCluster``: wall time and the peak memory of the
  coordinating process, each in a fresh process. Baseline for the memory: every rank's trace
  tables held in one process at once, as ``dpro diagnose`` did before the run model.

    python -m benchmarks --only run_model [--quick]       # --quick: 16 and 64 ranks, one repetition
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.synthetic_runs import make_run

STORED_RANKS, FANOUT_RANKS = 64, 256
QUICK_STORED_RANKS, QUICK_FANOUT_RANKS = 16, 64
REPEATS = 3


def _timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _stored(run: Path, repeats: int) -> list[dict]:
    rows = []
    for command in ("replay", "critical-path"):
        first, cached = [], []
        for _ in range(repeats):
            shutil.rmtree(run / "derived", ignore_errors=True)
            first.append(_timed([sys.executable, "-m", "dpro", command, str(run)]))
            cached.append(_timed([sys.executable, "-m", "dpro", command, str(run)]))
        f, c = statistics.median(first), statistics.median(cached)
        rows.append({"benchmark": "run_model", "case": f"{_ranks(run)} ranks: dpro {command}, stored analysis vs first",
                     "metric": f"s (median of {repeats}; first {min(first):.1f}-{max(first):.1f}, "
                               f"stored {min(cached):.2f}-{max(cached):.2f})",
                     "dpro": c, "baseline": f, "ratio": f / c, "goal": ">= 5x", "met": f / c >= 5})
    return rows


def _mode(run: Path, mode: str) -> dict:
    """Analyse ``run`` in a fresh process in ``mode``: its wall time and peak memory."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.run_model", "--measure", mode, str(run)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.splitlines()[-1])


def _fanout(run: Path) -> list[dict]:
    serial, pool, dask, stage, all_tables = (_mode(run, m) for m in ("serial", "pool", "dask", "per-rank stage",
                                                                      "all-tables"))
    n = _ranks(run)
    rows = [{"benchmark": "run_model", "case": f"{n} ranks: coordinator peak memory after the per-rank stage (pool)",
             "metric": f"MiB (baseline: {n} ranks' trace tables in one process)", "dpro": stage["peak_mib"],
             "baseline": all_tables["peak_mib"], "ratio": stage["peak_mib"] / all_tables["peak_mib"],
             "goal": "below the baseline", "met": stage["peak_mib"] < all_tables["peak_mib"]}]
    for name, m in (("process pool (2 workers)", pool), ("Dask LocalCluster (2 workers)", dask)):
        rows.append({"benchmark": "run_model", "case": f"{n} ranks: analysis time, {name} vs one process",
                     "metric": f"s ({m['nodes']} graph nodes)", "dpro": m["seconds"], "baseline": serial["seconds"],
                     "ratio": serial["seconds"] / m["seconds"], "goal": "faster than one process",
                     "met": m["seconds"] < serial["seconds"]})
    for name, m in (("one process", serial), ("process pool", pool), ("Dask", dask)):
        rows.append({"benchmark": "run_model", "case": f"{n} ranks: coordinator peak memory, {name}",
                     "metric": f"MiB (baseline: {n} ranks' trace tables in one process)", "dpro": m["peak_mib"],
                     "baseline": all_tables["peak_mib"], "ratio": m["peak_mib"] / all_tables["peak_mib"],
                     "goal": "below the baseline", "met": m["peak_mib"] < all_tables["peak_mib"]})
    return rows


def _ranks(run: Path) -> int:
    return len(list((run / "ranks").iterdir()))


def run(quick: bool = False) -> list[dict]:
    """Every row (see the module docstring)."""
    stored_n, fanout_n = (QUICK_STORED_RANKS, QUICK_FANOUT_RANKS) if quick else (STORED_RANKS, FANOUT_RANKS)
    with tempfile.TemporaryDirectory(prefix="dpro-bench-") as tmp:
        rows = _stored(make_run(Path(tmp) / f"run{stored_n}", stored_n), 1 if quick else REPEATS)
        rows += _fanout(make_run(Path(tmp) / f"run{fanout_n}", fanout_n))
    return rows


def _measure(mode: str, run: Path) -> dict:
    """Analyse ``run`` here in ``mode`` (``serial``, ``pool``, ``dask``; ``per-rank stage``: the
    pool's reductions only, no graph; ``all-tables``: load every trace's tables and keep them,
    the baseline)."""
    start = time.perf_counter()
    nodes = 0
    if mode == "all-tables":
        from dpro.graph.kineto import load_trace

        tables = {r: load_trace(run / "ranks" / str(r) / "trace.json.gz", rank=r, cache=False) for r in range(_ranks(run))}
        assert len(tables) == _ranks(run)
    elif mode == "per-rank stage":
        from dpro.analysis import RunAnalysis

        assert len(RunAnalysis.open(run, cache=False).reductions()) == _ranks(run)
    else:
        from dpro.analysis import RunAnalysis

        options = {"serial": {"workers": 1}, "pool": {}, "dask": {}}[mode]
        if mode == "dask":
            from distributed import LocalCluster

            with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
                nodes = len(RunAnalysis.open(run, cache=False, scheduler=cluster.scheduler_address).graph.nodes)
        else:
            nodes = len(RunAnalysis.open(run, cache=False, **options).graph.nodes)
    return {"seconds": time.perf_counter() - start, "nodes": nodes,
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="measure one mode of the fan-out (used by run())")
    parser.add_argument("--measure", choices=("serial", "pool", "dask", "per-rank stage", "all-tables"), required=True)
    parser.add_argument("run", type=Path)
    args = parser.parse_args()
    print(json.dumps(_measure(args.measure, args.run)))
