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

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpro.analysis.run import RunAnalysis
from dpro.analysis.whatif import Change, Prediction
from dpro.replayer.breakdown import CATEGORIES, breakdown

from dpro.optimizer.strategy import Strategy

__all__ = ["SHOWN", "write_html"]

SHOWN = 4  # strategies beside the recorded configuration
COLORS = {"compute": "#4c78a8", "communication": "#e45756", "waiting": "#f58518", "launch_bound": "#b279a2",
          "idle": "#bab0ac"}
KIND_COLORS = {"cpu": "#4c78a8", "gpu": "#54a24b", "collective": "#e45756", "transfer": "#f58518"}


def write_html(analysis: RunAnalysis, data: dict[str, Any], path: Path, shown: int = SHOWN) -> None:
    """Write the report of :func:`dpro.optimizer.report.report`'s ``data`` for ``analysis`` to
    ``path``: the recorded configuration and the ``shown`` best strategies that change it."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    chosen = [("recorded", Change())] + [(s["name"], Strategy(s["apply"]).change())
                                         for s in data["strategies"] if s["apply"]][:shown]
    predictions = [(name, Prediction.of(analysis, change)) for name, change in chosen]

    split = go.Figure()
    labels = [name if name == "recorded" else f"{name} (predicted)" for name, _ in predictions]
    shares = [_breakdown(p) for _, p in predictions]
    for category in CATEGORIES:
        split.add_trace(go.Bar(y=labels, x=[s[category] for s in shares], name=category.replace("_", "-"),
                               orientation="h", marker_color=COLORS[category]))
    split.update_layout(barmode="stack", title="Where the step goes (critical path, ms, mean over ranks)",
                        xaxis_title="ms", yaxis={"autorange": "reversed"}, height=140 + 40 * len(labels))

    rank = min(analysis.graph.step_ns)
    rows = [("measured (the profiled window's typical step)", _measured(analysis, rank))]
    rows += [(f"predicted: {name}", _predicted(p, rank)) for name, p in predictions]
    lanes = sorted(set().union(*(set(r["lane"]) for _, r in rows)))
    timeline = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                             subplot_titles=[title for title, _ in rows])
    for i, (_, ops) in enumerate(rows, start=1):
        for kind, group in ops.groupby("kind", observed=True):
            timeline.add_trace(go.Bar(y=group["lane"], x=group["dur_ms"], base=group["start_ms"], orientation="h",
                                      name=str(kind), legendgroup=str(kind), showlegend=i == 1,
                                      marker_color=KIND_COLORS.get(str(kind), "#888"), hovertext=group["name"]),
                               row=i, col=1)
        timeline.update_yaxes(categoryorder="array", categoryarray=lanes, row=i, col=1)
    timeline.update_layout(barmode="overlay", title=f"Rank {rank}'s step, measured and predicted (ms)",
                           height=120 + len(rows) * (60 + 22 * len(lanes)))
    timeline.update_xaxes(title_text="ms from the step's start", row=len(rows), col=1)

    table = "".join(f"<tr><td>{s['name']}</td><td>{s['predicted_step_ms']:.1f}</td>"
                    f"<td>{s['predicted_speedup']:.2f}x</td><td>{'yes' if s['lossy'] else ''}</td></tr>"
                    for s in data["strategies"])
    path.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>dpro optimize</title></head><body>"
        f"<h1>dpro optimize: {analysis.root.name}</h1>"
        f"<p>Baseline: {data['baseline_step_ms']:.1f} ms per step (the median step outside the profiling window).</p>"
        "<table border='1' cellpadding='4'><tr><th>strategy</th><th>predicted ms</th><th>speed-up</th>"
        f"<th>lossy</th></tr>{table}</table>"
        + split.to_html(full_html=False, include_plotlyjs=True)
        + timeline.to_html(full_html=False, include_plotlyjs=False)
        + "<p>Timelines: replays, not anchored to the measured step time as the table's predictions are.</p>"
        "</body></html>")


def _breakdown(prediction: Prediction) -> dict[str, float]:
    parts = [breakdown(prediction.graph, prediction.replay, r) for r in sorted(prediction.graph.step_ns)]
    return {c: float(np.mean([p[f"{c}_ms"] for p in parts])) for c in CATEGORIES}


def _ops(nodes: pd.DataFrame, start_ns: np.ndarray, end_ns: np.ndarray, rank: int) -> pd.DataFrame:
    """``rank``'s ops (and its sends) with their lane, start and duration in ms from the
    earliest op of any rank."""
    mine = (nodes["rank"] == rank).to_numpy() & (end_ns > start_ns)
    origin = float(np.min(start_ns))
    return pd.DataFrame({"lane": nodes["resource"].astype(str).to_numpy()[mine],
                         "kind": nodes["kind"].astype(str).to_numpy()[mine],
                         "name": nodes["name"].astype(str).to_numpy()[mine],
                         "start_ms": (start_ns[mine] - origin) / 1e6, "dur_ms": (end_ns[mine] - start_ns[mine]) / 1e6})


def _measured(analysis: RunAnalysis, rank: int) -> pd.DataFrame:
    nodes = analysis.graph.nodes
    start = nodes["offset_ns"].to_numpy(np.float64)
    return _ops(nodes, start, start + nodes["dur_ns"].to_numpy(np.float64), rank)


def _predicted(prediction: Prediction, rank: int) -> pd.DataFrame:
    return _ops(prediction.graph.nodes, prediction.replay.start_ns, prediction.replay.end_ns, rank)
