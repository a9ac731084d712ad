"""Health: the nightly health check's history (``--health-db``): each night's verdict per node,
a metric's trend per node with the newest night's regressions marked, and the newest night's
pairwise matrix and suspects."""

from __future__ import annotations

from typing import Any

from dash import Input, Output, dcc, html

from dpro.anomaly.health.trends import beyond
from dpro.dashboard.figures import heatmap_figure, trend_figure, verdict_figure
from dpro.dashboard.health_history import HealthView
from dpro.dashboard.pages.common import figure, missing, table

__all__ = ["layout", "register"]


def layout(health: HealthView) -> Any:
    parts: list[Any] = [html.H2(f"Health: {health.name}")]
    if not health.runs:
        return html.Div([*parts, html.P("No run in the history yet.", id="health-summary")])
    nights, newest = health.nights, health.runs[0]
    parts += [html.P(f"{len(nights)} nights, {health.runs[-1]['started']} to {newest['started']}; the last night: "
                     f"{newest['verdict']}.", id="health-summary"),
              figure("health-verdicts", verdict_figure(nights, ["run", *health.hosts], health.verdicts())),
              html.H3("Trends")]
    metric = health.default_metric
    if metric is None:
        parts.append(missing("trends: no night measured a metric with a baseline"))
    else:
        parts += [dcc.Dropdown(id="health-metric", options=list(health.metrics), value=metric, clearable=False,
                               style={"width": "420px"}),
                  figure("health-trend", _trend(health, metric))]
    parts += [html.H3("Regressions in the last night"), _regressions(health),
              html.H3("The last night's pairwise matrix")]
    matrix = health.matrix
    if matrix is None:
        parts.append(missing("pairwise matrix: the last night measured none (one host)"))
    else:
        parts.append(figure("health-matrix", heatmap_figure(*matrix, "Pairwise bandwidth (row sends to column)",
                                                            "Gb/s")))
    parts.append(html.H3("The last night's suspects"))
    if health.suspects:
        rows = [[i, s["kind"], s["name"], s["host"], s["score"], ", ".join(f"{k}={v}" for k, v in s["evidence"].items())]
                for i, s in enumerate(health.suspects, 1)]
        parts.append(table(["#", "kind", "name", "host", "score", "evidence"], rows, id="health-suspects"))
    else:
        parts.append(html.P("Nothing stands out: the matrix names no host, NIC or link.", id="health-suspects"))
    return html.Div(parts)


def register(app: Any, health: HealthView) -> None:
    @app.callback(Output("health-trend", "figure"), Input("health-metric", "value"), prevent_initial_call=True)
    def redraw(metric: str) -> Any:
        return _trend(health, metric)


def _trend(health: HealthView, metric: str) -> Any:
    better = "higher" if health.metrics[metric] else "lower"
    flagged = {r["host"]: f"{r['value']:.4g}, {r['worse_pct']:+.1f}% worse than its baseline {r['baseline']:.4g}"
                          + beyond(r) for r in health.regressions if r["metric"] == metric}
    return trend_figure(health.nights, health.series(metric), f"{metric} per node ({better} is better; "
                        "×: a regression in the last night)", flagged)


def _regressions(health: HealthView) -> Any:
    if not health.regressions:
        return html.P("None: no node's last night is worse than the nights before it.", id="health-regressions")
    rows = [[r["host"], r["metric"], r["value"], r["baseline"], f"{r['worse_pct']:+.1f}%{beyond(r)}"]
            for r in health.regressions]
    return table(["node", "metric", "last night", "baseline (earlier nights)", "worse by"], rows,
                 id="health-regressions")
