"""The cost model's uncertainty per change family, from the fidelity benchmark's held-out scoring
seed: what ``dpro optimize`` states beside each prediction (``optimizer/intervals.json``).

Every case of the scoring seed (:mod:`benchmarks.fidelity`: a configuration predicted from the
recording of another, scored against its measured step) is predicted again from the recordings
and medians that ``python -m benchmarks.fidelity --score --keep DIR`` left in ``DIR/scoring``;
each family's signed errors (predicted / measured - 1) give its interval, the
:data:`QUANTILES` of them. Written only while the model is the frozen one (held out); otherwise
the run says so and writes nothing. ``--check`` predicts the cases again with the code as it is
now and compares them with the file's: a refactor that changes no prediction keeps the
intervals valid, one that does needs a new scoring seed.

    python -m benchmarks.intervals --keep DIR            # write optimizer/intervals.json
    python -m benchmarks.intervals --keep DIR --check    # the current code predicts the same
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from benchmarks.fidelity import JOBS, cases, change_of, evaluate, job_configs
from benchmarks.testbed import frozen

ROOT = Path(__file__).resolve().parents[1]
INTERVALS_FILE = ROOT / "optimizer" / "intervals.json"
QUANTILES = (0.05, 0.95)  # a 90% interval
TOLERANCE_PCT = 1e-6  # --check: predictions equal to this


def scored_cases(root: Path, seed: int) -> list[dict]:
    """Every case of ``seed``'s jobs, predicted from the recordings in ``root``."""
    from dpro.analysis import RunAnalysis

    grid_all, all_cases = [], []
    for index in range(JOBS):
        grid, beyond = job_configs(seed, index)
        grid_all += grid
        all_cases += cases(grid, beyond)
    saved = root / "medians.json"
    missing = [c.name for c in grid_all if not (root / c.name / "run.json").exists()]
    if not saved.exists() or missing:
        raise SystemExit(f"intervals: {root} lacks the scoring seed's medians or recordings ({', '.join(missing[:3])}); "
                         f"run python -m benchmarks.fidelity --score --keep {root.parent}")
    measured = {n: statistics.median(ms) for n, ms in json.loads(saved.read_text()).items()}
    analyses = {c.name: RunAnalysis.open(root / c.name) for c in grid_all}
    return [evaluate(c, analyses, measured) for c in all_cases]


def shared_predictions(root: Path, seed: int) -> dict[tuple[str, str], float]:
    """Every case of ``seed`` predicted as ``dpro optimize`` predicts: one
    :class:`~dpro.analysis.whatif.CostModel` per recording, reused by all of its cases."""
    from dpro.analysis import RunAnalysis
    from dpro.analysis.whatif import CostModel

    models: dict[str, CostModel] = {}
    out = {}
    for index in range(JOBS):
        grid, beyond = job_configs(seed, index)
        for case in cases(grid, beyond):
            name = case.source.name
            if name not in models:
                models[name] = CostModel(RunAnalysis.open(root / name))
            prediction = models[name].predict(change_of(case.source, case.target))
            out[name, case.target.name] = prediction.summary["predicted_step_ms"]
    return out


def intervals(scored: list[dict]) -> dict[str, dict]:
    """Each family's interval of signed errors, in % of the measured step."""
    families: dict[str, list[float]] = {}
    for c in scored:
        families.setdefault(c["family"], []).append(c["error_pct"])
    return {f: {"cases": len(e), "low_pct": float(np.quantile(e, QUANTILES[0])),
                "high_pct": float(np.quantile(e, QUANTILES[1])), "max_abs_pct": float(max(map(abs, e)))}
            for f, e in sorted(families.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.intervals", description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, required=True, help="the folder fidelity --score --keep recorded into")
    parser.add_argument("--check", action="store_true", help="compare the current code's predictions with the file's")
    args = parser.parse_args(argv)
    if args.check:
        stored = json.loads(INTERVALS_FILE.read_text())
        root = args.keep / "scoring"
        before = {(c["source"], c["target"]): c["predicted_ms"] for c in stored["predictions"]}
        alone = {(c["source"], c["target"]): c["predicted_ms"] for c in scored_cases(root, stored["seed"])}
        moved = 0
        for label, now in (("each with its own cost model", alone),
                           ("one cost model per recording", shared_predictions(root, stored["seed"]))):
            changed = [k for k, ms in now.items() if abs(ms / before[k] - 1) * 100 > TOLERANCE_PCT]
            for k in changed:
                print(f"changed ({label}): {k[0]} -> {k[1]}: {before[k]:.3f} -> {now[k]:.3f} ms")
            print(f"{label}: {len(now) - len(changed)} of {len(now)} predictions as when the intervals were "
                  f"measured (model {stored['model']}, seed {stored['seed']})")
            moved += len(changed)
        return 1 if moved else 0
    state = frozen.check()
    if not state.held_out:
        print(f"intervals: not written: {state.why}", file=sys.stderr)
        return 1
    scored = scored_cases(args.keep / "scoring", state.seed)
    data = {"model": frozen.model_version(), "commit": state.commit, "seed": state.seed, "quantiles": list(QUANTILES),
            "made_by": "python -m benchmarks.intervals (the fidelity benchmark's held-out scoring seed)",
            "families": intervals(scored),
            "predictions": [{k: c[k] for k in ("family", "source", "target", "measured_ms", "predicted_ms")}
                            for c in scored]}
    INTERVALS_FILE.write_text(json.dumps(data, indent=1) + "\n")
    for family, i in data["families"].items():
        print(f"{family:18} {i['cases']:3} cases  [{i['low_pct']:+.1f}%, {i['high_pct']:+.1f}%]  max |error| "
              f"{i['max_abs_pct']:.1f}%")
    print(f"wrote {INTERVALS_FILE.relative_to(ROOT)} (model {data['model']}, seed {state.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
