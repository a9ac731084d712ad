"""Small pieces every page uses."""

from __future__ import annotations

from typing import Any

from dash import dcc, html

__all__ = ["figure", "missing", "table"]


def missing(text: str) -> html.Div:
    """A note that a part of the run is missing, where that part would be."""
    return html.Div(f"Missing: {text}", className="missing", style={"color": "#8a6d3b", "background": "#fcf8e3",
                                                                     "padding": "6px 10px", "margin": "6px 0"})


def table(header: list[str] | None, rows: list[list[Any]], id: str | None = None) -> html.Table:
    """A plain HTML table (``header`` None: none)."""
    style = {"border": "1px solid #ddd", "padding": "3px 8px", "textAlign": "left"}
    head = [html.Thead(html.Tr([html.Th(h, style=style) for h in header]))] if header else []
    return html.Table([*head, html.Tbody([html.Tr([html.Td(_text(c), style=style) for c in row]) for row in rows])],
                      style={"borderCollapse": "collapse", "margin": "8px 0"}, **({"id": id} if id else {}))


def figure(id: str, fig: Any) -> dcc.Graph:
    return dcc.Graph(id=id, figure=fig, config={"displaylogo": False})


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)
