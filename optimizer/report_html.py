"""``report.html``: the answer first, then the strategies, where the step goes and the timelines;
a page for reading (one stylesheet, :mod:`dpro.html_report`), its figures drawn by the plotly.js
written once beside it, nothing fetched from the network.

- **The answer** (:func:`dpro.optimizer.report_text.headline`): the recommended change or
  "keep", its predicted step and interval beside the measured one, lossy or exact, why, the
  ``--apply`` command and the code change; the measured trials, if any.
- **The strategies**: the :data:`~dpro.optimizer.report_text.TOP` distinct lines with their
  predicted step and 90% interval against the baseline (a chart and a table), every line
  behind a toggle.
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
from dpro.html_report import figure_div, page, plotly_script, table
from dpro.replayer.breakdown import CATEGORIES

from dpro.optimizer.report_text import (APART, SHOWN, TOP, apply_command, appliable, breakdown_rows, folded, headline,
                                        keep_hint, speedups)

__all__ = ["breakdown_figure", "interval_figure", "step_timeline_figure", "write_html"]

COLORS = {"compute": "#4c78a8", "communication": "#e45756", "waiting": "#f58518", "launch_bound": "#b279a2",
          "idle": "#bab0ac"}
KIND_COLORS = {"cpu": "#4c78a8", "gpu": "#54a24b", "collective": "#e45756", "transfer": "#f58518"}
HEADER = ["#", "strategy", "predicted ms", "speed-up (90% interval)", "status", "memory GB", "lossy", "stands for"]


def write_html(analysis: RunAnalysis, data: dict[str, Any], recorded: Prediction, replayed: dict[str, Prediction],
               path: Path, shown: int = SHOWN) -> None:
    """Write the report of :func:`dpro.optimizer.report.report`'s ``data`` (with its
    ``breakdowns``, :func:`dpro.optimizer.report.with_breakdowns`) for ``analysis`` to ``path``
    (plotly.js beside it): the timelines of the recorded configuration and of the ``shown``
    first lines that change it, drawn from the search's own predictions (``recorded``,
    ``replayed`` by name): nothing is predicted again."""
    chosen = [s["name"] for s in data["strategies"] + data["code_changes"] if s["apply"]][:shown]
    predictions = [("recorded", recorded)] + [(name, replayed[name]) for name in chosen]
    split = breakdown_figure({row[0]: breakdown for row, breakdown in zip(breakdown_rows(data), data["breakdowns"].values())},
                             "Where the step goes (critical path, ms, mean over ranks)")
    rank = min(analysis.graph.step_ns)
    rows = [("measured (the profiled window's typical step)", measured_ops(analysis.graph, rank))]
    rows += [(f"predicted: {name}", predicted_ops(p.graph, p.replay, rank)) for name, p in predictions]
    timeline = step_timeline_figure(rows, f"Rank {rank}'s step, measured and predicted (ms)")
    lines, apart = data["strategies"], data["code_changes"]
    body = [f"<h1>dpro optimize: {escape(analysis.root.name)}</h1>", _answer(data, path.parent)]
    if "trials" in data:
        body.append(_trials(data["trials"]))
    body += [f"<h2>Strategies: the best {min(TOP, len(lines))} of {len(lines)} distinct</h2>",
             f"<p class='muted'>{sum(len(s['equivalents']) for s in lines)} more strategies fold into these lines "
             "(predictions equal within their intervals). Baseline: "
             f"{data['baseline_step_ms']:.1f} ms per step, the median step outside the profiling window. Intervals: "
             f"90% of the cost model's held-out errors per family of change (model {escape(data['intervals']['model'])}, "
             f"fidelity scoring seed {escape(str(data['intervals']['seed']))}).</p>",
             figure_div(interval_figure(lines[:TOP], data["baseline_step_ms"])), _table(lines[:TOP])]
    if len(lines) > TOP:
        body.append(f"<details><summary>All {len(lines)} strategies</summary>{_table(lines)}</details>")
    body += ["<h2>Where the step goes</h2>", figure_div(split),
             table(["", "span ms", *(c.replace("_", "-") for c in CATEGORIES)], [[escape(r[0]), *r[1:]]
                   for r in breakdown_rows(data)], numeric=tuple(range(1, len(CATEGORIES) + 2))),
             "<h2>Timelines</h2>", figure_div(timeline),
             "<p class='muted'>Timelines: replays, not anchored to the measured step time as the table's predictions "
             "are.</p>"]
    if apart:
        body += ["<h2>Code changes (never recommended: <code>--apply</code> cannot set them, or no held-out case "
                 "scored them)</h2>", _table(apart[:APART])]
        if len(apart) > APART:
            body.append(f"<details><summary>All {len(apart)} code changes</summary>{_table(apart)}</details>")
    if data["notes"]:
        body.append("<h2>Notes</h2><ul>" + "".join(f"<li>{escape(n)}</li>" for n in data["notes"]) + "</ul>")
    search = data["search"]
    body.append(f"<p class='muted'>Search: {search['evaluated']} of {search['space']} strategies in "
                f"{search['elapsed_s']:.1f} s{'' if search['exhaustive'] else ' (the budget ran out)'}.</p>")
    path.write_text(page(f"dpro optimize: {analysis.root.name}", "".join(body), plotly_script(path.parent, path.parent)))


def _answer(data: dict[str, Any], folder: Path) -> str:
    """The answer box: what to do, its prediction, why, and how."""
    title, detail = headline(data)
    verdict, best = data["recommendation"], data["strategies"][0]
    out = [f"<div class='answer{'' if verdict['verdict'] == 'change' else ' keep'}' id='answer'>",
           f"<div class='headline'>{escape(title)}</div><p>{escape(detail)}</p>"]
    if verdict["verdict"] == "change":
        out.append(f"<p>Why: {escape(verdict['why'])}.</p>")
        if appliable(best):
            out += [f"<p>Apply it without editing the script:</p><pre>{escape(apply_command(data, str(folder)))}</pre>",
                    "<p>or change the script:</p>"]
        out.append("<pre>" + escape("\n".join(best["change"])) + "</pre>")
    else:
        out.append(f"<p>{escape(keep_hint(data)).replace('`', '')}</p>")
    return "".join(out) + "</div>"


def _trials(trials: dict[str, Any]) -> str:
    """The measured trials' table."""

    def ms(v: float | None) -> str:
        return "" if v is None else f"{v:.1f}"

    rows = [[escape(r["name"]), ms(r["predicted_step_ms"]), ms(r["median_ms"]),
             "" if r["measured_speedup"] is None else f"{r['measured_speedup']:.2f}x",
             " ".join(f"{m:.1f}" for m in r["measured_ms"]),
             escape("; ".join(([r["failed"]] if r["failed"] else []) + r["left_out"]))] for r in trials["results"]]
    return (f"<h2>Measured trials ({trials['steps']} steps each, {trials['rounds']} interleaved rounds)</h2>"
            + table(["strategy", "predicted ms", "measured ms (median)", "measured speed-up", "rounds", "note"], rows,
                    numeric=(1, 2, 3)))


