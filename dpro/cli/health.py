"""``dpro health``: the nightly cluster health check, its history, and a node-problem-detector
mode. Exit codes: 0 healthy, 1 degraded, 2 failed, 3 could not run (any error, bad options
included, so that a wrapper never mistakes an error for a verdict)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from dpro.cli import CONTEXT
from dpro.errors import DproError



COULD_NOT_RUN = 3  # any error, so that a wrapper never mistakes one for a verdict (0, 1, 2)


class CouldNotRun(click.ClickException):
    """A one-line error with exit code 3."""

    exit_code = COULD_NOT_RUN


class HealthGroup(click.Group):
    """Every error of ``dpro health`` and its subcommands, options included, exits with 3."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as e:
            raise CouldNotRun(f"{e.format_message()} (see 'dpro health --help')") from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            raise CouldNotRun(f"{e.format_message()} (see 'dpro health --help')") from None
        except DproError as e:
            raise CouldNotRun(str(e)) from None
        except OSError as e:
            raise CouldNotRun(f"{e.strerror or e}: {e.filename}" if e.filename else str(e)) from None
        except click.ClickException as e:
            if isinstance(e, CouldNotRun) or e.exit_code == 0:
                raise
            raise CouldNotRun(e.format_message()) from None


DB_HELP = ("History database: any SQLAlchemy URL (default $DPRO_HEALTH_DB, else sqlite:///~/.local/share/dpro/health.db); "
           "postgresql://USER@HOST/DB for one several clusters share (pip install 'dpro-profiler[postgres]').")


def cluster_option(text: str) -> Any:
    return click.option("--cluster", envvar="DPRO_CLUSTER", metavar="NAME", help=text)


