"""Arguments and options shared by several commands."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from dpro.errors import DproError


class RunDirectory(click.ParamType):
    """A run directory, opened (and checked) once: the command receives a
    :class:`dpro.run_format.Run`."""

    name = "RUN"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from dpro.run_format import Run, open_run

        if isinstance(value, Run):
            return value
        try:
            return open_run(value)
        except DproError as e:
            self.fail(str(e), param, ctx)


RUN = RunDirectory()


def analysis_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--scheduler`` and ``--workers``, for commands that analyse a run's traces."""
    fn = click.option("--workers", type=click.IntRange(min=1),
                      help="Processes decoding traces at once (default: one per core).")(fn)
    return click.option("--scheduler", envvar="DPRO_SCHEDULER", metavar="ADDRESS",
                        help="Decode traces on this Dask distributed cluster (e.g. tcp://10.0.0.1:8786; "
                             "also $DPRO_SCHEDULER). Its workers must see the run at the same path.")(fn)


def open_analysis(run: Any, scheduler: str | None, workers: int | None, **options: Any) -> Any:
    """The run model of ``run``, with a progress bar on a terminal and none when piped."""
    from dpro.analysis import RunAnalysis

    return RunAnalysis(run, scheduler=scheduler, workers=workers, progress=sys.stderr.isatty(), **options)


def default_run_name(prefix: str) -> Path:
    """``PREFIX-DATE-TIME``: where a command records when not told."""
    import time

    return Path(f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}")


def ms(value: float | None) -> str:
    """Milliseconds with two decimals, ``-`` for none."""
    return "-" if value is None else f"{value:.2f}"


def table(rows: list[tuple[str, ...]]) -> str:
    """Rows of text as left-aligned columns (the first row is the header)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)
