"""``dpro optimize``: the change that speeds the recorded job up, found with the cost model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

from dpro.cli.options import (RUN, STRICT, analysis_options, default_run_name, ms, open_analysis, say_gaps,
                              strict_option, table)


def _search_options(fn: Any) -> Any:
    for option in reversed([
        click.option("--budget", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
                     metavar="S", help="Seconds the search may take."),
        click.option("--memory-budget", type=click.FloatRange(min=0, min_open=True), metavar="GB",
                     help="Leave out strategies estimated to need more memory than this on any rank (GB)."),
        click.option("--exact-only", is_flag=True, help="Leave out strategies that change the numerics (compression)."),
        click.option("--trials", "trial_count", type=click.IntRange(min=1), default=3, show_default=True, metavar="K",
                     help="With a command: the candidates measured."),
        click.option("--trial-steps", type=click.IntRange(min=1), default=20, show_default=True, metavar="N",
                     help="Steps measured in each trial (after 3 left out)."),
        click.option("--trial-rounds", type=click.IntRange(min=1), default=2, show_default=True, metavar="R",
                     help="Interleaved rounds of trials (each candidate and the job as it is, once a round)."),
        click.option("--trial-budget", type=click.FloatRange(min=0, min_open=True), default=1200.0, show_default=True,
                     metavar="S", help="Seconds all trials may take: none starts once it would be overrun."),
        click.option("--trial-timeout", type=click.FloatRange(min=0, min_open=True), default=300.0, show_default=True,
                     metavar="S", help="A trial that has not timed its steps by then is stopped and reported."),
        click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
                     help="Write report.md, report.html, report.json, strategy.json (the recommendation), "
                          "strategies/*.json and the trials' recordings (trials/) here."),
        click.option("--force", is_flag=True, help="With -o: replace the reports already in DIR."),
        click.option("--all", "every", is_flag=True,
                     help="List every strategy in report.md and on the terminal (default: the best 10 distinct "
                          "and 5 code changes)."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table."),
    ]):
        fn = option(fn)
    return fn


@click.command()
@click.argument("run", type=RUN)
@_search_options
@click.option("--trial", is_flag=True,
              help="Measure the best candidates with short trials of COMMAND (after --) and recommend the measured best.")
@click.option("--no-guidance", is_flag=True,
              help="Search the communication passes even where the critical path exposes no communication.")
@click.option("--no-incremental-replay", is_flag=True,
              help="Replay the whole step for every prediction (to measure what re-replaying the changed part saves).")
@click.option("--fold-ranks", is_flag=True,
              help="Replay each prediction folded onto the median rank: faster with many ranks, approximate "
                   "(the ranks' skew and stragglers are left out).")
@analysis_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def optimize(run: Any, trial: bool, no_guidance: bool, no_incremental_replay: bool, fold_ranks: bool,
             scheduler: str | None, workers: int | None, command: tuple[str, ...], **options: Any) -> None:
    """Search DDP bucket caps and first buckets, gradient compression, DDP's flags, accumulation
    and checkpointing for RUN's job with the cost model, and recommend a change only where its
    predicted gain clears the model's held-out uncertainty.

    \b
    Examples:
      dpro optimize run1 -o report1
      dpro optimize run1 --trial -- torchrun --nproc-per-node 8 train.py   (measure the best 3)
    """
    from dpro.optimizer.search import Tricks

    if trial != bool(command):
        raise click.UsageError("--trial needs the job's command after --: dpro optimize RUN --trial -- torchrun ..."
                               if trial else f"unexpected arguments {' '.join(command)!r} (--trial runs a command)")
    _check_output(options["output"], options["force"])
    analysis = open_analysis(run, scheduler, workers)
    tricks = Tricks(guidance=not no_guidance, incremental=not no_incremental_replay, fold=fold_ranks)
    _optimize(analysis, list(command), tricks, **options)


@click.command()
@_search_options
@click.option("--run", "run_dir", type=click.Path(file_okay=False, path_type=Path), metavar="RUN",
              help="Record the baseline here (default: DIR/run with -o, else dpro-run-DATE-TIME).")
@click.option("--skip", default=10, show_default=True, type=click.IntRange(min=1),
              help="The baseline recording's steps before profiling.")
@click.option("--steps", default=5, show_default=True, type=click.IntRange(min=1),
              help="The baseline recording's profiled steps.")
@strict_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def tune(run_dir: Path | None, skip: int, steps: int, command: tuple[str, ...], **options: Any) -> None:
    """Record COMMAND's job, search it with the cost model and measure the best candidates with
    short trials: `dpro record` then `dpro optimize --trial`.

    \b
    Example:
      dpro tune -o tuned -- torchrun --nproc-per-node 8 train.py
    """
    from dpro.analysis import RunAnalysis
    from dpro.optimizer.search import Tricks
    from dpro.run_format import open_run

    _check_output(options["output"], options["force"])
    out = options["output"]
    run_dir = run_dir or (out / "run" if out else default_run_name("dpro-run"))
    if run_dir.exists():
        raise click.UsageError(f"{run_dir} exists already: give --run another folder")
    click.echo(f"tune: recording the job as it is into {run_dir}", err=True)
    done = subprocess.run([sys.executable, "-m", "dpro", "record", "-o", str(run_dir), "--skip", str(skip),
                           "--steps", str(steps), "--", *command])
    if done.returncode:
        raise click.ClickException(f"the baseline recording failed (exit {done.returncode}): nothing was searched")
    run = open_run(run_dir)
    say_gaps(run, strict=bool(click.get_current_context().meta.get(STRICT)))
    _optimize(RunAnalysis(run), list(command), Tricks(), **options)


def _check_output(output: Path | None, force: bool) -> None:
    if output is not None and not force and any((output / name).exists() for name in ("report.json", "strategy.json")):
        raise click.UsageError(f"{output} already holds a report; --force replaces it")


def _optimize(analysis: Any, command: list[str], tricks: Any, budget: float, memory_budget: float | None,
              exact_only: bool, trial_count: int, trial_steps: int, trial_rounds: int, trial_budget: float,
              trial_timeout: float, output: Path | None, force: bool, as_json: bool, every: bool) -> None:
    """Search, measure the candidates where a command is given, write and print the report."""
    from dpro.optimizer.report import report, with_breakdowns, write_report
    from dpro.optimizer.search import search

    result = search(analysis, budget_s=budget, exact_only=exact_only, memory_budget_gb=memory_budget, tricks=tricks)
    data = report(result, command or analysis.run.manifest.get("command"))
    if command:
        data = _trials(data, command, trial_count, trial_steps, trial_rounds, trial_budget, trial_timeout, output)
    data = with_breakdowns(data, result)
    if output is not None:
        write_report(data, result, output, analysis, every)
    if as_json:
        click.echo(json.dumps(data, indent=1))
        return
    print_report(data, output, every)


def _trials(data: dict[str, Any], command: list[str], count: int, steps: int, rounds: int, budget: float,
            timeout: float, output: Path | None) -> dict[str, Any]:
    """``data`` with the top ``count`` candidates measured against the job as it is."""
    import tempfile

    from dpro.optimizer.report import candidates as chosen, with_trials
    from dpro.optimizer.trials import Trial, run_trials

    candidates = [Trial(name, settings, predicted) for name, settings, predicted in chosen(data, count)]
    trials = [Trial("as-recorded", {}, data["baseline_step_ms"])] + candidates
    click.echo(f"trials: {', '.join(t.name for t in candidates)} against the job as it is, {rounds} rounds of "
               f"{steps} steps each", err=True)
    with tempfile.TemporaryDirectory(prefix="dpro-trials-") as scratch:
        folder = output / "trials" if output is not None else Path(scratch)
        run_trials(command, trials, folder, steps, rounds, budget, timeout, log=lambda line: click.echo(line, err=True))
    return with_trials(data, trials, steps, rounds)


def print_report(data: dict[str, Any], output: Path | None, every: bool = False) -> None:
    """The answer first, then the trials, the lines, the code changes and the notes."""
    from dpro.optimizer.report_text import APART, TOP, apply_command, appliable, folded, headline, keep_hint, speedups

    verdict, best = data["recommendation"], data["strategies"][0]
    title, detail = headline(data)
    click.echo(f"{title}. {detail}")
    if verdict["verdict"] == "change":
        click.echo(f"why: {verdict['why']}")
        if appliable(best):
            click.echo(f"apply: {apply_command(data, str(output) if output is not None else 'DIR')}"
                       + ("" if output is not None else "   (-o DIR writes DIR/strategy.json)"))
            click.echo("or change the script:")
        else:
            click.echo("change the script:")
        for line in best["change"]:
            click.echo(f"  {line}")
    else:
        click.echo(keep_hint(data).replace("`", ""))
    if "trials" in data:
        t = data["trials"]
        click.echo(f"trials ({t['steps']} steps each, {t['rounds']} interleaved rounds):")
        rows = [("strategy", "predicted ms", "measured ms", "measured speed-up", "note")]
        for r in t["results"]:
            rows.append((r["name"], ms(r["predicted_step_ms"]), ms(r["median_ms"]),
                         "-" if r["measured_speedup"] is None else f"{r['measured_speedup']:.2f}x",
                         "; ".join(([r["failed"]] if r["failed"] else []) + r["left_out"])[:120]))
        click.echo(table(rows))
    for title, entries, top in (("strategies (--apply sets them)", data["strategies"], TOP),
                                ("code changes (never recommended: the script changed by hand, or unscored)",
                                 data["code_changes"], APART)):
        if not entries:
            continue
        click.echo(f"{title}:")
        rows = [("strategy", "predicted ms", "speed-up (90% interval)", "status", "memory GB", "lossy", "stands for")]
        shown = entries if every else entries[:top]
        for s in shown:
            rows.append((s["name"], ms(s["predicted_step_ms"]), speedups(s), s["status"],
                         "?" if s["memory_gb"] is None else f"{s['memory_gb']:.3g}", "yes" if s["lossy"] else "", folded(s)))
        click.echo(table(rows))
        if len(entries) > len(shown):
            click.echo(f"... {len(entries) - len(shown)} more (--all lists them" + (f"; all in {output / 'report.json'})"
                                                                                   if output else ")"))
    for note in data["notes"]:
        click.echo(f"note: {note}")
    source = data["intervals"]
    click.echo(f"intervals: 90% of the cost model's held-out errors per family of change (model {source['model']}, "
               f"fidelity scoring seed {source['seed']})")
    search_ = data["search"]
    click.echo(f"search: {search_['evaluated']} of {search_['space']} strategies in {search_['elapsed_s']:.1f} s"
               + ("" if search_["exhaustive"] else " (the budget ran out)"))
    if output is not None:
        click.echo(f"wrote {output / 'report.md'}, {output / 'report.html'}, {output / 'strategy.json'}")
