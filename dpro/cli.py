"""The ``dpro`` command line: thin commands over the library."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from . import __version__
from .errors import DproError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _OneLineErrors(click.Group):
    """Turns dpro's expected failures (bad input) into one-line errors with exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DproError as e:
            raise click.ClickException(str(e)) from None
        except OSError as e:
            raise click.ClickException(f"{e.strerror or e}: {e.filename}" if e.filename else str(e)) from None


@click.group(cls=_OneLineErrors, context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="dpro")
def main() -> None:
    """Profile distributed PyTorch training and find what slows it down.

    Record a job with `dpro record -o RUN -- torchrun ... train.py`, then look at it with
    `dpro info RUN`. `dpro demo` records a small example job on 2 local ranks.
    """


def _window_options(fn: Any) -> Any:
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


def _default_run_name(prefix: str) -> Path:
    return Path(f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}")


@main.command(context_settings={**CONTEXT, "ignore_unknown_options": True,
                                "allow_interspersed_args": False})
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Run directory to create (default: dpro-run-DATE-TIME).")
@_window_options
@click.option("--force", is_flag=True, help="Replace an existing dpro run at --output.")
@click.option("--join", is_flag=True,
              help="Add this node to a run other nodes record into (same --output on a shared "
                   "file system); every node of a multi-node job runs dpro record --join.")
@click.option("--gpu-interval", default=0.1, show_default=True, type=click.FloatRange(min=0.01),
              help="Seconds between GPU samples (NVML).")
@click.option("--sysfs-root", type=click.Path(exists=True, file_okay=False),
              help="Read NIC counters from this sysfs tree instead of /sys (also $DPRO_SYSFS_ROOT).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def record(output: Path | None, skip: int, warmup: int, steps: int, force: bool, join: bool,
           gpu_interval: float, sysfs_root: str | None, command: tuple[str, ...]) -> None:
    """Run COMMAND and record every rank of the training job it starts.

    \b
    Examples:
      dpro record -o run1 -- torchrun --nproc-per-node 8 train.py --lr 0.1
      dpro record -o run1 --skip 50 --steps 3 -- python train.py
      srun dpro record --join -o /shared/run1 -- torchrun ... train.py   (one per node)

    The script is not changed: steps end at each optimizer step (or at dpro.step() in loops
    without an optimizer). dpro exits with the job's exit code.
    """
    from dpro.collectors.record import RecordOptions, exit_like
    from dpro.collectors.record import record as record_job

    opts = RecordOptions(output=output or _default_run_name("dpro-run"), skip=skip, warmup=warmup,
                         steps=steps, force=force, join=join, gpu_interval_s=gpu_interval,
                         sysfs_root=sysfs_root)
    status = record_job(list(command), opts)
    _report_recording(opts.output)
    sys.exit(exit_like(status))


def _report_recording(run_dir: Path) -> None:
    """Say on stderr what was recorded, and any hook failure."""
    from .run_format import open_run
    from .summary import summarize_run

    summary = summarize_run(open_run(run_dir), count_events=False)
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


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--rank", type=int, help="Rank of a trace that does not say which rank it is.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def info(path: Path, rank: int | None, as_json: bool) -> None:
    """Summarize a run directory or a single Kineto trace (.json or .json.gz).

    Prints ranks, hosts, steps, step-time statistics per rank (median, p90, slowest rank) and
    event counts.
    """
    from .summary import summarize

    if not path.exists():
        raise click.ClickException(f"no such file or directory: {path}")
    summary = summarize(path, rank=rank)
    if as_json:
        click.echo(json.dumps(summary, indent=1))
    else:
        click.echo(_format_summary(summary))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _format_summary(s: dict[str, Any]) -> str:
    lines = [f"{s['kind']}: {s['path']}"]
    if s.get("command"):
        lines.append(f"command: {' '.join(s['command'])}")
    lines.append(f"hosts: {', '.join(s['hosts']) or '-'}")
    lines.append(f"ranks: {len(s['ranks'])} of world size {s.get('world_size') or '?'}; "
                 f"slowest rank (median step): {s['slowest_rank'] if s['slowest_rank'] is not None else '-'}")
    header = ("rank", "host", "steps", "timed", "median ms", "p90 ms", "profiled ms", "events", "errors")
    rows = [header]
    for r in s["per_rank"]:
        rows.append((str(r["rank"]), r.get("host") or "-", str(r["steps"]), str(r["steps_timed"]),
                     _ms(r["step_ms"]["median"]), _ms(r["step_ms"]["p90"]),
                     _ms(r.get("profiled_step_ms", {}).get("median")),
                     "-" if r.get("events") is None else str(r["events"]), str(r.get("errors", 0))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines.append("")
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    for n in s.get("nodes", []):
        status = f"exit code {n['exit_code']}" if n.get("signal") is None else f"killed by {n['signal']}"
        lines.append(f"\nnode {n['host']}: job {status}")
        lines += [f"  {name}: {note}" for name, note in (n.get("collectors") or {}).items()]
    return "\n".join(lines)


@main.command()
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Run directory to create (default: dpro-demo-DATE-TIME).")
@click.option("--nproc", default=2, show_default=True, type=click.IntRange(min=1),
              help="Ranks to start on this machine.")
@click.option("--train-steps", default=40, show_default=True, type=click.IntRange(min=2),
              help="Training steps of the example job.")
@_window_options
def demo(output: Path | None, nproc: int, train_steps: int, skip: int, warmup: int, steps: int) -> None:
    """Record the bundled example (a small transformer LM with DDP) on local ranks."""
    from dpro.collectors.record import RecordOptions, record as record_job
    from dpro.examples import train_lm

    from .summary import summarize

    run_dir = output or _default_run_name("dpro-demo")
    if skip + warmup + steps > train_steps:
        raise click.ClickException(f"the profiling window (skip {skip} + warm-up {warmup} + steps "
                                   f"{steps}) does not fit in {train_steps} training steps")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", train_lm.__file__, f"--steps={train_steps}"]
    click.echo(f"dpro demo: recording {' '.join(command[2:])}", err=True)
    status = record_job(command, RecordOptions(output=run_dir, skip=skip, warmup=warmup, steps=steps))
    if status != 0:
        raise click.ClickException(f"the example job failed (status {status}); see the output above")
    click.echo(_format_summary(summarize(run_dir)))
    click.echo(f"\nrecorded in {run_dir}/ (layout: docs/run-format.md). Next:\n"
               f"  dpro info {run_dir} --json        # the same, as JSON\n"
               f"  dpro info {run_dir}/ranks/0/trace.json.gz   # one rank's profiled steps\n"
               f"  open {run_dir}/ranks/0/trace.json.gz in https://ui.perfetto.dev to see the timeline")


@main.command()
@click.argument("output", type=click.Path(path_type=Path))
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False,
                                                                      path_type=Path))
