"""Replay accuracy: measured against predicted step time on real recorded runs and on the
real GPU traces in tests/data, with and without clock alignment.

Recorded cases: the example job in three shapes (GPT, MLP, CNN) × two DDP bucket sizes, 2 ranks
with gloo, and the GPT on 2 hosts (network namespaces, root only) with one host's link throttled
by ``tc tbf``, all recorded with ``dpro record`` in this run; measured is the mean step time over the
profiled steps, predicted is the replay of the graph built from them (per-op means). Every
multi-rank case is also replayed with ``align=False``. The GPU traces are single ranks
recorded elsewhere. Clock alignment: a host clock offset emulated on one recorded run (see
``_clock_rows``). What-if check: bucket fusion predicted from the 1 MB-bucket runs against the
measured 25 MB-bucket runs. (Replay speed is benchmarks/replay_speed.py.)

    python -m benchmarks --only replay_accuracy [--quick]
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpro.analysis import RunAnalysis
from dpro.graph.dataflow import DataflowGraph, graph_from_traces
from dpro.graph.kineto import TraceTables, load_trace
from dpro.replayer.simulate import replay
from dpro.replayer.graph_edits import WhatIf
from dpro.run_format import Run, open_run

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_lm.py"
TRACES = ROOT / "tests" / "data" / "gpu"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
ARCHS = {"gpt": ["--arch", "gpt"], "mlp": ["--arch", "mlp"], "cnn": ["--arch", "cnn"]}
BUCKETS_MB = (1, 25)
CLOCK_SHIFT_NS = 2_000_000  # how far a second host's clock may be off (NTP on a busy network)


def _record(run_dir: Path, job_args: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "dpro", "record", "-o", str(run_dir), "--skip", "5",
                    "--warmup", "1", "--steps", "8", "--", *TORCHRUN, str(EXAMPLE), "--steps", "18", *job_args],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _throttled_run(run_dir: Path) -> Run | None:
    """A 2-host run (network namespaces) with one host's link throttled; None where namespaces
    cannot be built (not root), said on stderr."""
    from tools.testing.netns import NetnsCluster, can_build_namespaces, record_across_hosts

    reason = can_build_namespaces()
    if reason is not None:
        print(f"replay accuracy: no throttled-link case: {reason}", file=sys.stderr)
        return None
    with NetnsCluster(2, rates={1: "100mbit"}) as cluster:
        done = record_across_hosts(cluster, run_dir, [str(EXAMPLE), "--steps", "18"],
                                   record_args=("--skip", "5", "--warmup", "1", "--steps", "8"))
    if any(p.returncode != 0 for p in done):
        raise RuntimeError(f"the throttled run failed: {[p.returncode for p in done]}")
    return open_run(run_dir)


@dataclass
class Case:
    name: str
    traces: dict[int, TraceTables]
    offsets: dict[int, int]
    run: RunAnalysis | None = None


def _recorded(name: str, run: Run) -> Case:
    analysis = RunAnalysis(run)
    return Case(name, {r: analysis.tables(r) for r in analysis.ranks}, analysis.recorded_offsets, analysis)


def cases(quick: bool, tmp: Path) -> list[Case]:
    """Every case; recorded runs are made here, in ``tmp``."""
    out = []
    archs = ["gpt"] if quick else list(ARCHS)
    for arch in archs:
        for bucket in BUCKETS_MB:
            run_dir = tmp / f"{arch}-{bucket}mb"
            _record(run_dir, [*ARCHS[arch], "--bucket-cap-mb", str(bucket)])
            out.append(_recorded(f"{arch}, buckets {bucket} MB, 2 ranks", open_run(run_dir)))
    throttled = _throttled_run(tmp / "gpt-throttled")
    if throttled is not None:
        out.append(_recorded("gpt, 2 hosts, host 1's link at 100mbit (tc tbf)", throttled))
    for path in sorted(TRACES.glob("*.json.gz")):
        tables = load_trace(path, cache=False)
        if len(tables.steps):
            out.append(Case(path.name, {tables.meta["rank"]: tables}, {tables.meta["rank"]: 0}))
    return out


def _graph(case: Case, align: bool = True, traces: dict | None = None, offsets: dict | None = None) -> DataflowGraph:
    run = case.run
    return graph_from_traces(traces or case.traces, offsets=offsets or case.offsets, align=align,
                             bucket_bytes=run.bucket_bytes() if run else None, hosts=run.hosts if run else None)


def _job_ms(step_ns: dict[int, float]) -> float:
    return float(np.mean(list(step_ns.values()))) / 1e6


def _shifted(tables: TraceTables, shift_ns: int) -> TraceTables:
    """A rank's trace as a host whose clock is ``shift_ns`` ahead would have recorded it."""
    events = tables.events.assign(start_ns=tables.events["start_ns"] + shift_ns)
    steps = tables.steps.assign(start_ns=tables.steps["start_ns"] + shift_ns, end_ns=tables.steps["end_ns"] + shift_ns)
    return dataclasses.replace(tables, events=events, steps=steps)


def _wait_error_ms(truth: DataflowGraph, other: DataflowGraph) -> float:
    """Mean absolute difference of the ranks' waits for the slowest rank, over the collectives."""
    a = np.concatenate([np.asarray(w) for w in truth.collectives["wait_ns"]])
    b = np.concatenate([np.asarray(w) for w in other.collectives["wait_ns"]])
    return float(np.mean(np.abs(a - b))) / 1e6


