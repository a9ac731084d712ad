"""Sends between hosts in the parallel benchmark's kept runs: in the job, in the calibration, in the what-ifs.

A diagnostic for :mod:`benchmarks.parallel`'s mesh what-ifs (``--fsdp-mesh``, ``--tp-mesh``), which
move calls onto groups that cross hosts and time them with the calibration's isolated calls. For the
runs kept by ``python -m benchmarks.parallel --keep DIR`` it prints:

- each run's median send between hosts of each collective, as the job made it, beside the
  calibration's time for a send of that size over the call's group;
- each mesh what-if's sends between hosts after its edit, as the what-if times them before the
  replay (per algorithm step; before the interference model's factors), beside the target's own
  sends of that size in its job;
- each mesh what-if's error as scored, and replayed again with those sends at the target's times
  (:func:`lengthened`: an estimate of what the sends explain, read from the target).

Both compare transfer times (a call's shortest instance over its algorithm's steps); the ranks'
late finishes, in the calls' *done* nodes, are not compared.

It measures nothing and changes no model; it lives apart from the benchmark so that the scored
model's hash (:data:`benchmarks.testbed.frozen.MODEL_SOURCES`) does not move with it.

    python -m benchmarks.parallel_sends --keep DIR --json FILE   # FILE: the same run's --json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from benchmarks.parallel import JOBS, seed_cases
from dpro.cli.options import table

if TYPE_CHECKING:
    from dpro.analysis.whatif import CostModel
    from dpro.replayer.graph_edits import WhatIf


def _median_sends(coll: np.ndarray, nbytes: np.ndarray, ns: np.ndarray, group: np.ndarray,
                  around: dict[str, float] | None = None) -> dict:
    """Per collective, its sends within a factor 2 of their median size (or of ``around``'s size
    for it, where given): that size, their median time and count, and their calls' group size."""
    out = {}
    for c in sorted(set(coll)):
        mine = coll == c
        median = (around or {}).get(str(c), float(np.median(nbytes[mine])))
        near = mine & (nbytes > median / 2) & (nbytes < median * 2)
        if not near.any():
            continue
        out[str(c)] = {"bytes": median, "ns": float(np.median(ns[near])), "sends": int(near.sum()),
                       "group": int(np.median(group[near]))}
    return out


def _sends_between_hosts(analysis) -> dict:
    """:func:`_median_sends` of the sends of ``analysis``'s calls that span hosts, as recorded
    (:func:`dpro.replayer.cost.send_points`, its ``inter`` class)."""
    from dpro.replayer.cost import send_points

    graph = analysis.graph
    group = {int(v): len(c.ranks) for c in graph.collectives.itertuples() for v in c.sends}
    points = send_points(graph)
    points = points[points["link_class"] == "inter"]
    return _median_sends(points["coll"].astype(str).to_numpy(), points["bytes"].to_numpy(),
                         points["dur_ns"].to_numpy(), np.array([group[int(v)] for v in points["node"]]))


def _between_hosts(w: WhatIf) -> np.ndarray:
    """A what-if's sends between hosts after its edit (those still sent). A send moved to a class
    it has no model of keeps its recorded model's key, re-timed at the classes' rates
    (``_class_rate``): its class is then the other one. Reads the what-if's per-send state (a
    diagnostic: the replayer's API has no such view)."""
    moved = w._class_rate != 1.0
    return np.array([x for x, (_, cls) in w._model_of.items()
                     if (cls == "inter") != bool(moved[x]) and w._repeat[x] > 0], np.int64)


def _what_if_sends_between_hosts(w: WhatIf, like: dict) -> dict:
    """:func:`_median_sends` of a what-if's sends between hosts after its edit (:func:`_between_hosts`),
    around the sizes of ``like`` (another run's :func:`_median_sends`): the bytes of each algorithm
    step and its time before the replay (before the interference model's factors)."""
    v = _between_hosts(w)
    coll = w.graph.nodes["coll"].astype(str).to_numpy()[v]
    return _median_sends(coll, w._bytes[v] * w._share[v], w.durations[v] / w._repeat[v],
                         np.array([like[c]["group"] if c in like else 0 for c in coll]),
                         {c: t["bytes"] for c, t in like.items()})


