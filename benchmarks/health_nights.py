"""Healthy hosts flagged by the history's rules: sessions of four nights of ``dpro health`` on 4
namespace hosts (one rank each, gloo), one history each, the last night with one host's link at
200 Mb/s, as in ``tests/test_health.py``'s namespace test (``degraded_pct`` 50, ``failed_pct`` 75);
every other session beside a busy loop on one of the machine's cores (CI runs the test among
others).

Each session's last night is judged against its three earlier nights twice from the same history:
as ``dpro health history`` judges it (a host's pairwise rates beyond what the unsuspected hosts
lost together, :func:`dpro.anomaly.health.rules.common_changes`) and, the baseline, each host
against its own baseline alone. Goals: no healthy host's pairwise rate flagged in any session,
and the throttled host's flagged in every one. The noise floor beside them: how far the healthy
hosts' rates move between two healthy nights of the same session (the median and largest change
of night 2 against night 1, either way). And the healthy nights (the first three of each session)
whose probes name any suspect, as the check analyses them (a path judged beyond what every pair
of its round lost at once, and probed again to confirm it) and, the baseline, the first sweep's
probes analysed as measured; beside them, the first sweep by round alone.

    python -m benchmarks health_nights [--quick]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from dpro.anomaly.fabric.probes import analyze, read_probes
from dpro.anomaly.health.config import Rules
from dpro.anomaly.health.history import History
from dpro.anomaly.health.model import JOB
from dpro.anomaly.health.trends import trends
from tools.testing.netns import NetnsCluster, can_build_namespaces, torchrun_across_hosts

HOSTS = 4
THROTTLED = 2
NIGHTS = 4
RULES = Rules(degraded_pct=50, failed_pct=75)
CONFIG = (f"collectives: {{sizes_mb: [1, 4]}}\n"
          f"rules: {{degraded_pct: {RULES.degraded_pct:g}, failed_pct: {RULES.failed_pct:g}}}\n")


def run(quick: bool = False) -> list[dict]:
    reason = can_build_namespaces()
    if reason:
        print(f"health_nights benchmark skipped: {reason}", file=sys.stderr)
        return []
    sessions = 4 if quick else 10
    worst: dict[str, list[float]] = {"common change out": [], "own baseline alone": []}
    flagged: dict[str, int] = {case: 0 for case in worst}
    throttled_flagged = 0
    moves: list[float] = []
    named: dict[str, int] = {"as the check judges": 0, "first sweep, by round": 0, "as measured": 0}
    with tempfile.TemporaryDirectory() as tmp:
        for session in range(sessions):
            folder = Path(tmp) / f"session{session}"
            folder.mkdir()
            (folder / "health.yaml").write_text(CONFIG)
            url = f"sqlite:///{folder}/health.db"
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if session % 2 else None
            try:
                throttled = _session(folder, url, session)
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
            with History.open(url, read_only=True) as history:
                newest_first = history.runs()
            judged = {"common change out": _as_the_history_judges(newest_first),
                      "own baseline alone": _as_the_history_judges(newest_first, beyond_common=False)}
            for case, found in judged.items():
                healthy = [v for (host, _), v in found.items() if host not in (throttled, JOB)]
                worst[case].append(max(worse for _, worse in healthy))
                flagged[case] += any(status != "pass" for status, _ in healthy)
            own = [status for (host, _), (status, _) in judged["common change out"].items() if host == throttled]
            throttled_flagged += bool(own) and all(status == "fail" for status in own)
            moves += _healthy_moves(newest_first[1], newest_first[2], throttled)
            for night in range(NIGHTS - 1):
                probes = read_probes(folder / f"night{night}" / "probes.csv")
                first_sweep = probes.take(probes.round < _first_sweep_rounds(folder / f"night{night}"))
                named["as the check judges"] += bool(analyze(probes))
                named["first sweep, by round"] += bool(analyze(first_sweep))
                named["as measured"] += bool(analyze(first_sweep, by_round=False))
            print(f"health_nights: session {session}{' (busy loop beside it)' if session % 2 else ''}: "
                  "healthy hosts' worst pairwise drop "
                  + ", ".join(f"{case} {worst[case][-1]:.1f}%" for case in worst), file=sys.stderr, flush=True)
    floor = statistics.median(moves)
    print(f"health_nights: healthy hosts' rates between two healthy nights: median change {floor:.1f}%, "
          f"largest {max(moves):.1f}% (either way)", file=sys.stderr)
    rows = []
    for case in worst:
        print(f"health_nights: {case}: a healthy host flagged in {flagged[case]} of {sessions} sessions; worst "
              f"drop median {statistics.median(worst[case]):.1f}%, max {max(worst[case]):.1f}%", file=sys.stderr)
    rows.append({"benchmark": "health_nights", "case": f"{HOSTS} namespace hosts, {NIGHTS} nights, {sessions} sessions",
                 "metric": "sessions flagging a healthy host", "dpro": flagged["common change out"],
                 "baseline": flagged["own baseline alone"],
                 "ratio": flagged["common change out"] / max(1, flagged["own baseline alone"]),
                 "goal": "0", "met": flagged["common change out"] == 0})
    rows.append({"benchmark": "health_nights", "case": f"{HOSTS} namespace hosts, {NIGHTS} nights, {sessions} sessions",
                 "metric": "healthy hosts' worst drop % (max)", "dpro": max(worst["common change out"]),
                 "baseline": max(worst["own baseline alone"]),
                 "ratio": max(worst["common change out"]) / max(worst["own baseline alone"]),
                 "goal": f"< {RULES.degraded_pct:g}", "met": max(worst["common change out"]) < RULES.degraded_pct})
    healthy_nights = sessions * (NIGHTS - 1)
    print(f"health_nights: healthy nights naming a suspect: {named['as the check judges']} of {healthy_nights} "
          f"(the first sweep by round, before paths were probed again: {named['first sweep, by round']}; "
          f"as measured: {named['as measured']})", file=sys.stderr)
    rows.append({"benchmark": "health_nights", "case": f"{HOSTS} namespace hosts, {healthy_nights} healthy nights",
                 "metric": "nights naming a suspect (the first sweep by round, before paths were probed again: "
                           f"{named['first sweep, by round']})", "dpro": named["as the check judges"],
                 "baseline": named["as measured"],
                 "ratio": named["as the check judges"] / max(1, named["as measured"]),
                 "goal": "0", "met": named["as the check judges"] == 0})
    rows.append({"benchmark": "health_nights", "case": f"{HOSTS} namespace hosts, one link at 200 Mb/s",
                 "metric": "sessions flagging the throttled host failed", "dpro": throttled_flagged,
                 "baseline": sessions, "ratio": throttled_flagged / sessions, "goal": f"{sessions} of {sessions}",
                 "met": throttled_flagged == sessions})
    return rows


def _session(folder: Path, url: str, session: int) -> str:
    """Four nights of ``dpro health`` on a fresh namespace cluster, the last with one host's link
    throttled; that host's name."""
    dpro = Path(sys.executable).parent / "dpro"
    with NetnsCluster(HOSTS, prefix="dn") as cluster:
        for night in range(NIGHTS):
            if night == NIGHTS - 1:
                cluster.throttle(THROTTLED, "200mbit")
            runs = torchrun_across_hosts(cluster, [dpro, "health", "--db", url, "--config", folder / "health.yaml",
                                                   "-o", folder / f"night{night}"], no_python=True, timeout=300)
            if any(r.returncode not in (0, 1, 2) for r in runs):
                raise RuntimeError(f"session {session} night {night}: dpro health could not run: "
                                   f"{runs[0].stderr[-2000:]}")
        return cluster.hosts[THROTTLED].name


