"""The ``dpro`` command line: thin commands over the library, one module per command group.

Commands are imported only when they run (or when ``--help`` lists them): this module names
them, :class:`LazyGroup` imports the one asked for. A command parses its arguments, opens the
run once (:class:`dpro.analysis.RunAnalysis`), calls the library and prints; heavy libraries
are imported inside the command's function, never at module level.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import click

from dpro import __version__
from dpro.errors import DproError, PartialRunWarning

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class OneLineUsageError(click.ClickException):
    """A command's :class:`click.UsageError` as one line naming its ``--help``."""

    exit_code = 2

    def __init__(self, error: click.UsageError) -> None:
        where = f" (see '{error.ctx.command_path} --help')" if error.ctx else ""
        super().__init__(error.format_message() + where)


class LazyGroup(click.Group):
    """A group whose commands live in other modules, imported on first use.

    ``lazy`` maps a command name to ``"module:attribute"``. Expected failures of any command
    (:class:`~dpro.errors.DproError`, and files that cannot be read) become one-line errors
    with exit code 1, never a traceback; a command's bad options, one-line errors with exit
    code 2.
    """

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            module, attribute = self.lazy[name].split(":")
            return getattr(importlib.import_module(module), attribute)
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _show_warning
                return super().invoke(ctx)
        except click.UsageError as e:  # a command's bad option: one line too, and exit code 2
            raise OneLineUsageError(e) from None
        except DproError as e:
            raise click.ClickException(str(e)) from None
        except OSError as e:
            raise click.ClickException(f"{e.strerror or e}: {e.filename}" if e.filename else str(e)) from None


def _show_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """dpro's own warnings (a partial run) as one ``Warning:`` line on stderr; others as Python shows them."""
    if issubclass(category, PartialRunWarning):
        click.echo(f"Warning: {message}", err=True)
    else:
        _SHOW_WARNING(message, category, *args, **kwargs)


_SHOW_WARNING = warnings.showwarning


@click.group(cls=LazyGroup, context_settings=CONTEXT, lazy={
    "record": "dpro.cli.record:record",
    "demo": "dpro.cli.demo:demo",
    "merge": "dpro.cli.record:merge",
    "info": "dpro.cli.info:info",
    "replay": "dpro.cli.replay:replay",
    "whatif": "dpro.cli.whatif:whatif",
    "optimize": "dpro.cli.optimize:optimize",
    "tune": "dpro.cli.optimize:tune",
    "compare": "dpro.cli.compare:compare",
    "critical-path": "dpro.cli.replay:critical_path",
    "diagnose": "dpro.cli.diagnose:diagnose",
    "anomaly": "dpro.cli.anomaly:anomaly",
    "dashboard": "dpro.cli.dashboard:dashboard",
    "health": "dpro.cli.health:health",
})
@click.version_option(__version__, "-V", "--version", prog_name="dpro")
def main() -> None:
    """Profile distributed PyTorch training and find what slows it down.

    Record a job with `dpro record -o RUN -- torchrun ... train.py`, then look at it with
    `dpro info RUN`, `dpro replay RUN`, `dpro critical-path RUN` and `dpro diagnose RUN`.
    `dpro demo` records a small example job on 2 local ranks.
    """