@click.group("health", cls=HealthGroup, invoke_without_command=True, context_settings=CONTEXT)
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for health.json, health.md and health.html (default: dpro-health-<time>).")
@click.option("--db", help=DB_HELP)
@cluster_option("This cluster's name in a history several clusters share (also $DPRO_CLUSTER): its runs are "
                "stored under it and judged against its own earlier nights.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="health.yaml: sizes, thresholds, a baseline file, a topology.")
@click.option("--time-budget", type=click.FloatRange(min=0, min_open=True), metavar="S",
              help="Seconds the check may measure (default: the config's time_budget_s, 600); what is left when "
                   "they run out is cut and said in the report.")
@click.option("--nproc", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Without a launcher: how many local processes to start.")
@click.option("--npd", is_flag=True, help="node-problem-detector mode: this node's GPU and NIC checks and its verdict "
              "in the newest run in the history, as one line; exit 0 OK, 1 problem, 2 unknown.")
@click.pass_context
def health(ctx: click.Context, out: Path | None, db: str | None, cluster: str | None, config_path: Path | None,
           time_budget: float | None, nproc: int, npd: bool) -> None:
    """Check this cluster's GPUs, NICs, collectives and host-to-host bandwidth, judge them
    against baselines, keep the run in the history and write the reports.

    \b
    Run on every node as a job:  torchrun --nnodes N --nproc-per-node 1 ... --no-python dpro health
                                 srun --ntasks-per-node 1 dpro health   (MASTER_ADDR, MASTER_PORT exported)
    or alone on one machine:     dpro health   (starts --nproc local processes)
    Exit code: 0 healthy, 1 degraded, 2 failed, 3 could not run.
    """
    if ctx.invoked_subcommand is not None:
        return
    from dpro.anomaly.health.config import load_config
    from dpro.anomaly.health.job import launcher_env

    config = load_config(config_path)
    if time_budget is not None:
        config = dataclasses.replace(config, time_budget_s=time_budget)
    if npd:
        from dpro.anomaly.health.npd import node_problem

        code, line = node_problem(db)
        click.echo(line)
        ctx.exit(code)
    if launcher_env() is None:
        from dpro.anomaly.health.launch import run_locally

        _preflight(out, db)  # the children would each fail alike, and later
        codes = run_locally(nproc, sys.argv[2:])
        ctx.exit(codes[0] if all(c in (0, 1, 2) for c in codes) else COULD_NOT_RUN)
    ctx.exit(_run_as_rank(config, out, db, cluster))


def _preflight(out: Path | None, db: str | None) -> None:
    """Fail before any rank starts when the report could not be written or the history opened."""
    from dpro.anomaly.health.history import History
    from dpro.anomaly.health.report import check_free

    if out is not None:
        check_free(out)
    History.open(db).engine.dispose()


def _run_as_rank(config: Any, out: Path | None, db: str | None, cluster: str | None) -> int:
    from dpro.anomaly.health.history import History
    from dpro.anomaly.health.job import launcher_env, run_rank
    from dpro.anomaly.health.report import check_free, summary, write_reports

    rank = int(launcher_env()["RANK"])
    history = None
    if rank == 0:  # fail before the job starts, not after it ran (the others then fail to join)
        out = out or Path(f"dpro-health-{time.strftime('%Y%m%d-%H%M%S')}")
        check_free(out)
        history = History.open(db, cluster=cluster)
    try:
        report, code = run_rank(config, history.values if history else None)
        if report is None:
            return code
        paths = write_reports(report, out, history.values if history else None)
        run_id = history.add(report)
    finally:
        if history is not None:
            history.engine.dispose()
    click.echo(f"dpro health: {summary(report)}")
    click.echo(f"report: {paths['markdown']}, {paths['json']}, {paths['html']}; history run {run_id}", err=True)
    return code


@health.command("history")
@click.option("--db", help=DB_HELP)
@cluster_option("Only this cluster's runs (also $DPRO_CLUSTER; default: every cluster's).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--nights", default=15, show_default=True, type=click.IntRange(2, 1000),
              help="How many runs to show at least (the newest and the ones before it); the baseline always "
                   "takes the rules' number of earlier nights.")
@click.option("--host", help="Only this host.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="health.yaml whose rules flag regressions (default: the rules the newest run was judged by).")
def history_command(db: str | None, cluster: str | None, as_json: bool, nights: int, host: str | None,
                    config_path: Path | None) -> None:
    """Trends per node over the last nights, regressions against earlier nights flagged.
    Exit code 1 when the newest run regressed, 0 when not."""
    from dpro.anomaly.health.config import load_config
    from dpro.anomaly.health.history import History
    from dpro.anomaly.health.trends import newest_trends

    rules = load_config(config_path).rules if config_path is not None else None
    with History.open(db, cluster=cluster) as history:
        _, found = newest_trends(history, rules, nights, host)
    if as_json:
        click.echo(json.dumps(found, indent=1))
    else:
        _print_trends(found)
    sys.exit(1 if found["regressions"] else 0)


def _print_trends(found: dict[str, Any]) -> None:
    from dpro.anomaly.health.trends import beyond

    runs = found["runs"]
    if not runs:
        click.echo("No run in the history yet.")
        return
    click.echo(f"{len(runs)} runs, {runs[0]['started']} to {runs[-1]['started']}: "
               + " ".join(r["verdict"] for r in runs))
    for host, rows in found["nodes"].items():
        click.echo(f"\n{host}")
        for key, row in rows.items():
            values = " ".join(f"{v:.3g}" for v in row["values"])
            change = f"{row['worse_pct']:+.1f}% worse{beyond(row)}" if row["worse_pct"] is not None else ""
            flag = "  <-- " + row["status"].upper() if row["status"].startswith("regression") else ""
            click.echo(f"  {key:<40} {values:<40} {change}{flag}")
    if found["regressions"]:
        click.echo(f"\n{len(found['regressions'])} regressions in the newest run:")
        for r in found["regressions"]:
            click.echo(f"  {r['host']} {r['metric']}: {r['value']:.4g} vs {r['baseline']:.4g} "
                       f"({r['worse_pct']:+.1f}%{beyond(r)})")
