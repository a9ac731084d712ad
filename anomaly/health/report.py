"""The health reports: ``health.json`` (the verdict, every node's checks, the suspects),
``health.md`` for people and tickets, and ``health.html`` with plotly figures (the pairwise
matrix, the collectives' bus bandwidth). Nothing already in the folder is overwritten."""

from __future__ import annotations

import json
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dpro.errors import DproError

from dpro.anomaly.health.model import JOB, HealthReport

__all__ = ["ReportExistsError", "check_free", "markdown", "summary", "write_reports"]

FILES = ("health.json", "health.md", "health.html")
MARK = {"pass": "ok", "skip": "skipped", "warn": "WARN", "fail": "FAIL"}


class ReportExistsError(DproError):
    """The output folder already holds a health report."""


def check_free(out: Path) -> None:
    """:class:`ReportExistsError` when ``out`` already holds one of the reports."""
    taken = [f for f in FILES if (out / f).exists()]
    if taken:
        raise ReportExistsError(f"{out / taken[0]} exists and is not overwritten: choose another -o")


def write_reports(report: HealthReport, out: Path) -> dict[str, Path]:
    """Write the three reports into ``out`` (created); their paths by kind."""
    check_free(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "health.json", "markdown": out / "health.md", "html": out / "health.html"}
    paths["json"].write_text(json.dumps(report.to_json(), indent=1, default=str))
    paths["markdown"].write_text(markdown(report))
    _figure(report).write_html(paths["html"], include_plotlyjs=True, full_html=True)
    return paths


def summary(report: HealthReport) -> str:
    """One line: the verdict, and the first thing to look at."""
    bad = [(n.host, c) for n in report.nodes for c in n.checks if c.status in ("warn", "fail")]
    bad.sort(key=lambda hc: hc[1].status != "fail")
    first = f": {bad[0][0]} {bad[0][1].name}: {bad[0][1].message}" if bad else ""
    return f"{report.verdict}{first}"


def markdown(report: HealthReport) -> str:
    """``health.md``."""
    hosts = [n for n in report.nodes if n.host != JOB]
    lines = [f"# dpro health: {report.verdict}", "",
             f"{report.started} to {report.finished}; {len(hosts)} hosts, {report.facts.get('world_size', '?')} ranks, "
             f"backend {report.facts.get('backend', '?')}.", ""]
    if report.suspects:
        lines += ["## Suspects (most likely first)", "", "| # | kind | name | host | score | evidence |", "|---|---|---|---|---|---|"]
        lines += [f"| {i} | {s.kind} | {s.name} | {s.host or ''} | {s.score:.3g} | "
                  f"{', '.join(f'{k}={v}' for k, v in s.evidence.items())} |" for i, s in enumerate(report.suspects, 1)]
        lines.append("")
    lines += ["## Nodes", "", "| node | verdict | not passing |", "|---|---|---|"]
    for node in report.nodes:
        bad = [f"{c.name}: {c.message}" for c in node.checks if c.status in ("warn", "fail")]
        lines.append(f"| {node.host} | {node.verdict} | {'; '.join(bad) or '-'} |")
    for node in report.nodes:
        lines += ["", f"## {node.host}", "", "| check | status | metrics | note |", "|---|---|---|---|"]
        for c in node.checks:
            metrics = ", ".join(f"{m.name}={m.value:.4g}{(' ' + m.unit) if m.unit and m.unit != 'count' else ''}"
                                + (f" (baseline {m.baseline:.4g})" if m.baseline is not None else "") for m in c.metrics)
            lines.append(f"| {c.name} | {MARK[c.status]} | {metrics} | {c.message} |")
    return "\n".join(lines) + "\n"


def _figure(report: HealthReport) -> go.Figure:
    pairwise = report.facts.get("pairwise")
    collectives = [c for c in report.node(JOB).checks if c.name.startswith("collective.") and c.metrics]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Pairwise bandwidth (Gb/s, row sends to column)",
                                                        "Collectives: bus bandwidth (Gb/s)"))
    if pairwise:
        fig.add_trace(go.Heatmap(z=pairwise["gbps"], x=pairwise["hosts"], y=pairwise["hosts"], colorscale="Viridis",
                                 colorbar={"x": 0.45}, hovertemplate="%{y} → %{x}: %{z:.3g} Gb/s<extra></extra>"),
                      row=1, col=1)
        fig.update_yaxes(autorange="reversed", row=1, col=1)
    for c in collectives:
        sizes = [m.name.removeprefix("busbw_gbps_") for m in c.metrics if m.name.startswith("busbw_gbps_")]
        fig.add_trace(go.Bar(name=c.name.removeprefix("collective."), x=sizes,
                             y=[m.value for m in c.metrics if m.name.startswith("busbw_gbps_")]), row=1, col=2)
    fig.update_layout(title=f"dpro health: {report.verdict} ({report.started})", height=520, barmode="group")
    return fig
