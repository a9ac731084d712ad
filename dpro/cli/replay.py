"""``dpro replay`` and ``dpro critical-path``: the recorded run's graph, replayed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from dpro.cli.options import RUN, analysis_options, ms, open_analysis, table
from dpro.errors import DproError

TOP_OPS = 15  # ops listed by `dpro critical-path` without --all


@click.command()
@click.argument("run", type=RUN)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--export", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the predicted timeline as a Chrome trace (opens in Perfetto).")
@click.option("--no-align", is_flag=True, help="Ignore the recorded clock offsets between ranks.")
@analysis_options
def replay(run: Any, as_json: bool, export: Path | None, no_align: bool, scheduler: str | None,
           workers: int | None) -> None:
    """Replay a recorded run's dataflow graph: measured against predicted step time."""
    from dpro.analysis.run import STALLED
    from dpro.analysis.window import window_check
    from dpro.replayer.replay_report import comparison, export_chrome_trace

    analysis = open_analysis(run, scheduler, workers, align=not no_align)
    graph, result = analysis.graph, analysis.replay()
    unclosed = analysis.unclosed_collectives()
    summary = {**comparison(graph, result, analysis.unprofiled_step_ns, analysis.profiled_step_ns),
               "window": window_check(analysis),
               "unclosed_collectives": [{k: (int(v) if k in ("rank", "count") else v) for k, v in row.items()}
                                        for row in unclosed.to_dict("records")]}
    if export:
        export_chrome_trace(graph, result, export)
    if as_json:
        click.echo(json.dumps(summary, indent=1))
        return
    click.echo(f"graph of profiled steps {summary['steps']}: {summary['nodes']} nodes, {summary['edges']} edges")
    if analysis.stalled_steps:
        click.echo(f"left out of the graph: profiled step(s) {analysis.stalled_steps}, each more than "
                   f"{STALLED:g}x the window's median step on some rank")
    rows = [("rank", "measured ms", "predicted ms", "error %", "profiled ms", "profiler slow-down")]
    for r in [*summary["per_rank"], {**summary, "rank": "job"}]:
        rows.append((str(r["rank"]), ms(r["measured_step_ms"]), f"{r['predicted_step_ms']:.2f}",
                     "-" if r["error_pct"] is None else f"{r['error_pct']:+.2f}", ms(r["profiled_step_ms"]),
                     "-" if r["profiler_slowdown"] is None else f"{r['profiler_slowdown']:.2f}x"))
    click.echo(table(rows))
    click.echo("measured: the median step outside the profiling window; predicted: the replay, the "
               "profiler's cost per event taken out")
    if summary["window"]["disturbed"]:
        click.echo(f"warning: {summary['window']['message']}")
    if len(unclosed):
        click.echo(f"warning: {int(unclosed['count'].sum())} collective(s) not closed, no other rank of the run has "
                   "them (kept at their recorded time): " + ", ".join(
                       f"rank {r.rank} {r.coll} x{r.count} (group {r.pg_name})" for r in unclosed.itertuples()))


@click.command("critical-path")
@click.argument("run", type=RUN)
@click.option("--rank", type=int, help="The path ending at this rank's last op (default: the job's).")
@click.option("--all", "show_all", is_flag=True, help="List every node of the path, in order.")
@click.option("--top", default=TOP_OPS, show_default=True, type=click.IntRange(min=1),
              help="How many ops to list, by their time on the path.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (breakdown, top ops and the whole path).")
@analysis_options
def critical_path(run: Any, rank: int | None, show_all: bool, top: int, as_json: bool, scheduler: str | None,
                  workers: int | None) -> None:
    """The critical path of a recorded run's predicted step: what it is made of (compute, CPU
    launch-bound, exposed communication, waiting for other ranks, idle) and the ops that take
    most of it."""
    from dpro.replayer.breakdown import CATEGORIES, breakdown
    from dpro.replayer.replay_report import critical_path as path_of, top_ops

    analysis = open_analysis(run, scheduler, workers)
    graph, result = analysis.graph, analysis.replay()
    if rank is not None and rank not in graph.step_ns:
        raise DproError(f"no rank {rank} in {analysis.root} (ranks {sorted(graph.step_ns)})")
    parts = breakdown(graph, result, rank)
    path = path_of(graph, result, rank)
    ops = top_ops(path)
    if as_json:
        click.echo(json.dumps({"breakdown": parts, "top_ops": ops, "path": path}, indent=1))
        return
    click.echo(f"critical path of rank {parts['rank']}: {parts['span_ms']:.2f} ms, {parts['nodes']} nodes")
    for c in CATEGORIES:
        click.echo(f"  {c.replace('_', ' '):<14} {parts[c + '_ms']:9.2f} ms  "
                   f"{100 * parts[c + '_ms'] / max(parts['span_ms'], 1e-9):5.1f}%")
    parallelism = analysis.parallelism
    by_group = {g: t for g, t in parts["communication_by_group_ms"].items() if t > 0}
    if len(by_group) > 1 or not parallelism.data_parallel_only:
        click.echo(f"the job: {parallelism.describe()}")
        for g, t in sorted(by_group.items(), key=lambda kv: -kv[1]):
            click.echo(f"  communication of {parallelism.group_label(g)}: {t:.2f} ms")
        if parallelism.pipeline is not None:
            click.echo(f"  pipeline bubble (waiting for other stages, or any slower rank): {parts['waiting_ms']:.2f} ms "
                       f"({100 * parts['waiting_ms'] / max(parts['span_ms'], 1e-9):.1f}%)")
    if show_all:
        click.echo("")
        click.echo(table([("start ms", "ms", "rank", "resource", "op")] + [
            (f"{p['start_ms'] - path[0]['start_ms']:.3f}", f"{p['dur_ms']:.3f}", str(p["rank"]), p["resource"], p["name"])
            for p in path]))
        return
    click.echo(f"\ntop {min(top, len(ops))} of {len(ops)} ops on the path, by their time on it:")
    click.echo(table([("ms", "share", "times", "kind", "op")] + [
        (f"{o['total_ms']:.3f}", f"{100 * o['share']:.1f}%", str(o["count"]), o["kind"], o["name"]) for o in ops[:top]]))
    if len(ops) > top:
        click.echo(f"(--all lists all {len(path)} nodes in order; --json gives everything)")
