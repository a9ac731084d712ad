"""The Dash app: a page per view of the runs (Overview, Timeline, What-if, Diagnosis), a run
picker when several runs are open, and the pages' callbacks; given the health check's history,
a Health page too (each night's verdict per node, trends and regressions, the last night's
matrix and suspects), which is the only page, and ``/``, when no run is open.

    >>> app = make_app([RunView(RunAnalysis.open("run1")).prepare()])    # doctest: +SKIP
    >>> app = make_app([], HealthView.read("sqlite:////var/lib/dpro/health.db"))  # doctest: +SKIP
    >>> app.run(host="127.0.0.1", port=8050)                            # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, dcc, html

from dpro.dashboard.health_history import HealthView
from dpro.dashboard.pages import diagnosis, health as health_page, overview, timeline, whatif
from dpro.dashboard.runs import RunView

__all__ = ["HEALTH", "PAGES", "make_app"]

PAGES = {"/": ("Overview", overview), "/timeline": ("Timeline", timeline), "/whatif": ("What-if", whatif),
         "/diagnosis": ("Diagnosis", diagnosis)}
HEALTH = "/health"


def make_app(views: list[RunView], health: HealthView | None = None) -> Dash:
    """The app over ``views`` (each :meth:`RunView.prepare`\\ d) and the ``health`` history, if any."""
    app = Dash(__name__, title="dpro dashboard", suppress_callback_exceptions=True, update_title=None)
    titles = {path: title for path, (title, _) in PAGES.items()} if views else {}
    if health is not None:
        titles[HEALTH] = "Health"
    links = [dcc.Link(title, href=path, id=f"nav-{title.lower().replace('-', '')}", style={"marginRight": "16px"})
             for path, title in titles.items()]
    picker = dcc.Dropdown(id="run", options=[{"label": v.name, "value": i} for i, v in enumerate(views)],
                          value=0 if views else None, clearable=False,
                          style={"width": "320px", "display": "inline-block" if len(views) > 1 else "none",
                                 "verticalAlign": "middle"})
    app.layout = html.Div([
        dcc.Location(id="url"),
        html.Div([html.B("dpro", style={"marginRight": "20px"}), *links, picker],
                 style={"padding": "8px 12px", "borderBottom": "1px solid #ddd"}),
        html.Div(id="page", style={"padding": "0 12px"}),
    ], style={"fontFamily": "sans-serif"})

    @app.callback(Output("page", "children"), Input("url", "pathname"), Input("run", "value"))
    def page(path: str | None, run: int | None) -> Any:
        if health is not None and (path == HEALTH or not views):
            return health_page.layout(health)
        _, module = PAGES.get(path or "/", PAGES["/"])
        return module.layout(views[run], views)

    if views:
        for _, module in PAGES.values():
            if hasattr(module, "register"):
                module.register(app, views)
    if health is not None:
        health_page.register(app, health)
    return app
