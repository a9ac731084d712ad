"""``dpro record`` and ``dpro merge``: recording jobs into run directories."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from dpro.cli import CONTEXT
from dpro.cli.options import default_run_name
from dpro.errors import DproError

if TYPE_CHECKING:
    from dpro.run_format import Run


def window_options(fn: Any) -> Any:
    for option in reversed([
        click.option("--skip", default=10, show_default=True, type=click.IntRange(min=1),
                     help="Steps before profiling starts (step 0 ends at the first optimizer step)."),
        click.option("--warmup", default=2, show_default=True, type=click.IntRange(min=0),
                     help="Profiler warm-up steps (traced but discarded)."),
        click.option("--steps", default=5, show_default=True, type=click.IntRange(min=1),
                     help="Steps profiled and written to each rank's trace."),
    ]):
        fn = option(fn)
    return fn


def verbose_option(fn: Any) -> Any:
    return click.option("-v", "--verbose", is_flag=True,
                        help="Show all the job's stderr: torch's messages about the profiling (its start and "
                             "stop markers, the allocator's warnings) too, which otherwise go to the node's "
                             "job-stderr.log.")(fn)


@click.command(context_settings={**CONTEXT, "ignore_unknown_options": True,
                                "allow_interspersed_args": False})
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Run directory to create (default: dpro-run-DATE-TIME).")
@window_options
@click.option("--force", is_flag=True, help="Replace an existing dpro run at --output.")
@click.option("--join", is_flag=True,
              help="Add this node to a run other nodes record into (same --output on a shared "
                   "file system); every node of a multi-node job runs dpro record --join.")
@click.option("--gpu-interval", default=0.1, show_default=True, type=click.FloatRange(min=0.01),
              help="Seconds between GPU samples (NVML).")
@click.option("--sysfs-root", type=click.Path(exists=True, file_okay=False),
              help="Read NIC counters from this sysfs tree instead of /sys (also $DPRO_SYSFS_ROOT).")
@click.option("--no-calibrate", is_flag=True,
              help="Skip the calibration: the profiler's cost before the window, the job's collectives "
                   "at several sizes after it (a few seconds).")
@click.option("--probe", is_flag=True,
              help="Pipeline jobs: after the window, run a few steps at half the micro-batches (the same batch; "
                   "gradients averaged as torch's schedules do) and profile two, which show what a pass costs "
                   "whatever its size (dpro whatif --microbatches). Where the loss averages over samples and no "
                   "layer mixes them (batch norm), the training is unchanged.")
@click.option("--apply", "strategy", type=click.Path(dir_okay=False, path_type=Path), metavar="STRATEGY.json",
              help="Run the job with a strategy of `dpro optimize` (its bucket cap and communication hook), "
                   "without changing the script.")
@click.option("--strict-record", is_flag=True,
              help="Exit 1 when dpro could not save part of the recording (a full disk, a read-only or removed "
                   "run folder), instead of the job's exit code; with a run folder that cannot be written, "
                   "do not start the job.")
@verbose_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def record(output: Path | None, skip: int, warmup: int, steps: int, force: bool, join: bool,
           gpu_interval: float, sysfs_root: str | None, no_calibrate: bool, probe: bool, strategy: Path | None,
           strict_record: bool, verbose: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND and record every rank of the training job it starts.

    \b
    Examples:
      dpro record -o run1 -- torchrun --nproc-per-node 8 train.py --lr 0.1
      dpro record -o run1 --skip 50 --steps 3 -- python train.py
      srun dpro record --join -o /shared/run1 -- torchrun ... train.py   (one per node)

    The script is not changed: steps end at each optimizer step (or at dpro.step() in loops
    without an optimizer). dpro exits with the job's exit code, whatever happens to its own
    writing (what it could not save is said, and kept in the run where anything can be written).
    """
    from dpro.collectors.record import RecordOptions, exit_like
    from dpro.collectors.record import record as record_job

    applied = _strategy_file(strategy) if strategy is not None else None
    opts = RecordOptions(output=output or default_run_name("dpro-run"), skip=skip, warmup=warmup,
                         steps=steps, force=force, join=join, gpu_interval_s=gpu_interval,
                         sysfs_root=sysfs_root, calibrate=not no_calibrate, probe=probe, apply=applied, verbose=verbose,
                         strict=strict_record)
    recorded = record_job(list(command), opts, say=lambda line: click.echo(f"dpro: {line}", err=True))
    if recorded.unrecorded is None:  # else said before the job started
        _report_recording(opts.output)
        say_lost(recorded.lost)
    if strict_record and recorded.lost:
        raise click.ClickException(f"{len(recorded.lost)} part(s) of the recording not saved (--strict-record; "
                                   f"the job's exit code was {recorded.status})")
    sys.exit(exit_like(recorded.status))