def merge(output: Path, sources: tuple[Path, ...]) -> None:
    """Merge runs recorded on separate nodes (local run directories) into OUTPUT.

    \b
    Example:  dpro merge run1 node0/run1 node1/run1
    """
    from .merge import merge_runs

    merged = merge_runs(list(sources), output)
    click.echo(f"dpro: merged {len(sources)} run(s) into {output}: ranks {merged['ranks']}")


@main.command()
@click.argument("run_dir", metavar="RUN", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--export", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the predicted timeline as a Chrome trace (opens in Perfetto).")
@click.option("--no-align", is_flag=True, help="Ignore the recorded clock offsets between ranks.")
def replay(run_dir: Path, as_json: bool, export: Path | None, no_align: bool) -> None:
    """Replay a recorded run's dataflow graph: measured against predicted step time."""
    from dpro.replayer.report import comparison, export_chrome_trace, replay_run

    from .run_format import open_run

    graph, result = replay_run(open_run(run_dir), align=not no_align)
    summary = comparison(graph, result)
    if export:
        export_chrome_trace(graph, result, export)
    if as_json:
        click.echo(json.dumps(summary, indent=1))
        return
    click.echo(f"steps {summary['steps']}: {summary['nodes']} nodes, {summary['edges']} edges")
    click.echo("rank  measured ms  predicted ms  error %")
    for r in summary["per_rank"]:
        click.echo(f"{r['rank']:<4}  {r['measured_step_ms']:11.2f}  {r['predicted_step_ms']:12.2f}  {r['error_pct']:+7.2f}")
    click.echo(f"job   {summary['measured_step_ms']:11.2f}  {summary['predicted_step_ms']:12.2f}  {summary['error_pct']:+7.2f}")


@main.command("critical-path")
@click.argument("run_dir", metavar="RUN", type=click.Path(path_type=Path))
@click.option("--rank", type=int, help="The path ending at this rank's last op (default: the job's).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def critical_path_command(run_dir: Path, rank: int | None, as_json: bool) -> None:
    """The critical path of a recorded run's predicted step, and what it is made of: compute,
    CPU launch-bound, exposed communication, waiting for other ranks, idle."""
    from dpro.replayer.breakdown import CATEGORIES, breakdown
    from dpro.replayer.report import critical_path, replay_run

    from .run_format import open_run

    graph, result = replay_run(open_run(run_dir))
    if rank is not None and rank not in graph.step_ns:
        raise DproError(f"no rank {rank} in {run_dir} (ranks {sorted(graph.step_ns)})")
    parts = breakdown(graph, result, rank)
    path = critical_path(graph, result, rank)
    if as_json:
        click.echo(json.dumps({"breakdown": parts, "path": path}, indent=1))
        return
    for p in path:
        click.echo(f"{p['start_ms'] - path[0]['start_ms']:9.3f} ms  {p['dur_ms']:8.3f} ms  r{p['rank']:<3} "
                   f"{p['resource']:<16} {p['name']}")
    click.echo(f"critical path of rank {parts['rank']}: {parts['span_ms']:.2f} ms, {parts['nodes']} nodes")
    for c in CATEGORIES:
        click.echo(f"  {c.replace('_', ' '):<14} {parts[c + '_ms']:9.2f} ms  {100 * parts[c + '_ms'] / parts['span_ms']:5.1f}%")


def _register_anomaly_commands() -> None:
    from dpro.anomaly.commands import anomaly, diagnose

    main.add_command(diagnose)
    main.add_command(anomaly)


_register_anomaly_commands()

if __name__ == "__main__":
    main()
