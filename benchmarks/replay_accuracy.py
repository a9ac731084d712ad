"""Replay accuracy: measured against predicted step time on real recorded runs and on the
shared GPU traces, with and without clock alignment.

Recorded cases: the example job in three shapes (GPT, MLP, CNN) × two DDP bucket sizes, 2 ranks
with gloo, and the GPT on 2 hosts (network namespaces, root only) with one host's link throttled
by ``tc tbf``, all recorded with ``dpro record`` in this run; measured is the mean step time over the
profiled steps, predicted is the replay of the graph built from them (per-op medians). Every
case is also replayed with ``align=False``. The shared GPU traces are single ranks recorded
elsewhere. (Replay speed is benchmarks/replay_speed.py.)

    python -m benchmarks --only replay_accuracy [--quick]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from dpro.graph.dataflow import build_graph, clock_offsets, load_run_traces
from dpro.graph.kineto import load_trace
from dpro.replayer.simulate import replay
from dpro.run_format import Run, open_run

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_lm.py"
TRACES = ROOT.parent / "shared" / "traces" / "gpu"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
ARCHS = {"gpt": ["--arch", "gpt"], "mlp": ["--arch", "mlp"], "cnn": ["--arch", "cnn"]}
BUCKETS_MB = (1, 25)


def _record(run_dir: Path, job_args: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "dpro", "record", "-o", str(run_dir), "--skip", "5",
                    "--warmup", "1", "--steps", "5", "--", *TORCHRUN, str(EXAMPLE), "--steps", "14", *job_args],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _errors(traces: dict, offsets: dict | None) -> tuple[float, float, float]:
    """Job step time measured and predicted (mean over ranks), and the error %."""
    graph = build_graph(traces, offsets, align=offsets is not None)
    result = replay(graph)
    measured = float(np.mean(list(graph.step_ns.values())))
    predicted = float(np.mean(list(result.step_ns.values())))
    return measured, predicted, 100 * (predicted / measured - 1)


def _throttled_run(run_dir: Path) -> Run | None:
    """A 2-host run (network namespaces) with one host's link throttled; None where namespaces
    cannot be built (not root), said on stderr."""
    from dpro.testing.netns import NetnsCluster, can_build_namespaces, record_across_hosts

    reason = can_build_namespaces()
    if reason is not None:
        print(f"replay accuracy: no throttled-link case: {reason}", file=sys.stderr)
        return None
    with NetnsCluster(2, rates={1: "100mbit"}) as cluster:
        done = record_across_hosts(cluster, run_dir, [str(EXAMPLE), "--steps", "14"],
                                   record_args=("--skip", "5", "--warmup", "1", "--steps", "5"))
    if any(p.returncode != 0 for p in done):
        raise RuntimeError(f"the throttled run failed: {[p.returncode for p in done]}")
    return open_run(run_dir)


def cases(quick: bool) -> list[tuple[str, dict, dict | None]]:
    """(name, traces, clock offsets) for every case; recorded runs are made here."""
    out = []
    tmp = Path(tempfile.mkdtemp(prefix="dpro-replay-bench-"))
    archs = ["gpt"] if quick else list(ARCHS)
    for arch in archs:
        for bucket in BUCKETS_MB:
            run_dir = tmp / f"{arch}-{bucket}mb"
            _record(run_dir, [*ARCHS[arch], "--bucket-cap-mb", str(bucket)])
            run = open_run(run_dir)
            out.append((f"{arch}, buckets {bucket} MB, 2 ranks", load_run_traces(run), clock_offsets(run)))
    throttled = _throttled_run(tmp / "gpt-throttled")
    if throttled is not None:
        out.append(("gpt, 2 hosts, host 1's link at 100mbit (tc tbf)", load_run_traces(throttled),
                    clock_offsets(throttled)))
    for path in sorted(TRACES.glob("*.json.gz")) if TRACES.is_dir() else []:
        tables = load_trace(path)
        if len(tables.steps):
            out.append((path.name, {tables.meta["rank"]: tables}, {tables.meta["rank"]: 0}))
    return out


def run(quick: bool = False) -> list[dict]:
    rows, errors, aligned, unaligned = [], [], [], []
    for name, traces, offsets in cases(quick):
        measured, predicted, error = _errors(traces, offsets)
        errors.append(abs(error))
        if len(traces) > 1:
            aligned.append(abs(error))
            unaligned.append(abs(_errors(traces, None)[2]))
        rows.append({"benchmark": "replay accuracy", "case": name, "metric": "step ms, |error| %",
                     "dpro": predicted / 1e6, "baseline": measured / 1e6, "ratio": predicted / measured,
                     "goal": "|error| <= 5%", "met": abs(error) <= 5})
    rows.append({"benchmark": "replay accuracy", "case": f"all {len(errors)} cases", "metric": "mean |error| %",
                 "dpro": float(np.mean(errors)), "baseline": 3.0, "ratio": float(np.mean(errors)) / 3.0,
                 "goal": "mean <= 3%", "met": float(np.mean(errors)) <= 3})
    for label, values in (("with", aligned), ("without", unaligned)):
        if values:
            rows.append({"benchmark": "replay accuracy", "case": f"{len(values)} recorded runs {label} clock alignment",
                         "metric": "mean |error| %", "dpro": float(np.mean(values)), "baseline": 3.0,
                         "ratio": float(np.mean(values)) / 3.0, "goal": "mean <= 3%", "met": float(np.mean(values)) <= 3})
    return rows