def _table(entries: list[dict[str, Any]]) -> str:
    rows = [[str(i), escape(s["name"]), f"{s['predicted_step_ms']:.1f}", escape(speedups(s)), escape(s["status"]),
             "?" if s["memory_gb"] is None else f"{s['memory_gb']:.3g}",
             "<span class='lossy'>lossy</span>" if s["lossy"] else "", escape(folded(s))]
            for i, s in enumerate(entries, 1)]
    return table(HEADER, rows, numeric=(0, 2, 5))


def interval_figure(entries: list[dict[str, Any]], baseline_ms: float) -> Any:
    """Each line's predicted step (ms) with its 90% interval, the measured baseline a line."""
    import plotly.graph_objects as go

    names = [s["name"] for s in entries]
    predicted = [s["predicted_step_ms"] for s in entries]
    low = [p - s["interval_ms"][0] if s["interval_ms"] else 0 for p, s in zip(predicted, entries)]
    high = [s["interval_ms"][1] - p if s["interval_ms"] else 0 for p, s in zip(predicted, entries)]
    fig = go.Figure(go.Scatter(x=predicted, y=names, mode="markers", name="predicted step",
                               error_x={"type": "data", "symmetric": False, "array": high, "arrayminus": low},
                               marker={"size": 9, "color": ["#1a7f37" if s["status"] == "recommended" else "#4c78a8"
                                                            for s in entries]}))
    fig.add_vline(x=baseline_ms, line_dash="dash", line_color="#cf222e",
                  annotation_text=f"measured {baseline_ms:.1f} ms", annotation_position="top")
    fig.update_layout(title="Predicted step with its 90% interval (ms)", xaxis_title="ms per step",
                      yaxis={"autorange": "reversed"}, height=140 + 28 * len(entries), showlegend=False,
                      margin={"l": 10, "r": 10, "t": 60, "b": 40})
    return fig


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