def sends_against_calibration(root: Path) -> list[dict]:
    """For each run kept in ``root``, each collective's sends between hosts as the job made them
    (near the run's median size: their median time) against the calibration's isolated calls of
    that collective (its per-send model over the call's group, at that size): whether a call in
    the job runs slower than the calibration times it."""
    from dpro.analysis import RunAnalysis
    from dpro.replayer.linkmodel import fit_collectives, per_send

    rows = []
    for run in sorted(p for p in root.iterdir() if p.is_dir()):
        analysis = RunAnalysis.open(run)
        fits = fit_collectives(analysis.calibrations)
        for coll, s in sorted(_sends_between_hosts(analysis).items()):
            if coll in fits:
                calibrated = float(per_send(fits[coll], s["group"]).time_ns(s["bytes"]))
                rows.append({"run": run.name, "coll": coll, "group": s["group"], "sends": s["sends"],
                             "median_kb": s["bytes"] / 1e3, "job_ms": s["ns"] / 1e6, "model_ms": calibrated / 1e6,
                             "ratio": s["ns"] / calibrated})
    return rows


def _mesh_cases(root: Path, jobs: int) -> list[tuple]:
    """The mesh what-ifs (``fsdp_mesh``, ``tp_mesh`` alone) of the seeds kept in ``root`` whose
    source and target are both kept, each with its edit (``edit(what_if, source)``)."""
    from dpro.analysis import fsdp, tensor_parallel

    edits = {"fsdp_mesh": fsdp.mesh, "tp_mesh": tensor_parallel.tp_mesh}
    seeds = {int(m.group(1)) for p in root.iterdir() if (m := re.fullmatch(r"s(\d+)j\d+-.+", p.name))}
    found = []
    for case in (c for seed in sorted(seeds) for c in seed_cases(seed, jobs)[1]):
        key = next(iter(case.change)) if len(case.change) == 1 else None
        if key in edits and (root / case.source).is_dir() and (root / case.target).is_dir():
            found.append((case, lambda w, source, e=edits[key], v=case.change[key]: e(w, source, v)))
    return found


def regrouped_sends(root: Path, jobs: int = JOBS) -> list[dict]:
    """For each mesh what-if (``fsdp_mesh``, ``tp_mesh``) whose source and target are kept in
    ``root``: each collective's sends between hosts as the what-if times them (per algorithm step)
    against the target's own, as its job made them."""
    from dpro.analysis import RunAnalysis
    from dpro.analysis.whatif import CostModel

    rows = []
    for case, edit in _mesh_cases(root, jobs):
        source, target = RunAnalysis.open(root / case.source), RunAnalysis.open(root / case.target)
        w = CostModel(source, interference=False).what_if()  # its send times before any replay
        edit(w, source)
        mine = _sends_between_hosts(target)
        predicted = _what_if_sends_between_hosts(w, mine)
        for coll, t in sorted(mine.items()):
            p = predicted.get(coll)
            if p is not None:
                rows.append({"case": f"{case.name} ({case.source})", "coll": coll, "median_kb": t["bytes"] / 1e3,
                             "sends": t["sends"], "model_sends": p["sends"], "job_ms": t["ns"] / 1e6,
                             "model_ms": p["ns"] / 1e6, "ratio": t["ns"] / p["ns"]})
    return rows


def lengthened(root: Path, regrouped: list[dict], measured: dict[str, list[float]], jobs: int = JOBS) -> list[dict]:
    """For each mesh what-if kept in ``root``: its error as the benchmark scores it (anchored on the
    source's measured median, from ``measured``: each configuration's medians, as the benchmark's
    ``--json`` keeps them), and replayed again with its sends between hosts
    lengthened by the ratio ``regrouped`` (:func:`regrouped_sends`) gives its collective: the
    target's sends over the what-if's, near their median size. The ratio is read from the target,
    and compares times before the interference model's factors, which the replay then applies
    again: an estimate of how much of the miss the sends explain, not a prediction."""
    from dpro.analysis import RunAnalysis
    from dpro.analysis.whatif import Change, CostModel

    median = {k: float(np.median(v)) for k, v in measured.items()}
    ratios: dict[str, dict[str, float]] = {}
    for r in regrouped:
        ratios.setdefault(r["case"], {})[r["coll"]] = r["ratio"]
    rows = []
    for case, edit in _mesh_cases(root, jobs):
        name = f"{case.name} ({case.source})"
        if name not in ratios:
            continue
        source = RunAnalysis.open(root / case.source)
        model = CostModel(source)
        scored = model.predict(Change(**case.change)).summary
        change = [_replayed_ratio(model, edit, lengthen) for lengthen in ({}, ratios[name])]
        error = [100 * (median[case.source] * c / median[case.target] - 1) for c in change]
        rows.append({"case": name, "ratios": ratios[name], "measured_ms": median[case.target],
                     "scored_pct": 100 * (median[case.source] * scored["predicted_step_ms"]
                                          / scored["baseline_step_ms"] / median[case.target] - 1),
                     "replicated_pct": error[0], "lengthened_pct": error[1]})
    return rows


