"""Whether ``dpro optimize`` recommends only what it can show, on held-out jobs.

**Held out.** The quiet testbed's emulated-device jobs (:mod:`benchmarks.testbed`) drawn from
the frozen scoring seed (``benchmarks/testbed/frozen.json``, job indices from
:data:`FIRST_JOB`: jobs no benchmark has run) on 2 namespace hosts with shaped links, and the
example's CNN (never a tuning case) on the same hosts at 50 and 1000 mbit. Held out only while
the model is the frozen one; the output says which.

For each job: the configuration as written (DDP's 25 MB cap) is recorded with ``dpro record``;
``dpro optimize`` and ``dpro optimize --exact-only`` search it, and ``dpro optimize
--exact-only --trial`` measures its best candidates on the job's own hosts and links (the
command a :mod:`benchmarks.testbed.launch` line, as a user's ``srun`` line would be); then,
measured interleaved (:data:`ROUNDS` rounds, no profiler, medians): the job as written, **every
bucket cap of the ladder** the search proposes (``dpro.optimizer.passes.tensor_fusion``), each
recommendation and the best :data:`TOP` lines of each search. Goals:

- **no slow-down**: each recommendation measured >= 0.98x the job as written;
- **regret**: the exact recommendation, predicted and with ``--trial``, within 5% of the best
  measured exact configuration (the ladder's caps and the job as written);
- **intervals**: each measured strategy's speed-up within the interval its report stated, in
  >= 90% of them;
- **trials**: each ``--trial`` recommendation is the measured best of its trials;
- **speed**: every search <= 60 s; a prediction with the cost model built <= 50 ms on a 2-rank
  job, printed beside a prediction that builds it anew.

    python -m benchmarks optimize            # about 40 minutes
    python -m benchmarks.optimize --quick    # one testbed job, no real jobs
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.testbed import frozen
from benchmarks.testbed.launch import hosts_file
from benchmarks.testbed.protocol import Config, Testbed, ddp_flags, interleaved, spread_pct
from benchmarks.testbed.spec import draw_job
from dpro.cli.options import table

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_lm.py"
FIRST_JOB = 100  # the testbed's job indices of this benchmark (the fidelity benchmark's are 0-2)
JOBS, QUICK_JOBS = 3, 1
RATES_MBIT = (100, 200, 400)
REAL_RATES_MBIT = (50, 1000)
ROUNDS = 3
TOP = 2  # lines of each search measured beside the ladder and the recommendation
SEARCH_BUDGET_S = 60.0
GOAL_NO_SLOWDOWN, GOAL_REGRET_PCT, GOAL_COVERAGE, GOAL_PREDICT_MS = 0.98, 5.0, 0.90, 50.0
TRIAL_ARGS = ["--trials", "3", "--trial-steps", "15", "--trial-rounds", "3"]
TRIAL_JOB_STEPS = 60  # more than a trial measures: it is stopped once its steps are timed


@dataclass(frozen=True)
class ExampleConfig:
    """The example's CNN as a testbed configuration (what :class:`Testbed` measures and records)."""

    name: str
    rate_mbit: int
    hosts: int = 2
    bucket_cap_mb: float = 25.0
    first_bucket_mb: float | None = None
    comm_hook: str | None = None
    static_graph: bool = False
    gradient_as_bucket_view: bool = False

    def argv(self, steps: int) -> list[str]:
        out = [str(EXAMPLE), "--arch", "cnn", "--steps", str(steps), "--bucket-cap-mb", str(self.bucket_cap_mb)]
        if self.first_bucket_mb is not None:
            out += ["--first-bucket-mb", str(self.first_bucket_mb)]
        return out + (["--comm-hook", self.comm_hook] if self.comm_hook else []) + ddp_flags(self)

    def but(self, name: str, **changes) -> "ExampleConfig":
        return replace(self, name=name, **changes)


def _configured(base, name: str, settings: dict):
    """``base`` under a strategy's settings, or None where the job cannot run them (a code
    change)."""
    changes = {}
    for key, value in settings.items():
        if key in ("bucket_cap_mb", "first_bucket_mb", "static_graph", "gradient_as_bucket_view"):
            changes[key] = value
        elif key == "comm_hook":
            changes[key] = f"powersgd:{settings['powersgd_rank']}" if value == "powersgd" else value
        elif key != "powersgd_rank":
            return None
    return base.but(f"{base.name}+{name}", **changes)


