"""What-if and optimizer: pick changes and see the predicted step and timeline beside the
measured; the optimizer's report when one is given; with two runs, the compare view."""

from __future__ import annotations

from typing import Any

from dash import Input, Output, State, dcc, html

from dpro.analysis.compare import compare
from dpro.analysis.step_ops import measured_ops, predicted_ops
from dpro.analysis.whatif import Change
from dpro.comm_hooks import CAST_HOOKS, POWERSGD, compress_flag
from dpro.errors import DproError
from dpro.optimizer.report_html import breakdown_figure, step_timeline_figure
from dpro.optimizer.report_text import speedups

from dpro.dashboard.pages.common import figure, missing, table
from dpro.dashboard.runs import NO_REPORT, RunView

__all__ = ["layout", "register"]

BUCKET_CAPS_MB = [0.05, 0.25, 1, 5, 25, 100]
COMPRESSIONS = [*CAST_HOOKS, compress_flag(POWERSGD, 1), compress_flag(POWERSGD, 4)]


def layout(view: RunView, views: list[RunView]) -> Any:
    parts: list[Any] = [html.H2(f"What-if: {view.name}")]
    if not view.has_replay:
        parts.append(missing(view.no_replay))
    else:
        parts += [_controls(view), dcc.Loading(html.Div(id="whatif-result"))]
    parts += [html.H2("Optimizer report"), _report(view)]
    others = [(i, v) for i, v in enumerate(views) if v is not view]
    if others:
        parts += [html.H2("Compare"), html.Label("Measured against "),
                  dcc.Dropdown(id="compare-with", options=[{"label": v.name, "value": i} for i, v in others],
                               value=others[0][0], clearable=False, style={"width": "400px"}),
                  dcc.Loading(html.Div(id="compare-result"))]
    return html.Div(parts)


def _controls(view: RunView) -> Any:
    layout = view.analysis.ddp_layout
    recorded_cap = layout.bucket_cap_mb if layout else None
    return html.Div([
        html.Div([html.Label("DDP bucket cap (MB) "),
                  dcc.Dropdown(id="whatif-bucket", options=[{"label": f"{c:g}", "value": c} for c in BUCKET_CAPS_MB],
                               placeholder=f"as recorded ({recorded_cap:g})" if recorded_cap else "as recorded",
                               style={"width": "200px"})]),
        html.Div([html.Label("Link bandwidth (× recorded) "),
                  dcc.Slider(id="whatif-bandwidth", min=-2, max=2, step=None, value=0,
                             marks={-2: "0.25×", -1: "0.5×", 0: "1×", 1: "2×", 2: "4×"})], style={"width": "400px"}),
        html.Div([html.Label("Gradient compression "),
                  dcc.Dropdown(id="whatif-compress", options=COMPRESSIONS, placeholder="none", style={"width": "200px"})]),
        html.Div([html.Label("Scale ops whose name matches "),
                  dcc.Input(id="whatif-pattern", value="", placeholder="regex, e.g. aten::mm|aten::addmm", debounce=True),
                  html.Label(" by "),
                  dcc.Slider(id="whatif-scale", min=-2, max=2, step=None, value=0,
                             marks={-2: "0.25×", -1: "0.5×", 0: "1×", 1: "2×", 2: "4×"})], style={"width": "600px"}),
        dcc.Checklist(id="whatif-fuse", options=["operator fusion (torch.compile)"], value=[]),
    ], style={"display": "grid", "gap": "8px"})