def _replayed_ratio(model: CostModel, edit, lengthen: dict[str, float]) -> float:
    """The step under ``edit`` over the recorded one, anchored per rank on its unprofiled steps as
    :func:`dpro.analysis.whatif.predict` anchors it, with the sends between hosts of each collective
    in ``lengthen`` that many times as long."""
    from dpro.stats import job_mean, timed_ranks

    w = model.what_if()
    edit(w, model.analysis)
    if lengthen:
        v = _between_hosts(w)
        coll = w.graph.nodes["coll"].astype(str).to_numpy()[v]
        w.durations[v] *= np.array([lengthen.get(c, 1.0) for c in coll])
        w._retime_ends()  # the calls' done nodes follow their sends (shortened, never lengthened)
    changed, baseline = w.replay().step_ns, model.analysis.unprofiled_step_ns
    ranks = timed_ranks(baseline, sorted(changed))
    anchored = {r: baseline[r] * changed[r] / model.replayed_ns[r] for r in sorted(changed)}
    return job_mean(anchored, ranks) / job_mean(baseline, ranks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.parallel_sends", description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, required=True,
                        help="the runs kept by python -m benchmarks.parallel --keep")
    parser.add_argument("--json", type=Path, help="the benchmark's --json output of the same run (its measured "
                        "medians), for the what-ifs replayed with the target's sends; without it that table is left out")
    parser.add_argument("--jobs", type=int, default=JOBS)
    args = parser.parse_args(argv)
    measured = _measured(args.json) if args.json else None
    print("sends between hosts in the job against the calibration's isolated calls (median send, ms)")
    print(table([("run", "collective", "group", "sends", "median KB", "in job", "calibrated", "job/calibrated"),
                 *[(r["run"], r["coll"], str(r["group"]), str(r["sends"]), f"{r['median_kb']:.1f}",
                    f"{r['job_ms']:.2f}", f"{r['model_ms']:.2f}", f"{r['ratio']:.2f}")
                   for r in sends_against_calibration(args.keep)]]))
    regrouped = regrouped_sends(args.keep, args.jobs)
    print("\nmesh what-ifs: the target's sends between hosts in its job against the what-if's (median step, ms)")
    print(table([("case", "collective", "median KB", "sends", "what-if's nodes", "target's job", "what-if",
                  "job/what-if"),
                 *[(r["case"], r["coll"], f"{r['median_kb']:.1f}", str(r["sends"]), str(r["model_sends"]),
                    f"{r['job_ms']:.2f}", f"{r['model_ms']:.2f}", f"{r['ratio']:.2f}")
                   for r in regrouped]]))
    if measured is None:
        print("\n(the what-ifs replayed with the target's sends need the benchmark's --json output: --json FILE)")
        return 0
    print("\nmesh what-ifs replayed with their sends between hosts at the target's times "
          "(error against the target's median, %; read from the target: an estimate, no prediction)")
    print(table([("case", "job/what-if by collective", "target ms", "as scored", "replayed here", "sends lengthened"),
                 *[(r["case"], ", ".join(f"{c} {x:.2f}" for c, x in sorted(r["ratios"].items())),
                    f"{r['measured_ms']:.1f}", f"{r['scored_pct']:+.1f}", f"{r['replicated_pct']:+.1f}",
                    f"{r['lengthened_pct']:+.1f}") for r in lengthened(args.keep, regrouped, measured, args.jobs)]]))
    return 0


def _measured(path: Path) -> dict[str, list[float]]:
    """Each configuration's measured medians from the benchmark's ``--json`` output ``path``;
    a one-line exit where the file is not one."""
    try:
        return json.loads(path.read_text())["result"]["measured"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"{path}: not the --json output of python -m benchmarks.parallel ({type(e).__name__}: {e})")


if __name__ == "__main__":
    sys.exit(main())
