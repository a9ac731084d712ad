"""Timeline: a lane per rank and thread or stream, ops coloured by kind, collectives linked
across ranks, the critical path outlined; zoom and pan with the level of detail computed on the
server (:mod:`dpro.dashboard.timeline_data`); click an op for its details; the visible window as a
Chrome trace for Perfetto."""

from __future__ import annotations

from typing import Any

import numpy as np
from dash import Input, Output, State, dcc, html, no_update

from dpro.dashboard.details import chrome_trace, op_details
from dpro.dashboard.figures import timeline_figure
from dpro.dashboard.pages.common import missing, table
from dpro.dashboard.runs import RunView
from dpro.dashboard.timeline_data import window

__all__ = ["layout", "register"]

RANKS_SHOWN = 8  # ranks on the timeline when the page opens
OVERLAYS = ["critical path", "collective links"]


def layout(view: RunView, views: list[RunView]) -> Any:
    if not view.has_replay:
        return html.Div([html.H2(f"Timeline: {view.name}"), missing(view.no_replay)])
    lanes = view.lanes
    ranks = sorted(set(lanes.lane_rank.tolist()))
    shown = ranks[:RANKS_SHOWN]
    full = [0.0, float(lanes.end_ns)]
    fig, status = _draw(view, full, shown, OVERLAYS)
    return html.Div([
        html.H2(f"Timeline: {view.name}"),
        html.Div([
            html.Label("Ranks "),
            dcc.Dropdown(id="timeline-ranks", options=[{"label": view.label(r), "value": r} for r in ranks], value=shown,
                         multi=True, style={"minWidth": "300px", "display": "inline-block", "verticalAlign": "middle"}),
            dcc.Checklist(id="timeline-overlays", options=OVERLAYS, value=OVERLAYS, inline=True,
                          style={"display": "inline-block", "margin": "0 12px"}),
            html.Button("Open this window in Perfetto", id="perfetto"),
            dcc.Download(id="perfetto-download"),
            html.Span(id="perfetto-status", style={"color": "#555", "marginLeft": "8px"}),
        ]),
        html.Div(status, id="timeline-status", style={"color": "#555", "margin": "4px 0"}),
        dcc.Store(id="timeline-window", data=full),
        dcc.Graph(id="timeline", figure=fig, config={"displaylogo": False, "scrollZoom": True}),
        html.Div("Click an op for its details.", id="op-details"),
    ])


def register(app: Any, views: list[RunView]) -> None:
    @app.callback(Output("timeline", "figure"), Output("timeline-status", "children"),
                  Output("timeline-window", "data"),
                  Input("timeline", "relayoutData"), Input("timeline-ranks", "value"),
                  Input("timeline-overlays", "value"), State("timeline-window", "data"), State("run", "value"),
                  prevent_initial_call=True)
    def redraw(relayout: dict | None, ranks: list[int], overlays: list[str], current: list[float], run: int):
        view = views[run]
        t0t1 = _window_of(relayout, current, [0.0, float(view.lanes.end_ns)])
        fig, status = _draw(view, t0t1, ranks or [], overlays or [])
        return fig, status, t0t1

    @app.callback(Output("op-details", "children"), Input("timeline", "clickData"), State("run", "value"),
                  prevent_initial_call=True)
    def details(click: dict | None, run: int):
        points = (click or {}).get("points") or []
        if not points or points[0].get("customdata") is None:
            return no_update
        op = int(points[0]["customdata"])
        if op < 0:
            return html.P("Several ops merged at this zoom: zoom in to see each of them.")
        view = views[run]
        return _details_view(op_details(view.analysis, view.lanes, op, view.occurrence, view.critical))

    @app.callback(Output("perfetto-download", "data"), Output("perfetto-status", "children"),
                  Input("perfetto", "n_clicks"), State("timeline-window", "data"), State("timeline-ranks", "value"),
                  State("run", "value"), prevent_initial_call=True)
    def export(_: int, t0t1: list[float], ranks: list[int], run: int):
        view = views[run]
        try:
            data = chrome_trace(view.lanes, t0t1[0], t0t1[1], _lanes_of(view, ranks or []))
        except ValueError as e:
            return no_update, str(e)
        name = f"{view.name}-{t0t1[0] / 1e6:.3f}-{t0t1[1] / 1e6:.3f}ms.json"
        return dcc.send_bytes(data, name), f"Saved {name}: open it at ui.perfetto.dev (Open trace file)."


def _draw(view: RunView, t0t1: list[float], ranks: list[int], overlays: list[str]) -> tuple[Any, str]:
    lanes = view.lanes
    shown = _lanes_of(view, ranks)
    shapes = window(lanes, t0t1[0], t0t1[1], shown=shown)
    fig = timeline_figure(lanes, shapes, shown, view.critical if "critical path" in overlays else None,
                          view.links if "collective links" in overlays else None)
    how = (f"merged where closer than {shapes.pixel_ns / 1e3:.1f} µs (zoom in for every op)" if shapes.merged
           else "every op shown")
    return fig, (f"{shapes.visible:,} ops in view on {len(shown)} lanes; {len(shapes.shapes):,} shapes sent, {how}. "
                 "Outlined in red: the critical path of the replay.")


def _lanes_of(view: RunView, ranks: list[int]) -> np.ndarray:
    return np.flatnonzero(np.isin(view.lanes.lane_rank, ranks))


def _window_of(relayout: dict | None, current: list[float], full: list[float]) -> list[float]:
    """The window in ns a plotly relayout event asks for (ms on the axis)."""
    relayout = relayout or {}
    if relayout.get("xaxis.autorange"):
        return full
    if "xaxis.range[0]" in relayout:
        return [float(relayout["xaxis.range[0]"]) * 1e6, float(relayout["xaxis.range[1]"]) * 1e6]
    if "xaxis.range" in relayout:
        return [float(v) * 1e6 for v in relayout["xaxis.range"]]
    return current


def _details_view(d: dict[str, Any]) -> Any:
    path = d["critical_path"]
    rows = [["name", d["name"]], ["kind", d["kind"]], ["lane", d["lane"]], ["step", d["step"]],
            ["start (ms)", f"{d['start_ms']:.3f}"], ["duration (ms)", f"{d['duration_ms']:.4f}"],
            ["input shapes", d["shapes"] or "not recorded"],
            ["critical path", f"node {path['position'] + 1} of {path['length']}" if path else "not on it"]]
    rows += [[f"collective {k}", v] for k, v in (d.get("collective") or {}).items()]
    steps = [[s["step"], f"{s['duration_ms']:.4f}"] for s in d["across_steps"]]
    return html.Div([html.H4(f"{d['name']} ({d['lane']})", id="op-title"), table(None, rows, id="op-table"),
                     html.P(f"The same op (occurrence {d['occurrence']} of its name on this lane) in every profiled step:"),
                     table(["step", "duration (ms)"], steps, id="op-steps")])
