"""The health reports: ``health.json`` (the verdict, every node's checks, the suspects),
``health.md`` for people and tickets, and ``health.html``, one page that leads with the verdict
and the top suspect: the suspects with their evidence, every node's checks (failing first),
the pairwise matrix, the collectives' bus bandwidth and, with a history, each flagged metric's
nights. plotly.js is written once into the folder that holds the report's folder (the nights'
folders share it, :func:`dpro.html_report.plotly_script`). Nothing already in the folder is
overwritten."""

from __future__ import annotations

import json
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dpro.errors import DproError
from dpro.html_report import figure_div, page, plotly_script, table

from dpro.anomaly.fabric.probes import write_probes
from dpro.anomaly.health.config import Rules
from dpro.anomaly.health.model import JOB, STATUSES, Check, HealthReport, Node
from dpro.anomaly.health.rules import no_baseline

__all__ = ["ReportExistsError", "check_free", "html", "markdown", "shown_status", "summary", "write_reports"]

FILES = ("health.json", "health.md", "health.html", "probes.csv")
MARK = {"pass": "ok", "skip": "skipped", "warn": "WARN", "fail": "FAIL"}
NO_BASELINE = "no baseline"


class ReportExistsError(DproError):
    """The output folder already holds a health report."""


def check_free(out: Path) -> None:
    """:class:`ReportExistsError` when ``out`` already holds one of the reports."""
    taken = [f for f in FILES if (out / f).exists()]
    if taken:
        raise ReportExistsError(f"{out / taken[0]} exists and is not overwritten: choose another -o")


def write_reports(report: HealthReport, out: Path,
                  history: Callable[[str, str], list[float]] | None = None) -> dict[str, Path]:
    """Write the three reports into ``out`` (created), and with pairwise probes every one of
    them as ``probes.csv`` (``dpro diagnose --probes`` reads it); their paths by kind.
    ``history(host, key)``: earlier values of ``key`` (``check/metric``) on ``host``, newest
    first, for the flagged metrics' nights."""
    check_free(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "health.json", "markdown": out / "health.md", "html": out / "health.html"}
    paths["json"].write_text(json.dumps(report.to_json(), indent=1, default=str))
    paths["markdown"].write_text(markdown(report))
    paths["html"].write_text(html(report, plotly_script(out.resolve().parent, out.resolve()), history))
    if report.probes is not None:
        paths["probes"] = out / "probes.csv"
        write_probes(report.probes, paths["probes"])
    return paths


def shown_status(check: Check) -> str:
    """A check's status as the reports show it: "no baseline" where it passed only for want of
    one (:func:`dpro.anomaly.health.rules.no_baseline`)."""
    return NO_BASELINE if no_baseline(check) else MARK[check.status]


def _failing_first(report: HealthReport) -> list[tuple[str, Check]]:
    """Every ``(node, check)``: failed, then degraded, then the rest, in the report's order."""
    rows = [(n.host, c) for n in report.nodes for c in n.checks]
    return sorted(rows, key=lambda hc: -STATUSES.index(hc[1].status))


def _evidence(evidence: dict[str, Any]) -> str:
    """``key=value, ...``; the severity and the drop have columns of their own."""
    return ", ".join(f"{k}={'/'.join(map(str, v)) if isinstance(v, list) else v}" for k, v in evidence.items()
                     if k not in ("severity", "drop_pct"))


def _metrics(check: Check) -> str:
    """``name=value unit (baseline b)``, or ``(no baseline)`` for a value a rule had nothing to compare with."""
    missing = set(check.evidence.get("no_baseline", ()))
    return ", ".join(f"{m.name}={m.value:.4g}{(' ' + m.unit) if m.unit and m.unit != 'count' else ''}"
                     + (f" (baseline {m.baseline:.4g})" if m.baseline is not None else
                        " (no baseline)" if m.name in missing else "") for m in check.metrics)


def summary(report: HealthReport) -> str:
    """One line: the verdict, and the first thing to look at."""
    bad = _not_passing(_failing_first(report))
    first = f": {bad[0][0]} {bad[0][1].name}: {bad[0][1].message}" if bad else ""
    return f"{report.verdict}{first}"


def _not_passing(checks: list[tuple[str, Check]]) -> list[tuple[str, Check]]:
    """The degraded and failed ones of ``checks``, in their order."""
    return [(h, c) for h, c in checks if c.status in ("warn", "fail")]


def _node_problems(node: Node) -> str:
    """``check: why; ...`` of the node's degraded and failed checks, ``-`` for none."""
    return "; ".join(f"{c.name}: {c.message}" for _, c in _not_passing([(node.host, c) for c in node.checks])) or "-"