def say_lost(lost: list[dict[str, Any]]) -> None:
    """One line on stderr per thing dpro could not save."""
    for entry in lost:
        where = f" (rank {entry['rank']}, step {entry['step']})" if entry.get("rank") is not None else ""
        click.echo(f"dpro: not saved: {entry['file']}{where}: {entry['why']}", err=True)


def _strategy_file(path: Path) -> dict[str, Any]:
    """A strategy file's content, with its settings checked (one-line errors)."""
    import json

    from dpro.optimizer.strategy import read_strategy

    strategy = read_strategy(path)
    return {**json.loads(path.read_text()), "settings": strategy.settings, "name": strategy.name}


def _report_recording(run_dir: Path) -> None:
    """Say on stderr what was recorded, and any hook failure (never fails: the job's exit code
    is what dpro record exits with)."""
    from dpro.analysis import RunAnalysis
    from dpro.analysis.summary import summarize_run

    try:
        analysis = RunAnalysis.open(run_dir)
        summary = summarize_run(analysis, count_events=False)
    except (DproError, OSError) as e:
        click.echo(f"dpro: the run cannot be read back: {e}", err=True)
        return
    ranks = summary["per_rank"]
    traces = sum(1 for r in ranks if r["trace"])
    steps = sorted({r["steps"] for r in ranks})
    click.echo(f"dpro: recorded {len(ranks)} rank(s), {traces} trace(s), "
               f"{'/'.join(map(str, steps)) or 0} step(s) per rank in {run_dir}", err=True)
    for r in ranks:
        if r["errors"]:
            click.echo(f"dpro: warning: rank {r['rank']}: {r['errors']} failure(s) in dpro's hooks "
                       f"(the job went on); see {run_dir}/ranks/{r['rank']}/errors.log", err=True)
    for path in sorted(run_dir.glob("errors-*.log")):
        click.echo(f"dpro: warning: dpro's hooks failed before a rank was known; see {path}", err=True)
    _report_applied(summary["per_rank"], analysis.run)
    _report_probe(analysis.run)


def _report_probe(run: Run) -> None:
    """Say whether ``--probe`` kept the pipeline's probe steps, and why not."""
    if not (run.manifest.get("options") or {}).get("probe"):
        return
    probe, why = run.probe()
    if probe is None:
        click.echo(f"dpro: warning: --probe kept no micro-batch probe: {why}", err=True)
        return
    report = probe.probe_report(run.traced_ranks[0]) or {}
    steps = report.get("steps") or []
    click.echo(f"dpro: micro-batch probe: steps {', '.join(map(str, steps))} at {report.get('microbatches')} "
               f"micro-batches (the job's {report.get('recorded_microbatches')})", err=True)


def _report_applied(ranks: list[dict[str, Any]], run: Run) -> None:
    """Say what ``--apply`` applied, and warn about what it could not."""
    strategy = (run.manifest.get("options") or {}).get("apply")
    if not strategy:
        return
    if not strategy.get("settings"):
        click.echo(f"dpro: the strategy {strategy.get('name')} changes nothing: nothing applied", err=True)
        return
    for r in ranks:
        applied = run.rank_meta(r["rank"]).applied
        done, left = applied.applied, applied.left_out
        if done:
            click.echo(f"dpro: rank {r['rank']}: applied {', '.join(dict.fromkeys(done))}", err=True)
        elif not left:
            click.echo(f"dpro: warning: rank {r['rank']}: nothing applied (the job built no "
                       "DistributedDataParallel module)", err=True)
        for item in dict.fromkeys(left):
            click.echo(f"dpro: warning: rank {r['rank']}: left out {item}", err=True)


@click.command()
@click.argument("output", type=click.Path(path_type=Path))
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False,
                                                                      path_type=Path))
def merge(output: Path, sources: tuple[Path, ...]) -> None:
    """Merge runs recorded on separate nodes (local run directories) into OUTPUT.

    \b
    Example:  dpro merge run1 node0/run1 node1/run1
    """
    from dpro.merge import merge_runs

    merged = merge_runs(list(sources), output)
    click.echo(f"dpro: merged {len(sources)} run(s) into {output}: ranks {merged['ranks']}")
