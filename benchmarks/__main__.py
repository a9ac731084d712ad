"""Run every benchmark and print one table of ratios measured side by side in this run.

    python -m benchmarks            # all cases (several minutes)
    python -m benchmarks --quick    # fewer repetitions and cases
    python -m benchmarks --json results.json   # the rows with their date, commit and machine
    python -m benchmarks fidelity   # one benchmark (as --only fidelity)
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from benchmarks.provenance import provenance
from dpro.cli.options import table

BENCHMARKS = ("benchmarks.recording_overhead", "benchmarks.trace_loading", "benchmarks.replay_accuracy",
              "benchmarks.replay_speed", "benchmarks.run_model",
              "benchmarks.testbed", "benchmarks.fidelity", "benchmarks.fidelity_real", "benchmarks.whatif_fold",
              "benchmarks.optimize", "benchmarks.parallel", "benchmarks.dashboard", "benchmarks.health", "benchmarks.health_nights",
              "benchmarks.health_localization",
              "benchmarks.probe_schedule")


def format_table(rows: list[dict]) -> str:
    header = ("benchmark", "case", "metric", "dpro", "baseline", "ratio", "goal", "met")
    return table([header] + [(r["benchmark"], r["case"], r["metric"], f"{r['dpro']:.4g}", f"{r['baseline']:.4g}",
                              f"{r['ratio']:.3f}x", r["goal"], "yes" if r["met"] else "NO") for r in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    names = [b.rsplit(".", 1)[1] for b in BENCHMARKS]
    parser.add_argument("names", nargs="*", choices=[[], *names], metavar="NAME",
                        help=f"benchmarks to run (default: all): {', '.join(names)}")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and cases")
    parser.add_argument("--only", choices=[b.rsplit(".", 1)[1] for b in BENCHMARKS], action="append")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    rows: list[dict] = []
    for name in BENCHMARKS:
        chosen = (args.only or []) + args.names
        if chosen and name.rsplit(".", 1)[1] not in chosen:
            continue
        print(f"running {name} ...", file=sys.stderr, flush=True)
        rows += importlib.import_module(name).run(quick=args.quick)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"provenance": provenance(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