def _clock_rows(case: Case) -> list[dict]:
    """Namespaces share one kernel clock, so a second host's clock offset is emulated: rank 1's
    timestamps shifted by ``CLOCK_SHIFT_NS`` (as a host that far ahead records them), and the
    offset ``dpro record`` would have measured with them. With alignment the graph must
    attribute each collective's time to waiting and transfer as with the true clocks."""
    truth = _graph(case)
    traces = {**case.traces, 1: _shifted(case.traces[1], CLOCK_SHIFT_NS)}
    offsets = {**case.offsets, 1: case.offsets[1] + CLOCK_SHIFT_NS}
    error = {"recorded offsets": _wait_error_ms(truth, _graph(case, True, traces, offsets)),
             "offsets lost, bounded by the collectives": _wait_error_ms(truth, _graph(case, True, traces, dict.fromkeys(offsets, 0))),
             "no alignment": _wait_error_ms(truth, _graph(case, False, traces, offsets))}
    goals = {"recorded offsets": ("< 0.1 ms", error["recorded offsets"] < 0.1),
             "offsets lost, bounded by the collectives": ("< no alignment", error["offsets lost, bounded by the collectives"] < error["no alignment"]),
             "no alignment": ("> with offsets", error["no alignment"] > error["recorded offsets"])}
    return [{"benchmark": "clock alignment", "case": f"{case.name}, rank 1's clock {CLOCK_SHIFT_NS / 1e6:g} ms ahead: {label}",
             "metric": "wait-for-slowest error ms", "dpro": value, "baseline": CLOCK_SHIFT_NS / 1e6,
             "ratio": value / (CLOCK_SHIFT_NS / 1e6), "goal": goals[label][0], "met": goals[label][1]}
            for label, value in error.items()]


def _fusion_rows(by_name: dict[str, Case]) -> list[dict]:
    """What-if check: from each 1 MB-bucket run, predict the 25 MB-bucket layout by fusing its
    all-reduces as DDP grouped the parameters in the 25 MB run; compare with that run."""
    rows = []
    for arch in ARCHS:
        small, large = by_name.get(f"{arch}, buckets 1 MB, 2 ranks"), by_name.get(f"{arch}, buckets 25 MB, 2 ranks")
        if small is None or large is None:
            continue
        groups = _fusion_groups(small.run, large.run)
        graph = _graph(small)
        predicted = _job_ms(WhatIf(graph).fuse_buckets(groups).replay().step_ns)
        measured = _job_ms(_graph(large).step_ns)
        rows.append({"benchmark": "what-if: bucket fusion", "case": f"{arch}: 1 MB-bucket run fused to the 25 MB layout "
                     f"({len(groups)} all-reduce{'s' * (len(groups) != 1)}) vs the 25 MB run", "metric": "step ms, |error| %", "dpro": predicted,
                     "baseline": measured, "ratio": predicted / measured, "goal": "|error| <= 5%",
                     "met": abs(predicted / measured - 1) <= 0.05})
    return rows


def _fusion_groups(small: RunAnalysis, large: RunAnalysis) -> list[list[int]]:
    """The small run's buckets (by order of reduction) grouped as the large run's buckets hold
    their parameters."""
    home = {p.name: b.index for b in large.ddp_layout.buckets for p in b.params}
    groups: dict[int, list[int]] = {}
    for k, bucket in enumerate(small.ddp_layout.buckets):
        groups.setdefault(home[bucket.params[-1].name], []).append(k)
    return [g for _, g in sorted(groups.items())]


def run(quick: bool = False) -> list[dict]:
    tmp = Path(tempfile.mkdtemp(prefix="dpro-replay-bench-"))
    rows, errors, aligned, unaligned = [], [], [], []
    all_cases = cases(quick, tmp)
    for case in all_cases:
        graph = _graph(case)
        measured, predicted = _job_ms(graph.step_ns), _job_ms(replay(graph).step_ns)
        error = 100 * (predicted / measured - 1)
        errors.append(abs(error))
        rows.append({"benchmark": "replay accuracy", "case": case.name, "metric": "step ms, |error| %",
                     "dpro": predicted, "baseline": measured, "ratio": predicted / measured,
                     "goal": "|error| <= 5%", "met": abs(error) <= 5})
        if len(case.traces) > 1:
            plain = _job_ms(replay(_graph(case, align=False)).step_ns)
            aligned.append(abs(error))
            unaligned.append(abs(100 * (plain / measured - 1)))
            rows.append({"benchmark": "replay accuracy, no alignment", "case": case.name, "metric": "step ms, |error| %",
                         "dpro": plain, "baseline": measured, "ratio": plain / measured,
                         "goal": "|error| <= 5%", "met": abs(plain / measured - 1) <= 0.05})
    rows.append({"benchmark": "replay accuracy", "case": f"all {len(errors)} cases", "metric": "mean |error| %",
                 "dpro": float(np.mean(errors)), "baseline": 3.0, "ratio": float(np.mean(errors)) / 3.0,
                 "goal": "mean <= 3%", "met": float(np.mean(errors)) <= 3})
    rows.append({"benchmark": "replay accuracy", "case": f"all {len(errors)} cases", "metric": "max |error| %",
                 "dpro": float(np.max(errors)), "baseline": 5.0, "ratio": float(np.max(errors)) / 5.0,
                 "goal": "max <= 5%", "met": float(np.max(errors)) <= 5})
    for label, values in (("with", aligned), ("without", unaligned)):
        if values:
            rows.append({"benchmark": "replay accuracy", "case": f"{len(values)} recorded runs {label} clock alignment",
                         "metric": "mean |error| %", "dpro": float(np.mean(values)), "baseline": 3.0,
                         "ratio": float(np.mean(values)) / 3.0, "goal": "mean <= 3%", "met": float(np.mean(values)) <= 3})
    recorded = [c for c in all_cases if c.run is not None]
    if recorded:
        rows += _clock_rows(recorded[0])
    rows += _fusion_rows({c.name: c for c in recorded})
    shutil.rmtree(tmp, ignore_errors=True)
    return rows
