"""The HTML pages dpro writes for people (``dpro optimize``'s ``report.html``, ``dpro health``'s
``health.html``): one stylesheet, plotly.js written once into a shared folder (named by its
version, so an upgrade writes a new one), nothing fetched from the network.

    >>> html = page("dpro health: healthy", "<p>...</p>", scripts=plotly_script(nights, tonight))   # doctest: +SKIP
"""

from __future__ import annotations

import os
from html import escape
from pathlib import Path
from typing import Any

from dpro.run_format import write_atomically

__all__ = ["STYLE", "figure_div", "page", "plotly_file", "plotly_script", "table"]

STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2328;
       max-width: 1200px; margin: 0 auto; padding: 16px 28px 48px; }
h1 { font-size: 22px; margin: 8px 0 12px; } h2 { font-size: 18px; margin: 28px 0 8px; }
.answer { border-left: 6px solid #1a7f37; background: #f0f7f2; padding: 10px 16px; margin: 8px 0 16px; }
.answer.keep { border-color: #6e7781; background: #f6f8fa; }
.answer.failed { border-color: #cf222e; background: #fff1f0; }
.answer.degraded { border-color: #bf8700; background: #fff8e5; }
.answer .headline { font-size: 19px; font-weight: 600; }
.muted { color: #59636e; } .lossy { color: #9a6700; font-weight: 600; }
code, pre { font: 13px ui-monospace, SFMono-Regular, Menlo, monospace; background: #f6f8fa; }
pre { padding: 8px 12px; white-space: pre-wrap; overflow-wrap: anywhere; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 14px; }
th, td { border-bottom: 1px solid #d0d7de; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.fail { color: #cf222e; font-weight: 600; } .warn { color: #9a6700; font-weight: 600; }
.pass { color: #1a7f37; } .skip, .nobaseline { color: #59636e; }
details > summary { cursor: pointer; color: #0969da; margin: 8px 0; }
"""


def page(title: str, body: str, scripts: str = "") -> str:
    """A whole page: ``title``, the stylesheet, ``scripts`` (in the head) and ``body``."""
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><style>{STYLE}</style>{scripts}"
            f"</head><body>{body}</body></html>")


def plotly_file() -> str:
    """``plotly-<version>.min.js``: the installed plotly's script, by name."""
    import plotly

    return f"plotly-{plotly.__version__}.min.js"


def plotly_script(assets: Path, folder: Path) -> str:
    """Write plotly.js into ``assets`` unless that version is there already (atomically: an
    interrupted write leaves none); the tag that loads it from a page in ``folder``."""
    path = assets / plotly_file()
    if not path.exists():
        from plotly.offline import get_plotlyjs

        assets.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda tmp: tmp.write_text(get_plotlyjs(), encoding="utf-8"))
    source = Path(os.path.relpath(path, folder)).as_posix()
    return f"<script src='{escape(source)}' charset='utf-8'></script>"


def figure_div(fig: Any) -> str:
    """A plotly figure as a ``<div>`` drawn by the page's plotly.js (:func:`plotly_script`)."""
    return fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False})


def table(header: list[str], rows: list[list[str]], numeric: tuple[int, ...] = ()) -> str:
    """An HTML table of already escaped cells; the columns in ``numeric`` right-aligned."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td class='num'>{c}</td>" if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"
