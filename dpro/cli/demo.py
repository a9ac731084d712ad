"""``dpro demo``: record the bundled example, then show on one screen what each surface of dpro
says about it, each with the command that says more."""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from dpro.cli.options import default_run_name
from dpro.cli.record import say_lost, verbose_option, window_options
from dpro.errors import DproError

WHATIF_SCALE = 0.1  # the what-if shown: every link this many times as fast as recorded
HEALTH_BUDGET_S = 60  # the health check suggested: its time budget


@click.command()
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Run directory to create (default: dpro-demo-DATE-TIME).")
@click.option("--nproc", default=2, show_default=True, type=click.IntRange(min=1),
              help="Ranks to start on this machine.")
@click.option("--train-steps", default=40, show_default=True, type=click.IntRange(min=2),
              help="Training steps of the example job.")
@window_options
@click.option("--open", "open_dashboard", is_flag=True, help="Then start the dashboard on the run.")
@verbose_option
def demo(output: Path | None, nproc: int, train_steps: int, skip: int, warmup: int, steps: int,
         open_dashboard: bool, verbose: bool) -> None:
    """Record the bundled example (a small transformer LM with DDP) on local ranks, then show
    what the replay, the critical path, a what-if and the optimizer say about it, and how to
    open the dashboard and run the health check."""
    from importlib.util import find_spec

    from dpro.analysis import RunAnalysis
    from dpro.collectors.record import RecordOptions, record as record_job

    run_dir = output or default_run_name("dpro-demo")
    if skip + warmup + steps > train_steps:
        raise click.ClickException(f"the profiling window (skip {skip} + warm-up {warmup} + steps "
                                   f"{steps}) does not fit in {train_steps} training steps")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", find_spec("dpro.examples.train_lm").origin, f"--steps={train_steps}"]
    click.echo(f"dpro demo: recording the bundled example (a small GPT, DDP over {nproc} local ranks) "
               f"into {run_dir}/", err=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets for its ranks, without its banner
    started = time.monotonic()
    recorded = record_job(command, RecordOptions(output=run_dir, skip=skip, warmup=warmup, steps=steps,
                                                 verbose=verbose), say=lambda line: click.echo(f"dpro: {line}", err=True))
    if recorded.unrecorded is None:
        say_lost(recorded.lost)
    if recorded.status != 0 or recorded.unrecorded:
        raise click.ClickException(f"the example job failed (status {recorded.status}); see the output above"
                                   if recorded.status else "nothing was recorded; see the output above")
    recorded_s = time.monotonic() - started
    click.echo("\n".join(tour(RunAnalysis.open(run_dir), shlex.quote(str(run_dir)), recorded_s)))
    if open_dashboard:
        _open_dashboard(click.get_current_context(), run_dir)


def tour(analysis: Any, run: str, recorded_s: float) -> list[str]:
    """The summary screen: one finding per surface and the command that shows it all, then the
    dashboard's and the health check's commands (``run``: the run's path as the user gave it)."""
    lines = [f"\nRecorded {len(analysis.ranks)} ranks in {recorded_s:.0f} s. What dpro says about the job "
             "(each command says more):"]
    for label, finding, command in [
        ("step", lambda: _step(analysis), f"dpro info {run}"),
        ("replay", lambda: _replay(analysis), f"dpro replay {run}"),
        ("path", lambda: _critical_path(analysis), f"dpro critical-path {run}"),
        ("what if", lambda: _what_if(analysis), f"dpro whatif {run} --bandwidth-scale {WHATIF_SCALE:g}"),
        ("optimize", lambda: _optimize(analysis), f"dpro optimize {run}"),
    ]:
        lines += [f"  {label:<9} {line}" if i == 0 else f"  {'':<9} {line}" for i, line in enumerate(_said(finding))]
        lines.append(f"  {'':<9} $ {command}")
    lines += ["Explore it, and check this machine:",
              f"  $ dpro dashboard {run}",
              "      timeline, critical path and what-ifs at http://127.0.0.1:8050/ (or: dpro demo --open)",
              f"  $ dpro health --time-budget {HEALTH_BUDGET_S}",
              "      this machine's GPUs, NICs, collectives and links against their baselines, kept in a history"]
    return lines


def _said(finding: Callable[[], list[str]]) -> list[str]:
    try:
        return finding()
    except DproError as e:
        return [f"not shown: {e}"]


def _step(analysis: Any) -> list[str]:
    per_rank = analysis.unprofiled_steps.groupby("rank").size()
    return [f"{analysis.baseline_step_ns / 1e6:.1f} ms, the ranks' median step outside the profiling window "
            f"({int(per_rank.median())} steps each)"]


def _replay(analysis: Any) -> list[str]:
    from dpro.replayer.replay_report import comparison

    c = comparison(analysis.graph, analysis.replay(), analysis.unprofiled_step_ns, analysis.profiled_step_ns)
    off = "" if c["error_pct"] is None else f", {c['error_pct']:+.1f}% off the measured {c['measured_step_ms']:.1f} ms"
    return [f"{c['predicted_step_ms']:.1f} ms predicted from the profiled steps' graph{off}"]


def _critical_path(analysis: Any) -> list[str]:
    from dpro.replayer.breakdown import CATEGORIES

    parts = analysis.critical_path_breakdown()
    span = parts["span"]
    shares = sorted(((parts[c] / span, c.replace("_", " ")) for c in CATEGORIES if span > 0), reverse=True)
    split = ", ".join(f"{name} {100 * share:.0f}%" for share, name in shares if share >= 0.005)
    return [f"critical path {span:.1f} ms: {split}"]


def _what_if(analysis: Any) -> list[str]:
    from dpro.analysis.whatif import Change, predict

    result = predict(analysis, Change(bandwidth_scale=WHATIF_SCALE))
    base, predicted = result["baseline_step_ms"], result["predicted_step_ms"]
    return [f"every link {1 / WHATIF_SCALE:g}x slower: {predicted:.1f} ms a step ({100 * (predicted / base - 1):+.1f}%)"]


def _optimize(analysis: Any) -> list[str]:
    from dpro.optimizer.report import report
    from dpro.optimizer.report_text import headline
    from dpro.optimizer.search import search

    data = report(search(analysis, budget_s=30), analysis.run.manifest.get("command"))
    title, _ = headline(data)
    if data["recommendation"]["verdict"] == "change":
        best = data["strategies"][0]
        return [title, f"{_speedup(best)}, {'lossy' if best['lossy'] else 'exact'}"]
    others = [s for s in data["strategies"] + data["code_changes"] if s["name"] != "as-recorded"]
    closest = max(others, key=lambda s: s["predicted_speedup"], default=None)
    return [title] + ([f"the closest change: {closest['name']}, {_speedup(closest)}"] if closest else [])


def _speedup(s: dict[str, Any]) -> str:
    interval = s["speedup_interval"]
    return f"{s['predicted_speedup']:.2f}x predicted" + (
        "" if interval is None else f" (90% interval {interval[0]:.2f}-{interval[1]:.2f}x)")


def _open_dashboard(ctx: click.Context, run_dir: Path) -> None:
    from dpro.cli.dashboard import LOCAL, dashboard
    from dpro.run_format import open_run

    ctx.invoke(dashboard, runs=(open_run(run_dir),), port=8050, host=LOCAL, report=None, probes=None,
               topology=None, health_db=None, scheduler=None, workers=None)
