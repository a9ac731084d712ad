"""Overview: step time per rank and step (measured, and the replay's prediction), where each
rank's step goes (the critical path's categories), the slowest rank."""

from __future__ import annotations

from typing import Any

from dash import html

from dpro.optimizer.report_html import breakdown_figure

from dpro.dashboard.figures import step_figure
from dpro.dashboard.pages.common import figure, missing, table
from dpro.dashboard.runs import RunView

__all__ = ["layout"]


def layout(view: RunView, views: list[RunView]) -> Any:
    analysis = view.analysis
    medians = {r: v / 1e6 for r, v in analysis.unprofiled_step_ns.items() if v == v}
    labels = {r: view.label(r) for r in analysis.ranks}
    parts: list[Any] = [html.H2(f"Overview: {view.name}"),
                        html.P(f"{len(analysis.ranks)} ranks on {len(set(analysis.hosts.values()))} host(s); "
                               f"run directory {analysis.root}")]
    if medians:
        slowest = max(medians, key=medians.get)
        parts.append(html.P([html.B("Slowest rank: "), f"{labels[slowest]}, median step {medians[slowest]:.2f} ms "
                             "(outside the profiling window)"], id="slowest-rank"))
    if view.gaps:
        parts.append(html.P([html.B("Partial run: "), "; ".join(view.gaps) + ". The pages show the ranks there are."],
                            id="partial-run", style={"color": "#a94442", "background": "#f2dede", "padding": "6px"}))
    parts += [missing(m) for m in view.missing]
    if view.window["disturbed"]:
        parts.append(html.P([html.B("Disturbed profiling window: "), view.window["message"]], id="window-disturbed",
                            style={"color": "#8a6d3b", "background": "#fcf8e3", "padding": "6px"}))
    if not analysis.step_times.empty:
        parts.append(figure("overview-steps", step_figure(analysis.step_times, view.replayed_step_ms, labels)))
    if view.has_replay:
        shares = {labels[r]: b for r, b in view.breakdowns.items()}
        parts.append(figure("overview-breakdown", breakdown_figure(
            shares, "Where each rank's step goes (critical path of the replay, ms)")))
    rows = [[labels[r], medians.get(r), _ms(analysis.profiled_step_ns.get(r)), view.replayed_step_ms.get(r),
             *([view.breakdowns[r][c] for c in ("compute", "communication", "waiting", "launch_bound", "idle")]
               if r in view.breakdowns else ["-"] * 5)] for r in analysis.ranks]
    parts.append(table(["rank", "measured ms (unprofiled median)", "profiled ms", "replay ms", "compute",
                        "exposed comm.", "waiting", "launch-bound", "idle"], rows, id="overview-table"))
    return html.Div(parts)


def _ms(ns: float | None) -> float | None:
    return None if ns is None or ns != ns else ns / 1e6
