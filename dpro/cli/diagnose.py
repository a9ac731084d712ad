"""``dpro diagnose``: who slows the job, from its run, pairwise probes and a topology."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from dpro.cli.options import RUN, analysis_options, open_analysis


@click.command("diagnose")
@click.argument("run", type=RUN)
@click.option("--probes", "probes", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Pairwise probe results: a JSON matrix {hosts, bandwidth|latency} or a CSV of "
                   "src,dst,bandwidth|latency[,round].")
@click.option("--topology", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Fabric topology: YAML/JSON (switches, hosts, links) or ibnetdiscover output.")
@click.option("--json", "as_json", is_flag=True, help='Print {"suspects": [...]} as JSON.')
@analysis_options
def diagnose(run: Any, probes: Path | None, topology: Path | None, as_json: bool, scheduler: str | None,
             workers: int | None) -> None:
    """Name the ranks, hosts, NICs, links and switches that slow the job RUN, most likely first.

    \b
    From RUN's traces: ranks the others wait for at collectives, hosts with slow transfers,
    ranks with long steps. With --probes: hosts whose probes are all slow and, with
    --topology too, the NICs, links and switches that explain the slow probes, one direction
    at a time (any equal-cost path: the probes' own are unseen).
    """
    from dpro.anomaly.diagnose import diagnose as diagnose_suspects
    from dpro.anomaly.suspects import to_json

    analysis = open_analysis(run, scheduler, workers)
    suspects = diagnose_suspects(analysis, probes, topology)
    if run.ranks and not analysis.has_traces:
        click.echo("note: no trace, so no collective was analysed (stragglers, slow transfers): "
                   f"{run.why_no_traces()}", err=True)
    if as_json:
        click.echo(json.dumps(to_json(suspects), indent=1))
    else:
        click.echo(format_suspects(suspects))


def format_suspects(suspects: list[Any]) -> str:
    """One line per suspect, most likely first; a line saying so when there is none."""
    if not suspects:
        return "nothing stands out"
    lines = []
    for i, s in enumerate(suspects, 1):
        where = f" (host {s.host})" if s.host and s.host != s.name else ""
        facts = ", ".join(f"{k}={v}" for k, v in s.evidence.items())
        lines.append(f"{i:>2}. {s.kind:<6} {s.name}{where}  score {s.score:.1f}  {facts}")
    return "\n".join(lines)
