"""Held-out fidelity of ``dpro whatif`` on the quiet testbed (:mod:`benchmarks.testbed`).

Emulated-device jobs (their compute holds the thread off the CPU, like a device kernel) are
drawn from a seed and run on 2 or 4 namespace hosts with shaped links. Each job has a grid of
source configurations (DDP bucket caps x link rates) and targets beyond it (a small first
bucket, DDP's fp16 hook, PowerSGD of rank 2, gradient accumulation over 2 micro-batches, 4
hosts). Every case predicts one configuration from the ``dpro record`` recording of another,
and is scored against the target's measured step time: the median over
:data:`~benchmarks.testbed.protocol` 's repeated runs without any profiler (interleaved rounds).
Sources are recorded once, in the first round.

Seeds: the **tuning** seed's jobs were looked at while the model was shaped; the **scoring**
seed comes from ``benchmarks/testbed/frozen.json`` and is held out only while the model's code
is the one frozen there (:mod:`benchmarks.testbed.frozen`); the output says which.

Baselines beside every case: **no change** (the source's measured step) and **scaling** (the
source's step with its exposed communication, the replay's critical-path communication, scaled
by the change's bytes over bandwidth: the link rate ratio, fp16's half, PowerSGD's bytes, the
ring's ``2(n-1)/n``; a bucket or accumulation change leaves it unchanged). First printed: the
noise floor (each configuration's spread over its repeated runs), then the replay of every
source as recorded (not anchored) against its own unprofiled steps.

Goals on the scoring seed: mean |error| <= 3%, max <= 8%, and at most half of each baseline's
error wherever the true change is >= 10%; every replay as recorded within 5%.

    python -m benchmarks fidelity [--quick]          # tuning and scoring seeds
    python -m benchmarks.fidelity --tune             # the tuning seed only
    python -m benchmarks.fidelity --freeze           # freeze the committed model, draw a scoring seed
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.testbed import frozen
from benchmarks.testbed.protocol import Config, Testbed, interleaved, spread_pct
from benchmarks.testbed.spec import COLUMNS, draw_job
from dpro.cli.options import table

TUNING_SEED = 1
REPEATS = 3
GOAL_MEAN, GOAL_MAX, GOAL_REPLAY = 3.0, 8.0, 5.0
RATES_MBIT = (100, 200, 400)
JOBS, QUICK_JOBS = 3, 1  # jobs drawn per seed


@dataclass(frozen=True)
class Case:
    family: str
    source: Config
    target: Config


def job_configs(seed: int, index: int) -> tuple[list[Config], list[Config]]:
    """One job of a seed: its grid of sources and its targets beyond the grid."""
    rng = random.Random(seed * 1000 + index)
    job = draw_job(seed * 1000 + index)
    rate = rng.choice(RATES_MBIT)
    cap = rng.choice((0.5, 1.0, 2.0))
    name = f"s{seed}j{index}"
    base = Config(f"{name}-b25-{rate}", job, rate)
    grid = [base, base.but(f"{name}-b{cap:g}-{rate}", bucket_cap_mb=cap),
            base.but(f"{name}-b25-{rate // 2}", rate_mbit=rate // 2),
            base.but(f"{name}-b25-{rate * 2}", rate_mbit=rate * 2),
            base.but(f"{name}-b{cap:g}-{rate * 2}", bucket_cap_mb=cap, rate_mbit=rate * 2)]
    beyond = [base.but(f"{name}-first0.1-{rate}", first_bucket_mb=0.1),
              base.but(f"{name}-fp16-{rate}", comm_hook="fp16"),
              base.but(f"{name}-powersgd2-{rate}", comm_hook="powersgd:2"),
              base.but(f"{name}-acc2-{rate}", accumulate=2),
              base.but(f"{name}-4hosts-{rate}", hosts=4)]
    return grid, beyond


def cases(grid: list[Config], beyond: list[Config]) -> list[Case]:
    """Every grid configuration predicted from every other, and every target beyond the grid from
    every grid configuration."""
    out = [Case(_family(s, t), s, t) for s in grid for t in grid if s is not t]
    return out + [Case(_family(s, t), s, t) for s in grid for t in beyond]


def _family(source: Config, target: Config) -> str:
    if target.hosts != source.hosts:
        kind = "2 -> 4 hosts"
    elif target.comm_hook:
        kind = target.comm_hook.split(":")[0]
    elif target.accumulate != source.accumulate:
        kind = "accumulation"
    elif target.first_bucket_mb is not None:
        kind = "first bucket"
    else:
        kind = "+".join(k for k, differs in (("buckets", target.bucket_cap_mb != source.bucket_cap_mb),
                                             ("bandwidth", target.rate_mbit != source.rate_mbit)) if differs)
    return kind


def change_of(source: Config, target: Config):
    """The :class:`~dpro.analysis.whatif.Change` that turns ``source`` into ``target``."""
    from dpro.analysis.whatif import Change

    if source.comm_hook or source.first_bucket_mb is not None or source.accumulate != 1:
        raise ValueError(f"{source.name}: a source is a grid configuration (no hook, first bucket or accumulation)")
    return Change(bucket_cap_mb=target.bucket_cap_mb if target.bucket_cap_mb != source.bucket_cap_mb else None,
                  first_bucket_mb=target.first_bucket_mb,
                  bandwidth_scale=target.rate_mbit / source.rate_mbit if target.rate_mbit != source.rate_mbit else None,
                  compress=target.comm_hook,
                  accumulate=target.accumulate if target.accumulate != source.accumulate else None,
                  world_size=target.hosts if target.hosts != source.hosts else None,  # a rank per host
                  ranks_per_host=1 if target.hosts != source.hosts else None)


def _ring(n: int) -> float:
    """The bytes a rank sends in a ring all-reduce over ``n`` ranks, per byte reduced."""
    return 2 * (n - 1) / n


def _bytes_ratio(config: Config) -> float:
    """Bytes sent per byte of gradient under the configuration's hook, from the job's layer shapes
    (not from dpro's model): fp16 half; PowerSGD of rank r sends r(n+m) for an n x m matrix
    where that is at least twice smaller, the matrix itself elsewhere."""
    if not config.comm_hook:
        return 1.0
    if config.comm_hook == "fp16":
        return 0.5
    r = int(config.comm_hook.split(":")[1])
    shapes = [(max(1, layer.params // COLUMNS), COLUMNS) for layer in config.job.layers]
    sent = sum(r * (n + m) if n * m >= 2 * r * (n + m) else n * m for n, m in shapes)
    return sent / sum(n * m for n, m in shapes)


def evaluate(case: Case, analyses: dict, measured: dict[str, float]) -> dict:
    """One case: prediction, both baselines, the true change, each error in % of the measured."""
    from dpro.analysis.whatif import predict
    from dpro.replayer.breakdown import mean_breakdown

    src = analyses[case.source.name]
    change = change_of(case.source, case.target)
    prediction = predict(src, change)
    source_ms, target_ms = measured[case.source.name], measured[case.target.name]
    factor = case.source.rate_mbit / case.target.rate_mbit * _ring(case.target.hosts) / _ring(case.source.hosts)
    factor *= _bytes_ratio(case.target)
    exposed = mean_breakdown(src.graph, src.replay())["communication"]
    scaling = source_ms + exposed * (factor - 1)

    def error(x: float) -> float:
        return 100 * (x / target_ms - 1)

    return {"family": case.family, "source": case.source.name, "target": case.target.name,
            "measured_ms": target_ms, "predicted_ms": prediction["predicted_step_ms"],
            "error_pct": error(prediction["predicted_step_ms"]), "no_change_pct": error(source_ms),
            "scaling_pct": error(scaling), "true_change_pct": 100 * (target_ms / source_ms - 1)}


def replay_as_recorded(name: str, analysis) -> dict:
    """A source's replay, not anchored, against the unprofiled steps of its own recording."""
    from dpro.replayer.replay_report import comparison

    s = comparison(analysis.graph, analysis.replay(), analysis.unprofiled_step_ns, analysis.profiled_step_ns)
    return {"run": name, "measured_ms": s["measured_step_ms"], "profiled_ms": s["profiled_step_ms"],
            "replayed_ms": s["predicted_step_ms"], "error_pct": s["error_pct"]}


def run_seed(testbed: Testbed, seed: int, jobs: int, root: Path, repeats: int = REPEATS) -> dict:
    """Measure, record and score every case of ``jobs`` jobs drawn from ``seed``."""
    from dpro.analysis import RunAnalysis

    grid_all, beyond_all, all_cases = [], [], []
    for index in range(jobs):
        grid, beyond = job_configs(seed, index)
        grid_all += grid
        beyond_all += beyond
        all_cases += cases(grid, beyond)
        testbed.log(f"fidelity: seed {seed} job {index}: {grid[0].job.describe()}; links {grid[0].rate_mbit} mbit")
    configs = grid_all + beyond_all
    saved = root / "medians.json"
    if saved.exists() and all((root / c.name / "run.json").exists() for c in grid_all):
        medians = json.loads(saved.read_text())  # measured and recorded before: scored again
        testbed.log(f"fidelity: seed {seed}: measurements and recordings read from {root}")
    else:
        medians = interleaved(testbed, configs, repeats, seed, record_into=root, sources=[c.name for c in grid_all])
        saved.write_text(json.dumps(medians, indent=1))
    measured = {name: statistics.median(ms) for name, ms in medians.items()}
    analyses = {c.name: RunAnalysis.open(root / c.name) for c in grid_all}
    return {"seed": seed, "noise": {n: spread_pct(ms) for n, ms in medians.items()}, "medians": medians,
            "replays": [replay_as_recorded(n, a) for n, a in analyses.items()],
            "cases": [evaluate(c, analyses, measured) for c in all_cases]}


def _print_seed(result: dict, label: str) -> None:
    noise = result["noise"]
    print(f"\n== {label}: seed {result['seed']} ==")
    print(f"noise floor (spread of each configuration's {REPEATS} runs): median {np.median(list(noise.values())):.1f}%,"
          f" max {max(noise.values()):.1f}% over {len(noise)} configurations")
    print(table([("configuration", "runs ms", "spread %")] + [
        (n, " ".join(f"{x:.1f}" for x in ms), f"{noise[n]:.1f}") for n, ms in result["medians"].items()]))
    print("\nreplay as recorded (not anchored) against the recording's unprofiled steps:")
    print(table([("run", "unprofiled ms", "profiled ms", "replay ms", "error %")] + [
        (r["run"], f"{r['measured_ms']:.1f}", f"{r['profiled_ms']:.1f}", f"{r['replayed_ms']:.1f}",
         f"{r['error_pct']:+.1f}") for r in result["replays"]]))
    print("\ncases (each predicted from the recording of another configuration):")
    print(table([("family", "source", "target", "measured ms", "predicted ms", "error %", "no change %", "scaling %",
                  "true change %")] + [
        (c["family"], c["source"], c["target"], f"{c['measured_ms']:.1f}", f"{c['predicted_ms']:.1f}",
         f"{c['error_pct']:+.1f}", f"{c['no_change_pct']:+.1f}", f"{c['scaling_pct']:+.1f}",
         f"{c['true_change_pct']:+.1f}") for c in result["cases"]]))
    families: dict[str, list[dict]] = {}
    for c in result["cases"]:
        families.setdefault(c["family"], []).append(c)
    print("\nper family (mean |error| %; max):")
    print(table([("family", "cases", "dpro", "max", "no change", "scaling")] + [
        (f, str(len(cs)), f"{_mean_abs(cs, 'error_pct'):.1f}", f"{max(abs(c['error_pct']) for c in cs):.1f}",
         f"{_mean_abs(cs, 'no_change_pct'):.1f}", f"{_mean_abs(cs, 'scaling_pct'):.1f}") for f, cs in families.items()]))


def _mean_abs(cases_: list[dict], key: str) -> float:
    return float(np.mean([abs(c[key]) for c in cases_]))


def summary(result: dict, label: str, goals: bool) -> list[dict]:
    """The benchmark table's rows for one seed; ``goals``: whether its goals apply (a held-out
    scoring seed)."""
    cs, replays, noise = result["cases"], result["replays"], list(result["noise"].values())
    large = [c for c in cs if abs(c["true_change_pct"]) >= 10]
    case = f"{label} seed {result['seed']} ({len(cs)} cases)"

    def row(metric: str, value: float, baseline: float, goal: str, met: bool) -> dict:
        return {"benchmark": "fidelity", "case": case, "metric": metric, "dpro": value, "baseline": baseline,
                "ratio": value / baseline if baseline else float("nan"), "goal": goal if goals else f"({label})",
                "met": bool(met) if goals else True}

    errors = [abs(c["error_pct"]) for c in cs]
    rows = [row("noise floor: max spread % of identical configurations (baseline: median)", max(noise),
                float(np.median(noise)), "<= 3", max(noise) <= 3),
            row("replay as recorded: max |error| % (baseline: profiled steps')",
                max(abs(r["error_pct"]) for r in replays),
                max(abs(r["profiled_ms"] / r["measured_ms"] - 1) * 100 for r in replays), f"<= {GOAL_REPLAY:g}",
                max(abs(r["error_pct"]) for r in replays) <= GOAL_REPLAY),
            row("mean |error| % (baseline: no change)", float(np.mean(errors)), _mean_abs(cs, "no_change_pct"),
                f"<= {GOAL_MEAN:g}", np.mean(errors) <= GOAL_MEAN),
            row("mean |error| % (baseline: scaling)", float(np.mean(errors)), _mean_abs(cs, "scaling_pct"),
                f"<= {GOAL_MEAN:g}", np.mean(errors) <= GOAL_MEAN),
            row("max |error| % (baseline: no change's max)", max(errors), max(abs(c["no_change_pct"]) for c in cs),
                f"<= {GOAL_MAX:g}", max(errors) <= GOAL_MAX)]
    for key, name in (("no_change_pct", "no change"), ("scaling_pct", "scaling")):
        halved = sum(abs(c["error_pct"]) <= abs(c[key]) / 2 for c in large)
        rows.append(row(f"changes >= 10%: error <= half {name}'s (of {len(large)})", halved, len(large),
                        f"{len(large)} of {len(large)}", bool(large) and halved == len(large)))
    return rows


def run(quick: bool = False, seeds: str = "both", keep: Path | None = None) -> list[dict]:
    """The tuning seed, then the scoring seed (``seeds``: "both", "tuning" or "scoring")."""
    from tools.testing.netns import can_build_namespaces

    reason = can_build_namespaces()
    if reason:
        raise SystemExit(f"fidelity: the testbed needs network namespaces: {reason}")
    state = frozen.check()
    jobs = QUICK_JOBS if quick else JOBS
    root = keep or Path(tempfile.mkdtemp(prefix="dpro-fidelity-"))
    rows = []
    with Testbed() as testbed:
        if seeds in ("both", "tuning"):
            tuning = run_seed(testbed, TUNING_SEED, QUICK_JOBS, root / "tuning")
            _print_seed(tuning, "tuning (looked at while the model was shaped)")
            rows += summary(tuning, "tuning", goals=False)
        if seeds in ("both", "scoring"):
            if state.seed is None:
                raise SystemExit(f"fidelity: {state.why}; run python -m benchmarks.fidelity --freeze SEED")
            scoring = run_seed(testbed, state.seed, jobs, root / "scoring")
            label = "scoring (held out)" if state.held_out else "scoring (NOT held out)"
            _print_seed(scoring, label)
            rows += summary(scoring, "scoring" if state.held_out else "scoring, not held out", goals=state.held_out)
        for line in testbed.repeated():
            print(f"\n{line}")
    print(f"\nmodel: {state.why}")
    print(f"runs kept in {root}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fidelity", description=__doc__.splitlines()[0])
    parser.add_argument("--tune", action="store_true", help="the tuning seed only")
    parser.add_argument("--score", action="store_true", help="the scoring seed only")
    parser.add_argument("--freeze", type=int, nargs="?", const=-1, metavar="SEED",
                        help="freeze the committed model with a scoring seed drawn now (or SEED, never used before)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--keep", type=Path, help="record into this folder")
    parser.add_argument("--json", type=Path, help="also write the summary rows as JSON")
    args = parser.parse_args(argv)
    if args.freeze is not None:
        print(frozen.freeze(None if args.freeze < 0 else args.freeze).why)
        return 0
    from benchmarks.__main__ import format_table

    rows = run(args.quick, "tuning" if args.tune else "scoring" if args.score else "both", args.keep)
    print(format_table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