def _first_sweep_rounds(night: Path) -> int:
    """How many rounds the night's first sweep had (its probes' rounds come first)."""
    return json.loads((night / "health.json").read_text())["pairwise"]["first_sweep_rounds"]


def _as_the_history_judges(newest_first: list[dict], beyond_common: bool = True
                           ) -> dict[tuple[str, str], tuple[str, float]]:
    """Each host's pairwise status and drop (%) as ``dpro health history`` judges the newest
    night (``beyond_common=False``: each host against its own baseline alone)."""
    nodes = trends(newest_first, RULES, beyond_common=beyond_common)["nodes"]
    statuses = {"ok": "pass", "regression": "warn", "regression (severe)": "fail"}
    return {(host, key): (statuses[row["status"]], row["worse_pct"]) for host, rows in nodes.items()
            for key, row in rows.items() if key.startswith("pairwise/") and row["baseline"] is not None}


def _healthy_moves(later: dict, earlier: dict, throttled: str) -> list[float]:
    """How far each healthy host's pairwise rates moved (%, either way) from ``earlier`` to ``later``."""
    return [100 * abs(1 - node["metrics"][key] / earlier["nodes"][host]["metrics"][key])
            for host, node in later["nodes"].items() if host not in (throttled, JOB)
            for key in node["comparable"] if key.startswith("pairwise/")]
