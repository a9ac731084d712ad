"""``dpro health``'s wall time: the default check on 4 namespace hosts (one rank each, gloo,
torchrun --no-python), from launch to the last host's exit, over several runs; median and range.

Baseline: the same torchrun launch of a program that only imports torch.distributed and exits,
the floor any check launched this way pays. Goal: the default check within 60 s.

    python -m benchmarks health [--quick]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from dpro.testing.netns import NetnsCluster, can_build_namespaces, torchrun_across_hosts

GOAL_S = 60.0
HOSTS = 4


def run(quick: bool = False) -> list[dict]:
    reason = can_build_namespaces()
    if reason:
        print(f"health benchmark skipped: {reason}", file=sys.stderr)
        return []
    repeats = 2 if quick else 5
    dpro = Path(sys.executable).parent / "dpro"
    checks, floors = [], []
    with tempfile.TemporaryDirectory() as folder, NetnsCluster(HOSTS, prefix="dhb") as cluster:
        for i in range(repeats):
            start = time.monotonic()
            runs = torchrun_across_hosts(cluster, [dpro, "health", "-o", f"{folder}/run{i}",
                                                   "--db", f"sqlite:///{folder}/health.db"], no_python=True)
            checks.append(time.monotonic() - start)
            if any(r.returncode not in (0, 1) for r in runs):  # 1: degraded is a verdict, not a failure
                raise RuntimeError(f"dpro health failed: {runs[0].stderr[-2000:]}")
            start = time.monotonic()
            torchrun_across_hosts(cluster, [sys.executable, "-c", "import torch.distributed"], no_python=True)
            floors.append(time.monotonic() - start)
    check, floor = statistics.median(checks), statistics.median(floors)
    print(f"health: default check on {HOSTS} hosts {check:.1f} s (range {min(checks):.1f}-{max(checks):.1f}, "
          f"{repeats} runs); launch floor {floor:.1f} s (range {min(floors):.1f}-{max(floors):.1f})", file=sys.stderr)
    return [{"benchmark": "health", "case": f"{HOSTS} namespace hosts, default check", "metric": "wall time s",
             "dpro": check, "baseline": floor, "ratio": check / floor, "goal": f"<= {GOAL_S:.0f} s",
             "met": check <= GOAL_S}]
