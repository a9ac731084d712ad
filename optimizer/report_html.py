"""``report.html``: where the recorded step goes, and the strategies' predicted timelines beside
the measured one (plotly, self-contained: it opens without a network).

- **Where the step goes**: the critical path of the recorded step's replay and of each shown
  strategy's, split into compute, exposed communication, waiting for other ranks, launch-bound
  and idle time (:func:`dpro.replayer.breakdown.breakdown`, the mean over ranks).
- **Timelines** of the lowest rank: its ops as the profiled window measured them (the typical
  step), then as each shown strategy's replay predicts them. Replays are not anchored to the
  measured step time as the predicted step times in the table are; their spans can differ.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

import pandas as pd

from dpro.analysis.run import RunAnalysis
from dpro.analysis.step_ops import measured_ops, predicted_ops
from dpro.analysis.whatif import Prediction
from dpro.replayer.breakdown import CATEGORIES, mean_breakdown


__all__ = ["SHOWN", "breakdown_figure", "speedups", "step_timeline_figure", "write_html"]

SHOWN = 4  # strategies beside the recorded configuration
COLORS = {"compute": "#4c78a8", "communication": "#e45756", "waiting": "#f58518", "launch_bound": "#b279a2",
          "idle": "#bab0ac"}
KIND_COLORS = {"cpu": "#4c78a8", "gpu": "#54a24b", "collective": "#e45756", "transfer": "#f58518"}


def write_html(analysis: RunAnalysis, data: dict[str, Any], recorded: Prediction, replayed: dict[str, Prediction],
               path: Path, shown: int = SHOWN) -> None:
    """Write the report of :func:`dpro.optimizer.report.report`'s ``data`` for ``analysis`` to
    ``path``: the recorded configuration and the ``shown`` first lines that change it, each
    drawn from the search's own prediction (``recorded``, ``replayed`` by name): nothing is
    predicted again."""
    chosen = [s["name"] for s in data["strategies"] + data["code_changes"] if s["apply"]][:shown]
    predictions = [("recorded", recorded)] + [(name, replayed[name]) for name in chosen]
    split = breakdown_figure({name if name == "recorded" else f"{name} (predicted)": mean_breakdown(p.graph, p.replay)
                              for name, p in predictions},
                             "Where the step goes (critical path, ms, mean over ranks)")
    rank = min(analysis.graph.step_ns)
    rows = [("measured (the profiled window's typical step)", measured_ops(analysis.graph, rank))]
    rows += [(f"predicted: {name}", predicted_ops(p.graph, p.replay, rank)) for name, p in predictions]
    timeline = step_timeline_figure(rows, f"Rank {rank}'s step, measured and predicted (ms)")

    verdict = data["recommendation"]
    answer = (f"<p><b>Recommended: {escape(verdict['name'])}</b>, {escape(verdict['why'])}.</p>"
              if verdict["verdict"] == "change" else f"<p><b>Keep the job as it is</b>: {escape(verdict['why'])}.</p>")
    path.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>dpro optimize</title></head><body>"
        f"<h1>dpro optimize: {escape(analysis.root.name)}</h1>{answer}"
        f"<p>Baseline: {data['baseline_step_ms']:.1f} ms per step (the median step outside the profiling window). "
        "Intervals: 90% of the cost model's held-out errors per family of change.</p>"
        + _table(data["strategies"])
        + ("<h2>Code changes (never recommended)</h2>" + _table(data["code_changes"]) if data["code_changes"] else "")
        + split.to_html(full_html=False, include_plotlyjs=True)
        + timeline.to_html(full_html=False, include_plotlyjs=False)
        + "<p>Timelines: replays, not anchored to the measured step time as the table's predictions are.</p>"
        "</body></html>")


def speedups(s: dict[str, Any]) -> str:
    """``1.23x (1.10-1.31x)``: the predicted speed-up and its 90% interval."""
    shown = f"{s['predicted_speedup']:.2f}x"
    return shown + ("" if s["speedup_interval"] is None else
                    f" ({s['speedup_interval'][0]:.2f}-{s['speedup_interval'][1]:.2f}x)")


def _table(entries: list[dict[str, Any]]) -> str:
    rows = "".join(f"<tr><td>{escape(s['name'])}</td><td>{s['predicted_step_ms']:.1f}</td><td>{escape(speedups(s))}</td>"
                   f"<td>{s['status']}</td><td>{'yes' if s['lossy'] else ''}</td>"
                   f"<td>{escape(', '.join(s['equivalents']))}</td></tr>" for s in entries)
    return ("<table border='1' cellpadding='4'><tr><th>strategy</th><th>predicted ms</th>"
            f"<th>speed-up (90% interval)</th><th>status</th><th>lossy</th><th>also</th></tr>{rows}</table>")


def breakdown_figure(shares: dict[str, dict[str, float]], title: str) -> Any:
    """Stacked bars of the critical path's categories (ms), one bar per label."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for category in CATEGORIES:
        fig.add_trace(go.Bar(y=list(shares), x=[s[category] for s in shares.values()], name=category.replace("_", "-"),
                             orientation="h", marker_color=COLORS[category]))
    fig.update_layout(barmode="stack", title=title, xaxis_title="ms", yaxis={"autorange": "reversed"},
                      height=140 + 40 * len(shares))
    return fig


def step_timeline_figure(rows: list[tuple[str, pd.DataFrame]], title: str) -> Any:
    """A typical step per row (:mod:`dpro.analysis.step_ops`' tables), sharing the time axis."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    lanes = sorted(set().union(*(set(r["lane"]) for _, r in rows)))
    fig = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[name for name, _ in rows])
    for i, (_, ops) in enumerate(rows, start=1):
        for kind, group in ops.groupby("kind", observed=True):
            fig.add_trace(go.Bar(y=group["lane"], x=group["dur_ms"], base=group["start_ms"], orientation="h",
                                 name=str(kind), legendgroup=str(kind), showlegend=i == 1,
                                 marker_color=KIND_COLORS.get(str(kind), "#888"), hovertext=group["name"]),
                          row=i, col=1)
        fig.update_yaxes(categoryorder="array", categoryarray=lanes, row=i, col=1)
    fig.update_layout(barmode="overlay", title=title, height=120 + len(rows) * (60 + 22 * len(lanes)))
    fig.update_xaxes(title_text="ms from the step's start", row=len(rows), col=1)
    return fig
