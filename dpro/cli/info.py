"""``dpro info``: what a run directory or a single trace holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from dpro.cli.options import STRICT, ms, say_gaps, strict_option, table


@click.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--rank", type=int, help="Rank of a trace that does not say which rank it is.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@strict_option
def info(path: Path, rank: int | None, as_json: bool) -> None:
    """Summarize a run directory or a single Kineto trace (.json or .json.gz).

    Prints ranks, hosts, steps, step-time statistics per rank (median, p90, slowest rank) and
    event counts.
    """
    from dpro.analysis.summary import summarize
    from dpro.analysis.run import undecodable_trace
    from dpro.run_format import is_run_dir, open_run

    if not path.exists():
        raise click.ClickException(f"no such file or directory: {path}")
    summary = summarize(path, rank=rank)
    if is_run_dir(path):
        undecodable = [undecodable_trace(r["rank"], r["trace_error"]) for r in summary["per_rank"] if r.get("trace_error")]
        say_gaps(open_run(path), strict=bool(click.get_current_context().meta.get(STRICT)), also=undecodable)
    if as_json:
        click.echo(json.dumps(summary, indent=1))
    else:
        click.echo(format_summary(summary))


def format_summary(s: dict[str, Any]) -> str:
    """The summary of :func:`dpro.analysis.summary.summarize` as text."""
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
                     ms(r["step_ms"]["median"]), ms(r["step_ms"]["p90"]),
                     ms(r.get("profiled_step_ms", {}).get("median")),
                     _events(r), str(r.get("errors", 0))))
    lines += ["", table(rows)]
    if (s.get("window") or {}).get("disturbed"):
        lines.append(f"\nwarning: {s['window']['message']}")
    for r in s["per_rank"]:
        if r.get("no_trace"):
            lines.append(f"no trace: {r['no_trace']}")
    several = len(s.get("nodes", [])) > 1
    for n in s.get("nodes", []):
        name = n.get("name") if several else n.get("host")  # several nodes of one host differ by their pid
        if not n.get("ended", True):
            lines.append(f"\nnode {name}: lost {n.get('lost_at') or ''}".rstrip())
        else:
            status = f"exit code {n['exit_code']}" if n.get("signal") is None else f"killed by {n['signal']}"
            lines.append(f"\nnode {name}: job {status}")
        if several and n.get("command"):
            lines.append(f"  command: {' '.join(n['command'])}")
        lines += [f"  {key}: {note}" for key, note in (n.get("collectors") or {}).items()]
        lines += [f"  not saved: {x['file']}: {x['why']}" for x in n.get("not_saved") or []]
    return "\n".join(lines)


def _events(rank: dict[str, Any]) -> str:
    if rank.get("trace_error"):
        return "undecodable"
    return "-" if rank.get("events") is None else str(rank["events"])
