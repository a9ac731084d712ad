"""Tuning-side experiment for issue 29: the first sweep repeated on fixed 5-tuples.

Other tenants' traffic slows random probes from phase to phase; a fault slows, round after round,
the probes whose ECMP path crosses it. A prober that chooses its source ports (``iperf3 --cport``)
can repeat each probe of the health check's first sweep on the same 5-tuple, so on the same
unseen path, and give the localizer each tuple's median: the fault stays, the passing traffic
mostly goes. Compared, at the localizer's own first-sweep thresholds, with one sweep and with the
same repeats on random ports (every probe pooled).

Tuning side only: trials of :data:`benchmarks.health_localization.TUNING_SEED`, the tuned fabrics
(the held-out fabric stays out, as the scoring needs), 5% noise; not a scored figure. Each
repeat here is as noisy as one whole probe, and the follow-ups are left out; what ``dpro
health`` now does (every round repeated, each repeat a share of the probe time, over the job's
connections) was tuned with ``python -m benchmarks.health_localization --tune-sweeps``.

    python -m benchmarks.health_tuples [--trials 40] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from dpro.anomaly.fabric.localize import localize
from dpro.anomaly.fabric.probes import Probes
from dpro.cli.options import table

from . import fabric_sim as sim
from .health_localization import HEAVY, LIGHT, TUNING_SEED, Case, cases, draw_fault, finds

NOISE = 0.05
SIZES = (0.0, 0.1, 0.2)
FORMS = (("one sweep", 1, False), ("random ports", 3, False), ("fixed 5-tuples", 3, True), ("fixed 5-tuples", 5, True))
"""(name, sweeps, whether each probe keeps its source port across the sweeps)."""


def sweeps(case: Case, rng: np.random.Generator, size: float, background: sim.Background, repeats: int,
           fixed: bool) -> tuple[sim.Fault | None, Probes]:
    """A fault of ``size`` (none for 0) and the first sweep measured ``repeats`` times: each
    tuple's median where ``fixed``, else every probe, each sweep on new random ports."""
    fault = draw_fault(case.fabric, rng, size) if size > 0 else None
    count = sum(2 * len(pairs) for pairs in case.rounds)
    ports = rng.integers(*sim.EPHEMERAL_PORTS, size=count)
    runs = [np.array(sim.measure(case.fabric, case.rounds, [fault] if fault else [], NOISE, background, rng,
                                 sports=ports if fixed else None)) for _ in range(repeats)]
    if fixed:
        rows = runs[0].copy()
        rows[:, 3] = np.median([run[:, 3] for run in runs], axis=0)
    else:
        rows = np.concatenate([np.column_stack([run[:, :2], run[:, 2] + k * len(case.rounds), run[:, 3]])
                               for k, run in enumerate(runs)])
    return fault, Probes(case.fabric.hosts, rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64),
                         rows[:, 2].astype(np.int64), rows[:, 3])


def run(trials: int) -> list[dict]:
    """False alarms (no fault) and recall (a fault of 10% and 20%) per fabric, background and form."""
    rows = []
    for case in cases(held_out=False):
        for label, background in (("light", LIGHT), ("heavy", HEAVY)):
            for name, repeats, fixed in FORMS:
                rng = np.random.default_rng(TUNING_SEED)
                row = {"fabric": case.name, "background": label, "form": name, "sweeps": repeats}
                for size in SIZES:
                    hits = []
                    for _ in range(trials):
                        fault, probes = sweeps(case, rng, size, background, repeats, fixed)
                        suspects = localize(case.topology, probes)
                        hits.append(bool(suspects) if fault is None else any(finds(s, fault) for s in suspects))
                    row["false alarms" if size == 0 else f"recall at {size:.0%}"] = float(np.mean(hits))
                rows.append(row)
                print(f"{case.name}, {label} background, {name} x{repeats}: "
                      + ", ".join(f"{k} {v:.2f}" for k, v in row.items() if isinstance(v, float)), file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.health_tuples", description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40, help="per fabric, background, form and fault size")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    rows = run(args.trials)
    keys = list(rows[0])
    print(table([tuple(keys)] + [tuple(f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k]) for k in keys)
                                 for r in rows]))
    print(f"\ntuning side: seed {TUNING_SEED}, {args.trials} trials a cell, {NOISE:.0%} noise, the localizer's "
          "first-sweep thresholds; the held-out fabric left out")
    if args.json:
        args.json.write_text(json.dumps({"trials": args.trials, "seed": TUNING_SEED, "noise": NOISE, "rows": rows},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
