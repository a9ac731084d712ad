"""``dpro health``'s wall time: the default check on 4 namespace hosts (one rank each, gloo,
torchrun --no-python), from launch to the last host's exit, over several runs; median and range;
healthy, and with one host's link at 40 Mb/s (issue 29: the night a link goes bad must not be
the night the check runs longest).

Baseline: the same torchrun launch of a program that only imports torch.distributed and exits,
the floor any check launched this way pays. Goals: the default check within 60 s either way,
and healthy within 10 s of the floor.

    python -m benchmarks health [--quick]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tools.testing.netns import NetnsCluster, can_build_namespaces, torchrun_across_hosts

GOAL_S = 60.0
HOSTS = 4
THROTTLED = 2


def run(quick: bool = False) -> list[dict]:
    reason = can_build_namespaces()
    if reason:
        print(f"health benchmark skipped: {reason}", file=sys.stderr)
        return []
    repeats = 2 if quick else 5
    dpro = Path(sys.executable).parent / "dpro"
    times: dict[str, list[float]] = {"healthy": [], "one link at 40 Mb/s": [], "floor": []}
    named: list[bool] = []  # per throttled run: its report names the throttled host first
    with tempfile.TemporaryDirectory() as folder, NetnsCluster(HOSTS, prefix="dhb") as cluster:
        for i in range(repeats):  # interleaved: healthy, throttled, the floor
            for case in times:
                if case == "one link at 40 Mb/s":
                    cluster.throttle(THROTTLED, "40mbit")
                start = time.monotonic()
                out = Path(folder) / f"run{i}-{case[:3]}"
                argv = ([sys.executable, "-c", "import torch.distributed"] if case == "floor" else
                        [dpro, "health", "-o", out, "--db", f"sqlite:///{folder}/health-{case[:3]}.db"])
                runs = torchrun_across_hosts(cluster, argv, no_python=True)
                times[case].append(time.monotonic() - start)
                cluster.unthrottle(THROTTLED)
                if any(r.returncode not in (0, 1, 2) for r in runs):  # 1, 2: degraded, failed are verdicts
                    raise RuntimeError(f"{case}: dpro health could not run: {runs[0].stderr[-2000:]}")
                if case == "one link at 40 Mb/s":
                    suspects = json.loads((out / "health.json").read_text()).get("suspects") or []
                    named.append(bool(suspects) and suspects[0]["name"] == cluster.hosts[THROTTLED].name)
    floor = statistics.median(times["floor"])
    rows = []
    for case in ("healthy", "one link at 40 Mb/s"):
        check = statistics.median(times[case])
        print(f"health: default check on {HOSTS} hosts, {case}: {check:.1f} s (range {min(times[case]):.1f}-"
              f"{max(times[case]):.1f}, {repeats} runs); launch floor {floor:.1f} s", file=sys.stderr)
        goal = min(GOAL_S, floor + 10) if case == "healthy" else GOAL_S
        rows.append({"benchmark": "health", "case": f"{HOSTS} namespace hosts, default check, {case}",
                     "metric": "wall time s", "dpro": check, "baseline": floor, "ratio": check / floor,
                     "goal": f"<= {goal:.0f} s" + (" (floor + 10)" if case == "healthy" else ""),
                     "met": check <= goal})
    print(f"health: the throttled host named first in {sum(named)} of {len(named)} throttled runs", file=sys.stderr)
    rows.append({"benchmark": "health", "case": f"{HOSTS} namespace hosts, one link at 40 Mb/s",
                 "metric": "runs naming the throttled host first", "dpro": sum(named), "baseline": len(named),
                 "ratio": sum(named) / len(named), "goal": f"{len(named)} of {len(named)}", "met": all(named)})
    return rows
