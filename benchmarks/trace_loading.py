"""Trace loading: :func:`dpro.graph.kineto.load_trace` against HolisticTraceAnalysis (HTA), the
usual way to load Kineto traces into pandas, on the real GPU traces in ``tests/data/gpu``.

    python benchmarks/trace_loading.py [--quick]     # or: python -m benchmarks --only trace_loading

Both sides load the same trace in the same run, alternately, each load in a fresh Python
process: dpro with ``load_trace(path, cache=False)`` (so the JSON is parsed, not the cache read),
HTA with ``TraceAnalysis(trace_dir=...)`` on a temporary folder holding a symlink to that one
trace. In the child, the clock starts after the imports, and the peak memory is the peak
resident size during the load minus the resident size right after the imports (Linux's VmHWM,
reset there through ``/proc/self/clear_refs``), so neither side is charged for importing
pandas. Each figure is the best of several runs. Linux only. Two rows per trace: trace events per second (ratio
dpro/HTA, goal ≥ 10×) and peak memory in MiB (ratio dpro/HTA, goal ≤ 0.33×).

HTA runs in its own virtual environment, ``benchmarks/.hta-venv`` (git-ignored), made on first
use with ``pip install HolisticTraceAnalysis psutil`` (HTA 0.5.0 imports psutil without
declaring it) and with pandas and numpy pinned to the versions dpro runs with, so that both sides
use the same pandas; HTA 0.5.0 works with pandas 3. Should HTA fail to import with them, the venv
falls back to ``pandas<3``. The separate venv keeps HTA's many dependencies (jupyterlab and more)
out of dpro's environment.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "gpu"  # real traces from public projects; see tests/data/NOTICE
HTA_VENV = Path(__file__).resolve().parent / ".hta-venv"

# Run in the child: the imports, then one load. The peak is the kernel's high-water mark of
# resident memory (VmHWM), reset right after the imports; getrusage's ru_maxrss is not used
# because Linux carries the parent's resident size into it across fork and exec.
CHILD = """
import json, sys, time
{imports}
def memory_mib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current resident size
base = memory_mib("VmRSS:")
start = time.perf_counter()
{load}
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "peak_mib": memory_mib("VmHWM:") - base}}))
"""
DPRO = {"imports": "from dpro.graph.kineto import load_trace",
        "load": "load_trace(sys.argv[1], cache=False)"}
HTA = {"imports": "import logging\nfrom hta.trace_analysis import TraceAnalysis",
       "load": "logging.disable(logging.INFO)\nTraceAnalysis(trace_dir=sys.argv[1])"}


def run(quick: bool = False) -> list[dict]:
    """Rows of the benchmark table: two per GPU trace (all of them, or the 3 largest if quick)."""
    traces = sorted(TRACES.glob("*.json.gz"), key=lambda p: p.stat().st_size, reverse=True)
    if not traces:
        print(f"trace loading: no traces in {TRACES}, skipped", file=sys.stderr)
        return []
    hta_python = _hta_python()
    rows = []
    for trace in traces[:3] if quick else traces:
        dpro, hta = _measure(trace, hta_python, repeats=3 if quick else 5)
        events = _count_events(trace)
        speed = (events / dpro["seconds"], events / hta["seconds"])
        memory = (dpro["peak_mib"], hta["peak_mib"])
        rows.append(_row(trace.name, "events/s", *speed, "≥ 10×", lambda ratio: ratio >= 10))
        rows.append(_row(trace.name, "peak memory MiB", *memory, "≤ 0.33×", lambda ratio: ratio <= 0.33))
    return rows


def _row(case: str, metric: str, dpro: float, baseline: float, goal: str, met) -> dict:
    ratio = dpro / baseline
    return {"benchmark": "trace loading", "case": case, "metric": metric, "dpro": dpro,
            "baseline": baseline, "ratio": ratio, "goal": goal, "met": bool(met(ratio))}


def _measure(trace: Path, hta_python: Path, repeats: int) -> tuple[dict, dict]:
    """Best time and best peak memory of each side over ``repeats`` alternating runs."""
    dpro, hta = [], []
    with tempfile.TemporaryDirectory(prefix="dpro-bench-hta-") as folder:
        (Path(folder) / trace.name).symlink_to(trace)
        for _ in range(repeats):
            dpro.append(_child(Path(sys.executable), DPRO, trace))
            hta.append(_child(hta_python, HTA, Path(folder)))
    return _best(dpro), _best(hta)


def _best(runs: list[dict]) -> dict:
    return {key: min(run[key] for run in runs) for key in ("seconds", "peak_mib")}


def _child(python: Path, side: dict, argument: Path) -> dict:
    result = subprocess.run([str(python), "-c", CHILD.format(**side), str(argument)],
                            capture_output=True, text=True, cwd=tempfile.gettempdir())
    if result.returncode != 0:
        raise RuntimeError(f"{python} failed on {argument}:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


class _Events(msgspec.Struct):
    traceEvents: list[msgspec.Raw]


def _count_events(trace: Path) -> int:
    return len(msgspec.json.decode(gzip.decompress(trace.read_bytes()), type=_Events).traceEvents)


def _hta_python() -> Path:
    """The python of benchmarks/.hta-venv, made on first use."""
    python = HTA_VENV / "bin" / "python"
    if not _imports_hta(python):
        print(f"trace loading: installing HolisticTraceAnalysis in {HTA_VENV} (once) ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(HTA_VENV)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "HolisticTraceAnalysis", "psutil"]
        subprocess.run([*pip, f"pandas=={pd.__version__}", f"numpy=={np.__version__}"], check=True)
        if not _imports_hta(python):
            subprocess.run([*pip, "pandas<3"], check=True)
        if not _imports_hta(python):
            raise RuntimeError(f"HolisticTraceAnalysis does not import in {HTA_VENV}")
    return python


def _imports_hta(python: Path) -> bool:
    return python.exists() and subprocess.run([str(python), "-c", "import hta.trace_analysis"],
                                              capture_output=True).returncode == 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    from benchmarks.__main__ import format_table

    print(format_table(run(quick="--quick" in sys.argv[1:])))