def _dpro(*args: object, timeout: float = 1800) -> dict:
    done = subprocess.run([sys.executable, "-m", "dpro", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"dpro {args[0]}: {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout)


def _strategies(found: dict) -> dict[str, dict]:
    """Every strategy a report predicted, by name: its lines and the strategies they stand for
    (with the interval the line states, scaled to the strategy's own prediction)."""
    out = {}
    for line in found["strategies"]:
        out[line["name"]] = line
        for e in line["equivalent_strategies"]:
            scale = e["predicted_step_ms"] / line["predicted_step_ms"]
            out[e["name"]] = {**line, **e, "interval_ms": [x * scale for x in line["interval_ms"]]}
    return out


def job_case(testbed: Testbed, base, root: Path, say) -> dict:
    """Record, search twice, measure the ladder and the answers of one job; its figures."""
    run = root / base.name
    if not (run / "run.json").exists():
        say(f"optimize: recording {base.name}")
        testbed.record(base, run)
    searches = {mode: _dpro("optimize", run, "--json", "--budget", SEARCH_BUDGET_S, *flags)
                for mode, flags in (("lossy", []), ("exact", ["--exact-only"]))}
    predicted = {**_strategies(searches["lossy"]), **_strategies(searches["exact"])}
    from dpro.analysis import RunAnalysis
    from dpro.optimizer.passes import tensor_fusion

    ladder = sorted(s["bucket_cap_mb"] for s in tensor_fusion(RunAnalysis.open(run)).settings)
    configs = {"as-recorded": base}
    configs.update({f"bucket-cap-{mb:g}mb": base.but(f"{base.name}-b{mb:g}", bucket_cap_mb=mb) for mb in ladder})
    trial_out = root / f"{base.name}-trial"
    if not (trial_out / "report.json").exists():
        say(f"optimize: dpro optimize --exact-only --trial on {base.name}")
        hosts = hosts_file(testbed._cluster(base), root / f"{base.name}-hosts.json")  # links shaped as measured
        _dpro("optimize", run, "--json", "--exact-only", "--trial", *TRIAL_ARGS, "-o", trial_out, "--force", "--",
              sys.executable, "-m", "benchmarks.testbed.launch", hosts, "--", *base.argv(TRIAL_JOB_STEPS))
    trial = json.loads((trial_out / "report.json").read_text())
    searches["trial"] = trial
    predicted.update(_strategies(trial))
    chosen = {mode: found["recommendation"]["name"] for mode, found in searches.items()}
    tops = [s["name"] for found in searches.values() for s in found["strategies"] if s["apply"]][:TOP * 2]
    unrunnable = []
    for name in {*chosen.values(), *tops} - set(configs):
        config = _configured(base, name, predicted[name]["apply"])
        if config is None:
            unrunnable.append(name)
        else:
            configs[name] = config
    saved = root / f"{base.name}-medians.json"
    if saved.exists():
        medians = json.loads(saved.read_text())
    else:
        medians = interleaved(testbed, configs.values(), ROUNDS, seed=len(base.name))
        saved.write_text(json.dumps(medians, indent=1))
    measured = {name: statistics.median(medians[c.name]) for name, c in configs.items()}
    noise = max(spread_pct(m) for m in medians.values())
    baseline = measured["as-recorded"]
    exact = ["as-recorded"] + [f"bucket-cap-{mb:g}mb" for mb in ladder]
    best_exact = min(exact, key=measured.get)
    covered = []
    for name, ms in measured.items():
        line = predicted.get(name)
        if line is None or line["interval_ms"] is None or name == "as-recorded":
            continue
        low, high = line["interval_ms"]
        covered.append({"name": name, "measured_ms": ms, "predicted_ms": line["predicted_step_ms"],
                        "low_ms": low, "high_ms": high,
                        "inside": low * baseline / searches["lossy"]["baseline_step_ms"] <= ms <=
                        high * baseline / searches["lossy"]["baseline_step_ms"]})
    return {"job": base.name, "baseline_ms": baseline, "noise_pct": noise, "measured": measured,
            "recommended": {mode: {"name": name, "measured_ms": measured.get(name),
                                   "predicted_ms": predicted[name]["predicted_step_ms"] if name in predicted else None,
                                   "speedup": baseline / measured[name] if name in measured else None}
                            for mode, name in chosen.items()},
            "best_exact": {"name": best_exact, "measured_ms": measured[best_exact]},
            "regret_pct": {mode: 100 * (measured[chosen[mode]] / measured[best_exact] - 1) if chosen[mode] in measured
                           else None for mode in ("exact", "trial")},
            "trials": trial["trials"]["results"],
            "intervals": covered, "unrunnable": unrunnable,
            "search_s": {mode: searches[mode]["search"]["elapsed_s"] for mode in ("lossy", "exact")},
            "verdicts": {mode: found["recommendation"] for mode, found in searches.items()}}


def prediction_speed(run: Path) -> dict:
    """Seconds per prediction of the ladder's caps, with one cost model and building it anew."""
    from dpro.analysis import RunAnalysis
    from dpro.analysis.whatif import Change, CostModel, predict

    analysis = RunAnalysis.open(run)
    analysis.graph  # built (and cached) before any timing
    changes = [Change(bucket_cap_mb=mb) for mb in (0.25, 0.5, 1, 2, 5, 10)]
    begun = time.perf_counter()
    cost = CostModel(analysis)
    build_s = time.perf_counter() - begun
    reused, fresh = [], []
    for change in changes * 3:
        t = time.perf_counter()
        cost.predict(change)
        reused.append(time.perf_counter() - t)
        t = time.perf_counter()
        predict(analysis, change)
        fresh.append(time.perf_counter() - t)
    return {"build_ms": build_s * 1e3, "reused_ms": statistics.median(reused) * 1e3,
            "fresh_ms": statistics.median(fresh) * 1e3, "ranks": len(analysis.ranks)}


def _print(cases: list[dict], speed: dict, state) -> None:
    print(f"\ndpro optimize on held-out jobs ({ROUNDS} interleaved rounds each, medians; model: {state.why}):")
    rows = [("job", "noise %", "as written ms", "search", "recommended", "measured ms", "speed-up", "best exact",
             "regret %", "search s")]
    for c in cases:
        for mode in ("lossy", "exact", "trial"):
            r = c["recommended"][mode]
            rows.append((c["job"], f"{c['noise_pct']:.1f}", f"{c['baseline_ms']:.1f}",
                         "exact, --trial" if mode == "trial" else mode, r["name"],
                         "-" if r["measured_ms"] is None else f"{r['measured_ms']:.1f}",
                         "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
                         f"{c['best_exact']['name']} {c['best_exact']['measured_ms']:.1f}" if mode != "lossy" else "",
                         "-" if mode == "lossy" or c["regret_pct"][mode] is None else f"{c['regret_pct'][mode]:+.1f}",
                         f"{c['search_s'][mode]:.1f}" if mode != "trial" else ""))
    print(table(rows))
    print("\ntrials of the exact search (dpro optimize --exact-only --trial, each job on its own hosts and links):")
    print(table([("job", "strategy", "predicted ms", "trials ms", "median ms", "note")] + [
        (c["job"], r["name"], f"{r['predicted_step_ms']:.1f}", " ".join(f"{m:.1f}" for m in r["measured_ms"]),
         "-" if r["median_ms"] is None else f"{r['median_ms']:.1f}", r["failed"] or "")
        for c in cases for r in c["trials"]]))
    print("\nevery measured configuration (ms):")
    for c in cases:
        print(f"  {c['job']}: " + ", ".join(f"{n} {ms:.1f}" for n, ms in sorted(c["measured"].items(), key=lambda x: x[1])))
        if c["unrunnable"]:
            print(f"    not run (the job cannot take them): {', '.join(c['unrunnable'])}")
    print("\nstated intervals against the measured step (scaled to the measured baseline):")
    print(table([("job", "strategy", "predicted ms", "interval ms", "measured ms", "inside")] + [
        (c["job"], i["name"], f"{i['predicted_ms']:.1f}", f"{i['low_ms']:.1f}-{i['high_ms']:.1f}",
         f"{i['measured_ms']:.1f}", "yes" if i["inside"] else "NO") for c in cases for i in c["intervals"]]))
    print(f"\nprediction on a {speed['ranks']}-rank recording: {speed['reused_ms']:.1f} ms with the cost model built "
          f"(built once in {speed['build_ms']:.0f} ms), {speed['fresh_ms']:.1f} ms building it anew")


def _rows(cases: list[dict], speed: dict, goals: bool) -> list[dict]:
    def row(case: str, metric: str, value: float, baseline: float, goal: str, met: bool) -> dict:
        return {"benchmark": "optimize", "case": case, "metric": metric, "dpro": value, "baseline": baseline,
                "ratio": value / baseline if baseline else float("nan"), "goal": goal if goals else "(not held out)",
                "met": bool(met) if goals else True}

    rows = []
    speedups = [c["recommended"][m]["speedup"] for c in cases for m in ("lossy", "exact", "trial")
                if c["recommended"][m]["speedup"] is not None]
    if speedups:
        rows.append(row(f"{len(speedups)} recommendations", "lowest measured speed-up (baseline: the job as written)",
                        min(speedups), 1.0, f">= {GOAL_NO_SLOWDOWN}", min(speedups) >= GOAL_NO_SLOWDOWN))
    for mode, label in (("exact", "predicted"), ("trial", "with --trial")):
        regrets = [c["regret_pct"][mode] for c in cases]
        measured = [r for r in regrets if r is not None]  # a recommendation the job cannot run is a miss
        rows.append(row(f"{len(cases)} jobs, exact, {label}", f"largest regret % ({len(regrets) - len(measured)} not "
                        "measurable; baseline: noise %)", max(measured, default=float("nan")),
                        max(c["noise_pct"] for c in cases), f"<= {GOAL_REGRET_PCT:g}",
                        len(measured) == len(regrets) and max(measured) <= GOAL_REGRET_PCT))
    measured_best = [min((r for r in c["trials"] if r["median_ms"]), key=lambda r: r["median_ms"])["name"]
                     == c["recommended"]["trial"]["name"] for c in cases]
    rows.append(row(f"{len(cases)} jobs, --trial", "recommendations that are their trials' measured best",
                    sum(measured_best), len(cases), f"{len(cases)} of {len(cases)}", all(measured_best)))
    inside = [i["inside"] for c in cases for i in c["intervals"]]
    if inside:
        rows.append(row(f"{len(inside)} measured strategies", "share inside the stated interval (baseline: 90%)",
                        sum(inside) / len(inside), GOAL_COVERAGE, f">= {GOAL_COVERAGE:g}",
                        sum(inside) / len(inside) >= GOAL_COVERAGE))
    longest = max(s for c in cases for s in c["search_s"].values())
    rows.append(row("every search", "longest search s (baseline: the budget)", longest, SEARCH_BUDGET_S,
                    f"<= {SEARCH_BUDGET_S:g}", longest <= SEARCH_BUDGET_S))
    rows.append(row(f"{speed['ranks']}-rank recording", "ms a prediction, cost model built (baseline: built anew)",
                    speed["reused_ms"], speed["fresh_ms"], f"<= {GOAL_PREDICT_MS:g}", speed["reused_ms"] <= GOAL_PREDICT_MS))
    return rows


def run(quick: bool = False, keep: Path | None = None, tune: bool = False) -> list[dict]:
    """The held-out jobs, the trials and the speed; the summary rows. ``tune``: the fidelity
    benchmark's tuning seed's jobs instead (to try the harness; no goal counts)."""
    from tools.testing.netns import can_build_namespaces

    reason = can_build_namespaces()
    if reason:
        raise SystemExit(f"optimize: the testbed needs network namespaces: {reason}")
    state = frozen.check()
    if tune:
        from benchmarks.fidelity import TUNING_SEED

        state = frozen.Frozen(False, TUNING_SEED, None, f"the tuning seed {TUNING_SEED}: not held out")
    elif state.seed is None:
        raise SystemExit(f"optimize: {state.why}; run python -m benchmarks.fidelity --freeze")
    root = keep or Path(tempfile.mkdtemp(prefix="dpro-optimize-"))
    root.mkdir(parents=True, exist_ok=True)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    import random

    bases = []
    for i in range(QUICK_JOBS if quick else JOBS):
        index = state.seed * 1000 + FIRST_JOB + i
        rate = random.Random(index).choice(RATES_MBIT)
        bases.append(Config(f"s{state.seed}j{FIRST_JOB + i}-{rate}", draw_job(index), rate))
    if not quick:
        bases += [ExampleConfig(f"cnn-{rate}", rate) for rate in REAL_RATES_MBIT]
    with Testbed(log=say) as testbed:
        cases = []
        for base in bases:
            say(f"optimize: {base.name}" + (f": {base.job.describe()}" if isinstance(base, Config) else ""))
            cases.append(job_case(testbed, base, root, say))
    speed = prediction_speed(root / bases[0].name)
    _print(cases, speed, state)
    print(f"runs kept in {root}")
    (root / "results.json").write_text(json.dumps({"cases": cases, "speed": speed, "model": state.why}, indent=1))
    return _rows(cases, speed, state.held_out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.optimize", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--keep", type=Path, help="record into this folder (measurements found there are reused)")
    parser.add_argument("--json", type=Path, help="also write the summary rows as JSON")
    parser.add_argument("--tune", action="store_true", help="the tuning seed's jobs (not held out)")
    args = parser.parse_args(argv)
    from benchmarks.__main__ import format_table

    rows = run(args.quick, args.keep, args.tune)
    print(format_table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
