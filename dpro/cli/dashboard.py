"""``dpro dashboard``: the web explorer of recorded runs and of the health check's history."""

from __future__ import annotations

import ipaddress
import logging
import socket
from pathlib import Path
from typing import Any

import click

from dpro.cli.options import RUN, analysis_options, open_analysis

LOCAL = "127.0.0.1"


@click.command()
@click.argument("runs", metavar="[RUN ...]", type=RUN, nargs=-1)
@click.option("--port", type=click.IntRange(1, 65535), default=8050, show_default=True)
@click.option("--host", default=LOCAL, show_default=True,
              help="Address to listen on. Anything but loopback exposes the runs to the network (a warning says so); "
                   "to reach a remote dashboard, keep it local and forward the port: ssh -L 8050:localhost:8050 HOST.")
@click.option("--report", type=click.Path(exists=True, path_type=Path), metavar="DIR",
              help="An optimizer report (dpro optimize RUN -o DIR) for the first run.")
@click.option("--probes", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Pairwise probe results for the Diagnosis page (as dpro diagnose takes them).")
@click.option("--topology", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Fabric topology for the Diagnosis page (as dpro diagnose takes it).")
@click.option("--health-db", metavar="URL",
              help="The history of dpro health (any SQLAlchemy URL, e.g. sqlite:////var/lib/dpro/health.db), "
                   "read once, never written: adds the Health page, the only one when no RUN is given.")
@analysis_options
def dashboard(runs: tuple[Any, ...], port: int, host: str, report: Path | None, probes: Path | None,
              topology: Path | None, health_db: str | None, scheduler: str | None, workers: int | None) -> None:
    """Explore RUN (several: the first is shown, the others are picked or compared) and the
    health check's history (--health-db) in a browser."""
    if not runs and health_db is None:
        raise click.UsageError("give a RUN, or --health-db URL to see the health history alone")
    given = [f"--{name}" for name, value in (("report", report), ("probes", probes), ("topology", topology)) if value]
    if given and not runs:
        raise click.UsageError(f"{given[0]} goes with a RUN: give the run it belongs to")
    from dpro.dashboard.app import make_app
    from dpro.dashboard.health_history import HealthView
    from dpro.dashboard.runs import Extras, RunView

    if not _is_loopback(host):
        click.echo(f"Warning: listening on {host}: anyone who can reach this machine can read these runs. "
                   "Prefer --host 127.0.0.1 and ssh -L to reach it.", err=True)
    _check_port(host, port)
    health = HealthView.read(health_db) if health_db is not None else None
    views = []
    for i, run in enumerate(runs):
        extras = Extras(report=report if i == 0 else None, probes=probes, topology=topology)
        click.echo(f"loading {run.root} ...", err=True)
        views.append(RunView(open_analysis(run, scheduler, workers), extras).prepare())
    app = make_app(views, health)
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"dpro dashboard: http://{shown}:{port}/  (Ctrl+C stops it)", err=True)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    app.run(host=host, port=port, debug=False)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _check_port(host: str, port: int) -> None:
    """A one-line error, before loading anything, when the port cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror}") from None