def markdown(report: HealthReport) -> str:
    """``health.md``."""
    hosts = [n for n in report.nodes if n.host != JOB]
    lines = [f"# dpro health: {report.verdict}", "",
             f"{report.started} to {report.finished}; {len(hosts)} hosts, {report.facts.get('world_size', '?')} ranks, "
             f"backend {report.facts.get('backend', '?')}.", ""]
    if report.suspects:
        lines += ["## Suspects (most likely first)", "",
                  "| # | kind | name | host | severity | drop | score | evidence |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {i} | {s.kind} | {s.name} | {s.host or ''} | {s.evidence.get('severity', '')} | "
                  f"{_drop(s.evidence)} | {s.score:.3g} | {_evidence(s.evidence)} |" for i, s in enumerate(report.suspects, 1)]
        lines.append("")
    lines += ["## Nodes", "", "| node | verdict | not passing |", "|---|---|---|"]
    lines += [f"| {node.host} | {node.verdict} | {_node_problems(node)} |" for node in report.nodes]
    lines += ["", "## Checks (failing first)", "", "| node | check | status | metrics | note |", "|---|---|---|---|---|"]
    lines += [f"| {host} | {c.name} | {shown_status(c)} | {_metrics(c)} | {c.message} |"
              for host, c in _failing_first(report)]
    return "\n".join(lines) + "\n"


def _drop(evidence: dict[str, Any]) -> str:
    return "" if evidence.get("drop_pct") is None else f"{evidence['drop_pct']:.1f}%"


def html(report: HealthReport, scripts: str, history: Callable[[str, str], list[float]] | None = None) -> str:
    """``health.html``: the verdict and the top suspect first (module docstring)."""
    hosts = [n for n in report.nodes if n.host != JOB]
    checks = _failing_first(report)
    bad = _not_passing(checks)
    if report.suspects:
        top = report.suspects[0]
        drop = _drop(top.evidence)
        lead = (f"Top suspect: {top.kind} <b>{escape(top.name)}</b>"
                + (f" on {escape(top.host)}" if top.host and top.host != top.name else "")
                + f" ({escape(str(top.evidence.get('severity', '')))}" + (f", {drop} below the others" if drop else "") + ")")
    elif bad:
        lead = f"First to look at: {escape(bad[0][0])} {escape(bad[0][1].name)}: {escape(bad[0][1].message)}"
    else:
        lead = "Every check passed" + (" (some with no baseline yet)" if any(no_baseline(c) for _, c in checks)
                                       else "") + "."
    body = [f"<h1>dpro health: {escape(report.started)}</h1>",
            f"<div class='answer {report.verdict if report.verdict != 'healthy' else ''}' id='verdict'>"
            f"<div class='headline'>Verdict: {escape(report.verdict)}</div><p>{lead}</p>"
            f"<p class='muted'>{escape(report.started)} to {escape(report.finished)}; {len(hosts)} hosts, "
            f"{escape(str(report.facts.get('world_size', '?')))} ranks, backend {escape(str(report.facts.get('backend', '?')))}."
            "</p></div>"]
    if report.suspects:
        body += ["<h2>Suspects (most likely first)</h2>", table(
            ["#", "kind", "name", "host", "severity", "drop", "score", "evidence"],
            [[str(i), s.kind, escape(s.name), escape(s.host or ""), escape(str(s.evidence.get("severity", ""))),
              _drop(s.evidence), f"{s.score:.3g}", escape(_evidence(s.evidence))] for i, s in enumerate(report.suspects, 1)],
            numeric=(0, 5, 6))]
    body += ["<h2>Nodes</h2>", table(["node", "verdict", "not passing"], [
        [escape(n.host), f"<span class='{_css(n.verdict)}'>{n.verdict}</span>",
         escape(_node_problems(n))]
        for n in report.nodes])]
    body += ["<h2>Checks (failing first)</h2>", table(["node", "check", "status", "metrics", "note"], [
        [escape(h), escape(c.name), f"<span class='{_css(shown_status(c))}'>{shown_status(c)}</span>",
         escape(_metrics(c)), escape(c.message)] for h, c in checks])]
    body += ["<h2>Pairwise matrix and collectives</h2>" + ("" if report.facts.get("pairwise") else
                                                           "<p class='muted'>One host: no pairs to probe.</p>"),
             figure_div(_figure(report))]
    trends = _trends(report, history)
    if trends is not None:
        body += ["<h2>Flagged metrics, night by night</h2>", figure_div(trends)]
    return page(f"dpro health: {report.verdict}", "".join(body), scripts)


def _css(status: str) -> str:
    return {"failed": "fail", "FAIL": "fail", "degraded": "warn", "WARN": "warn", "healthy": "pass", "ok": "pass",
            NO_BASELINE: "nobaseline", "skipped": "skip"}.get(status, "")


def _trends(report: HealthReport, history: Callable[[str, str], list[float]] | None) -> go.Figure | None:
    """One line per metric a rule flagged against its history: its earlier nights, then tonight."""
    if history is None:
        return None
    nights = int(report.facts.get("rules", {}).get("nights", Rules().nights))
    fig = go.Figure()
    for node in report.nodes:
        for check in node.checks:
            for name in check.evidence.get("regressions", {}):
                metric = next(m for m in check.metrics if m.name == name)
                values = [*reversed(history(node.host, f"{check.name}/{name}")[:nights]), metric.value]
                fig.add_trace(go.Scatter(y=values, x=list(range(1 - len(values), 1)), mode="lines+markers",
                                         name=f"{node.host} {check.name}/{name} ({metric.unit})"))
    if not fig.data:
        return None
    fig.update_layout(title="Each flagged metric over the earlier runs (0: this run)", xaxis_title="runs ago (negative)",
                      height=380)
    return fig


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
    fig.update_layout(height=460, barmode="group", margin={"t": 40})
    return fig
