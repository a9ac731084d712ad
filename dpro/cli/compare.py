"""``dpro compare``: two runs side by side, and the prediction the second one carried."""

from __future__ import annotations

import json
from typing import Any

import click

from dpro.cli.options import RUN, analysis_options, ms, open_analysis, table


@click.command()
@click.argument("run_a", type=RUN)
@click.argument("run_b", type=RUN)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@analysis_options
def compare(run_a: Any, run_b: Any, as_json: bool, scheduler: str | None, workers: int | None) -> None:
    """Compare RUN_B with RUN_A: step times, the measured speed-up, the step time RUN_B's
    strategy (dpro record --apply) was predicted to take, and where the time moved."""
    from dpro.analysis.compare import compare as compare_runs
    from dpro.replayer.breakdown import CATEGORIES

    result = compare_runs(open_analysis(run_a, scheduler, workers), open_analysis(run_b, scheduler, workers))
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    a, b = result["a"], result["b"]
    click.echo(table([("run", "step ms", "unprofiled steps"), (a["run"], ms(a["step_ms"]), str(a["steps"])),
                      (b["run"], ms(b["step_ms"]), str(b["steps"]))]))
    speedup = result["speedup"]
    click.echo("measured speed-up: " + ("-" if speedup is None else f"{speedup:.2f}x") +
               " (the median step outside the profiling window)")
    p = result["prediction"]
    if p is None:
        click.echo("prediction: none (RUN_B was not recorded with dpro record --apply)")
    else:
        error = "-" if p["error_pct"] is None else f"{p['error_pct']:+.1f}%"
        click.echo(f"prediction: {p['strategy']} was predicted at {ms(p['predicted_step_ms'])} ms "
                   f"(from {ms(p['baseline_step_ms'])} ms); measured {ms(b['step_ms'])} ms; error {error}")
    parts = result["breakdown"]
    if parts["a"] and parts["b"]:
        rows = [("critical path, ms", "a", "b", "moved")]
        for c in ("span", *CATEGORIES):
            rows.append((c, ms(parts["a"][c]), ms(parts["b"][c]), f"{parts['b'][c] - parts['a'][c]:+.2f}"))
        click.echo(table(rows))
