"""``dpro optimize``: the change that speeds the recorded job up, found with the cost model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from dpro.cli.options import RUN, analysis_options, ms, open_analysis, table

SHOWN = 10  # strategies in the table


@click.command()
@click.argument("run", type=RUN)
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True, metavar="S",
              help="Seconds the search may take.")
@click.option("--memory-budget", type=click.FloatRange(min=0, min_open=True), metavar="GB",
              help="Leave out strategies estimated to need more memory than this on any rank (GB).")
@click.option("--no-guidance", is_flag=True,
              help="Search the communication passes even where the critical path exposes no communication.")
@click.option("--no-incremental-replay", is_flag=True,
              help="Replay the whole step for every prediction (to measure what re-replaying the changed part saves).")
@click.option("--fold-ranks", is_flag=True,
              help="Replay each prediction folded onto the median rank: faster with many ranks, approximate "
                   "(the ranks' skew and stragglers are left out).")
@click.option("--exact-only", is_flag=True, help="Leave out strategies that change the numerics (compression).")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Write report.md, report.html, report.json, strategy.json (the best) and strategies/*.json here.")
@click.option("--force", is_flag=True, help="With -o: replace the reports already in DIR.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@analysis_options
def optimize(run: Any, budget: float, memory_budget: float | None, no_guidance: bool, no_incremental_replay: bool,
             fold_ranks: bool, exact_only: bool, output: Path | None, force: bool, as_json: bool,
             scheduler: str | None, workers: int | None) -> None:
    """Search DDP bucket caps, gradient compression, gradients as bucket views and activation
    checkpointing for RUN's job with the cost model; print the strategies, best first, with the
    change each needs."""
    from dpro.optimizer.report import report, write_report
    from dpro.optimizer.search import Tricks, search

    if output is not None and not force and any((output / name).exists() for name in ("report.json", "strategy.json")):
        raise click.UsageError(f"{output} already holds a report; --force replaces it")
    analysis = open_analysis(run, scheduler, workers)
    tricks = Tricks(guidance=not no_guidance, incremental=not no_incremental_replay, fold=fold_ranks)
    result = search(analysis, budget_s=budget, exact_only=exact_only, memory_budget_gb=memory_budget, tricks=tricks)
    data = report(result)
    if output is not None:
        write_report(data, output, analysis)
    if as_json:
        click.echo(json.dumps(data, indent=1))
        return
    rows = [("strategy", "predicted ms", "speed-up", "memory GB", "lossy", "passes")]
    for s in data["strategies"][:SHOWN]:
        rows.append((s["name"], ms(s["predicted_step_ms"]), f"{s['predicted_speedup']:.2f}x",
                     "?" if s["memory_gb"] is None else f"{s['memory_gb']:.3g}", "yes" if s["lossy"] else "",
                     "+".join(s["passes"]) or "-"))
    click.echo(f"baseline: {data['baseline_step_ms']:.1f} ms per step (the median step outside the profiling window)")
    click.echo(table(rows))
    if len(data["strategies"]) > SHOWN:
        click.echo(f"... {len(data['strategies']) - SHOWN} more" + (f" in {output / 'report.md'}" if output else
                                                                   " (--json or -o DIR lists them all)"))
    best = data["strategies"][0]
    click.echo(f"best: {best['name']}" + ("" if best["passes"] else " (no change predicts a faster step)"))
    for line in best["change"]:
        click.echo(f"  {line}")
    for note in data["notes"]:
        click.echo(f"note: {note}")
    search_ = data["search"]
    click.echo(f"search: {search_['evaluated']} of {search_['space']} strategies in {search_['elapsed_s']:.1f} s"
               + ("" if search_["exhaustive"] else " (the budget ran out)"))
    if output is not None:
        click.echo(f"wrote {output / 'report.md'}, {output / 'report.html'}, {output / 'strategy.json'}")
