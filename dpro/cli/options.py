"""Arguments and options shared by several commands."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from dpro.errors import DproError


STRICT = "dpro.strict"  # ctx.meta's key: --strict was given


class RunDirectory(click.ParamType):
    """A run directory, opened (and checked) once: the command receives a
    :class:`dpro.run_format.Run`. A partial run (:attr:`~dpro.run_format.Run.gaps`) is a warning
    on stderr, or this parameter's error under ``--strict`` (:func:`strict_option`)."""

    name = "RUN"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from dpro.run_format import Run, open_run

        if isinstance(value, Run):
            return value
        try:
            run = open_run(value)
        except DproError as e:
            self.fail(str(e), param, ctx)
        say_gaps(run, strict=bool(ctx and ctx.meta.get(STRICT)))
        return run


RUN = RunDirectory()


def strict_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--strict`` (or ``$DPRO_STRICT=1``): a partial run is an error, not a warning. Eager, so
    that it is known when the run argument is opened."""

    def remember(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
        if value:
            ctx.meta[STRICT] = True

    return click.option("--strict", is_flag=True, is_eager=True, expose_value=False, callback=remember,
                        envvar="DPRO_STRICT",
                        help="Fail on a partial run (a rank of the job missing, without its metadata or trace, "
                             "or with a trace that cannot be decoded) instead of warning and analysing the ranks "
                             "there are.")(fn)


def say_gaps(run: Any, strict: bool, also: Sequence[str] = ()) -> None:
    """Warn on stderr that ``run`` is partial, naming what it lacks (its gaps, and ``also``: what
    the caller found, a trace that cannot be decoded); a one-line error if ``strict``."""
    gaps = [*run.gaps, *also]
    if not gaps:
        return
    text = f"partial run {run.root}: {'; '.join(gaps)}"
    if strict:
        raise DproError(f"{text} (--strict)")
    click.echo(f"Warning: {text}; analysing the ranks there are (--strict to refuse)", err=True)


def analysis_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--scheduler``, ``--workers`` and ``--strict``, for commands that analyse a run's traces."""
    fn = strict_option(fn)
    fn = click.option("--workers", type=click.IntRange(min=1),
                      help="Processes decoding traces at once (default: one per core).")(fn)
    return click.option("--scheduler", envvar="DPRO_SCHEDULER", metavar="ADDRESS",
                        help="Decode traces on this Dask distributed cluster (e.g. tcp://10.0.0.1:8786; "
                             "also $DPRO_SCHEDULER). Its workers must see the run at the same path.")(fn)


def open_analysis(run: Any, scheduler: str | None, workers: int | None, **options: Any) -> Any:
    """The run model of ``run``, with a progress bar on a terminal and none when piped, strict
    under ``--strict`` (a rank whose trace cannot be decoded is then an error, not a warning)."""
    from dpro.analysis import RunAnalysis

    ctx = click.get_current_context(silent=True)
    return RunAnalysis(run, scheduler=scheduler, workers=workers, progress=sys.stderr.isatty(),
                       strict=bool(ctx and ctx.meta.get(STRICT)), **options)


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