def register(app: Any, views: list[RunView]) -> None:
    @app.callback(Output("whatif-result", "children"),
                  Input("whatif-bucket", "value"), Input("whatif-bandwidth", "value"), Input("whatif-compress", "value"),
                  Input("whatif-pattern", "value"), Input("whatif-scale", "value"), Input("whatif-fuse", "value"),
                  State("run", "value"))
    def predict(bucket: float | None, bandwidth: int, compress: str | None, pattern: str, scale: int,
                fuse: list[str], run: int):
        view = views[run]
        change = Change(bucket_cap_mb=bucket, bandwidth_scale=2.0 ** bandwidth if bandwidth else None,
                        compress=compress or None, scale_ops=pattern or None,
                        op_scale=2.0 ** scale if scale else None, fuse_ops=True if fuse else None)
        try:
            prediction = view.predict(change)
        except DproError as e:
            return html.P(f"Cannot predict this change: {e}", id="whatif-error")
        s = prediction.summary
        baseline, predicted = s["baseline_step_ms"], s["predicted_step_ms"]
        headline = (f"Predicted step: {predicted:.2f} ms" + (f" (measured {baseline:.2f} ms as recorded, "
                                                              f"{round(100 * (predicted / baseline - 1), 1) + 0.0:+.1f}%)"
                                                              if baseline else ""))  # + 0.0: no "-0.0%"
        rank = min(view.analysis.graph.step_ns)
        rows = [[view.label(p["rank"]), p["baseline_step_ms"], p["predicted_step_ms"], p["replayed_step_ms"],
                 p["unanchored_step_ms"]] for p in s["per_rank"]]
        return html.Div([
            html.H3(headline, id="whatif-predicted"),
            html.P("Predicted: the measured step times the changed replay over the replay as recorded."),
            table(["rank", "measured ms", "predicted ms", "replay as recorded ms", "replay changed ms"], rows),
            figure("whatif-timeline", step_timeline_figure(
                [("measured (the profiled window's typical step)", measured_ops(view.analysis.graph, rank)),
                 ("predicted with the change", predicted_ops(prediction.graph, prediction.replay, rank))],
                f"{view.label(rank)}'s step, measured and predicted (ms)"))])

    @app.callback(Output("compare-result", "children"), Input("compare-with", "value"), State("run", "value"))
    def compared(other: int, run: int):
        a, b = views[other], views[run]
        try:
            c = compare(a.analysis, b.analysis)
        except DproError as e:
            return missing(f"compare: {e}")
        p = c["prediction"]
        rows = [["step (ms, unprofiled)", c["a"]["step_ms"], c["b"]["step_ms"]],
                ["measured speed-up of this run", "", None if c["speedup"] is None else f"{c['speedup']:.2f}×"]]
        if p:
            rows += [["strategy applied", "", p["strategy"]], ["predicted step (ms)", "", p["predicted_step_ms"]],
                     ["prediction error", "", None if p["error_pct"] is None else f"{p['error_pct']:+.1f}%"]]
        parts = [table(["", a.name, b.name], rows, id="compare-table")]
        if not p:
            parts.append(html.P(f"{b.name} was recorded without --apply: it carries no prediction to check."))
        if c["breakdown"]["a"] and c["breakdown"]["b"]:
            parts.append(figure("compare-breakdown", breakdown_figure(
                {a.name: c["breakdown"]["a"], b.name: c["breakdown"]["b"]}, "Where the step goes (critical path, ms)")))
        return html.Div(parts)


def _report(view: RunView) -> Any:
    report = view.report
    if report is None:
        return missing(NO_REPORT)
    verdict = report.get("recommendation")
    answer = ("" if verdict is None else f"Recommended: {verdict['name']}, {verdict['why']}. "
              if verdict["verdict"] == "change" else f"Keep the job as it is: {verdict['why']}. ")
    rows = [[s["name"], s["predicted_step_ms"], speedups(s) if "speedup_interval" in s else f"{s['predicted_speedup']:.2f}×",
             s.get("status", ""), "yes" if s["lossy"] else "",
             html.Pre(s["change"], style={"margin": 0, "whiteSpace": "pre-wrap"})]
            for s in report["strategies"] + report.get("code_changes", [])]
    return html.Div([html.P(f"{answer}Baseline {report['baseline_step_ms']:.2f} ms per step; the recommendation first, "
                            "code changes last.", id="report-answer"),
                     table(["strategy", "predicted ms", "speed-up (90% interval)", "status", "lossy", "change to make"],
                           rows, id="report-table")])
