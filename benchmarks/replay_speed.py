"""Replay speed: simulated ops per second of the full replay, and the wall time to build and
replay a synthetic 1,024-rank data-parallel job, with and without the symmetric fold.

The graphs are :mod:`dpro.replayer.synthetic` jobs of a 100M-parameter model (24 layers, 25 MiB
buckets). Numba compiles the replay's kernels once per install and caches them; that cost is
measured on its own, in new processes with an empty and then a warm cache, and kept out of
the other rows (the kernels are loaded before they are timed). A simulated op is one node of
one of the replay's 4 unrolled steps.

    python -m benchmarks --only replay_speed [--quick]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

from dpro.replayer.simulate import replay
from dpro.replayer.synthetic import DataParallelJob, data_parallel_graph

COPIES = 4
PARAMS = 100_000_000
# In a new process: a tiny job built and replayed twice; the first time compiles (or loads)
# the kernels, the second does not.
FIRST_USE = """
import time
from dpro.replayer.simulate import replay
from dpro.replayer.synthetic import DataParallelJob, data_parallel_graph
took = []
for _ in range(2):
    start = time.perf_counter()
    replay(data_parallel_graph(DataParallelJob(ranks=2, params=1_000_000, layers=2)))
    took.append(time.perf_counter() - start)
print(took[0] - took[1])
"""


def _row(case: str, metric: str, value: float, baseline: float, goal: str, met: bool) -> dict:
    return {"benchmark": "replay speed", "case": case, "metric": metric, "dpro": value, "baseline": baseline,
            "ratio": value / baseline, "goal": goal, "met": met}


def _first_use_seconds(cache_dir: str) -> float:
    """Seconds the kernels take to be ready in a new process with numba's cache in ``cache_dir``."""
    done = subprocess.run([sys.executable, "-c", FIRST_USE], capture_output=True, text=True, check=True,
                          env={**os.environ, "NUMBA_CACHE_DIR": cache_dir})
    return float(done.stdout)


def _median_seconds(work, repeats: int) -> float:
    took = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        took.append(time.perf_counter() - start)
    return statistics.median(took)


def run(quick: bool = False) -> list[dict]:
    repeats = 2 if quick else 5
    with tempfile.TemporaryDirectory(prefix="dpro-numba-cache-") as cache:
        cold, warm = _first_use_seconds(cache), _first_use_seconds(cache)
    rows = [_row("numba compiles the kernels (new process, empty cache)", "seconds, once per install", cold, 10.0,
                 "<= 10 s", cold <= 10),
            _row("numba loads the cached kernels (new process)", "seconds, once per process", warm, 1.0,
                 "<= 1 s", warm <= 1)]
    replay(data_parallel_graph(DataParallelJob(ranks=2, params=1_000_000, layers=2)))  # load the kernels
    graph = data_parallel_graph(DataParallelJob(ranks=64, params=PARAMS))
    ops = COPIES * len(graph.nodes)
    seconds = _median_seconds(lambda: replay(graph, copies=COPIES, symmetric=False), repeats)
    rows.append(_row(f"full replay (symmetric=False), 64 ranks x 100M params, {len(graph.nodes):,} nodes",
                     "simulated ops/s", ops / seconds, 1e6, ">= 1M ops/s", ops / seconds >= 1e6))
    job = DataParallelJob(ranks=1024, params=PARAMS)
    for symmetric in (True, False):
        seconds = _median_seconds(lambda: replay(data_parallel_graph(job), copies=COPIES, symmetric=symmetric),
                                  repeats)
        label = "folded onto one rank" if symmetric else "symmetric=False, every rank replayed"
        rows.append(_row(f"build + replay, 1,024 ranks x 100M params, {label}", "seconds", seconds, 10.0,
                         "<= 10 s", seconds <= 10))
    return rows
