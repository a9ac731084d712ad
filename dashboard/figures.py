"""The dashboard's plotly figures, each built from plain tables (no Dash in here)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dpro.dashboard.timeline_data import KINDS, Lanes, View

__all__ = ["heatmap_figure", "step_figure", "timeline_figure", "topology_figure", "trend_figure", "verdict_figure"]

KIND_COLORS = dict(zip(KINDS, ("#4c78a8", "#9ecae9", "#bab0ac", "#54a24b", "#eeca3b", "#e45756", "#b279a2")))
LANE_PX = 26
VERDICT_COLORS = {"healthy": "#54a24b", "degraded": "#f58518", "failed": "#d62728"}
HOVER_NAME_CHARS = 60


def step_figure(steps: pd.DataFrame, predicted_ms: dict[int, float], labels: dict[int, str]) -> go.Figure:
    """Each rank's time per step (``rank``, ``step``, ``dur_ns``, ``phase``), with the replay's
    prediction of the typical step as a dashed line per rank."""
    fig = go.Figure()
    for rank, mine in steps.groupby("rank"):
        fig.add_trace(go.Scatter(x=mine["step"], y=mine["dur_ns"] / 1e6, mode="lines+markers", name=labels[rank],
                                 legendgroup=str(rank), customdata=mine["phase"].replace("", "unprofiled"),
                                 hovertemplate="step %{x}: %{y:.2f} ms (%{customdata})<extra>" + labels[rank] + "</extra>"))
        if rank in predicted_ms:
            fig.add_trace(go.Scatter(x=[mine["step"].min(), mine["step"].max()], y=[predicted_ms[rank]] * 2, mode="lines",
                                     line={"dash": "dash"}, name=f"{labels[rank]}: replay", legendgroup=str(rank),
                                     hovertemplate="replay of the typical step: %{y:.2f} ms<extra></extra>"))
    fig.update_layout(title="Step time per rank (measured; dashed: predicted by the replay)",
                      xaxis_title="step", yaxis_title="ms", height=380, margin={"t": 50})
    return fig


def timeline_figure(lanes: Lanes, view: View, shown: np.ndarray, critical: pd.DataFrame | None = None,
                    links: pd.DataFrame | None = None, link_limit: int = 300) -> go.Figure:
    """The window's shapes on the lanes ``shown`` (top to bottom), with the critical path's ops
    outlined and collective calls linked across ranks (each given, or None). Each bar's
    ``customdata`` is its op's row in ``lanes`` (-1: merged), as a list: Dash reads a clicked
    point's ``customdata`` from the figure's JSON, where a numpy array is a packed binary blob."""
    position = np.full(len(lanes.labels), -1.0)
    position[shown] = np.arange(len(shown))
    shapes = view.shapes
    fig = go.Figure()
    names = lanes.names
    for code, group in shapes.groupby("kind"):
        kind = KINDS[int(code)]
        ops = group["op"].to_numpy()
        single = ops >= 0
        text = np.where(single, _short(names[lanes.name[np.where(single, ops, 0)]]),
                        group["count"].astype(str).to_numpy() + f" ops, mostly {kind}")
        text = text + np.array([f"<br>{d:.4g} ms long" for d in (group["end"] - group["start"]).to_numpy() / 1e6], object)
        fig.add_trace(go.Bar(
            y=position[group["lane"].to_numpy()], base=group["start"].to_numpy() / 1e6,
            x=(group["end"] - group["start"]).to_numpy() / 1e6, width=np.clip(0.8 - 0.15 * group["depth"].to_numpy(), 0.2, 0.8),
            orientation="h", name=kind, marker_color=KIND_COLORS[kind], customdata=ops.tolist(), hovertext=text,
            hovertemplate="%{hovertext}<br>from %{base:.3f} ms<extra></extra>"))
    if critical is not None and len(critical):
        ops = critical["op"].to_numpy()
        inside = (lanes.start[ops] < view.t1) & (lanes.end[ops] > view.t0) & (position[lanes.lane[ops]] >= 0)
        ops = ops[inside]
        if len(ops):
            fig.add_trace(go.Bar(y=position[lanes.lane[ops]], base=lanes.start[ops] / 1e6,
                                 x=(lanes.end[ops] - lanes.start[ops]) / 1e6, width=0.9, orientation="h",
                                 name="critical path", marker={"color": "rgba(0,0,0,0)", "line": {"color": "#d62728", "width": 2}},
                                 customdata=ops.tolist(), hovertext=_short(names[lanes.name[ops]]),
                                 hovertemplate="on the critical path: %{hovertext}<extra></extra>"))
    if links is not None and len(links):
        _add_links(fig, lanes, view, links, position, link_limit)
    rank0 = lanes.steps[lanes.steps["rank"] == lanes.steps["rank"].min()] if len(lanes.steps) else lanes.steps
    for bound in rank0.itertuples():
        if view.t0 <= bound.start <= view.t1:
            fig.add_vline(x=bound.start / 1e6, line={"color": "#999", "dash": "dot", "width": 1},
                          annotation_text=f"step {bound.step}", annotation_position="top left")
    fig.update_layout(barmode="overlay", height=120 + LANE_PX * max(len(shown), 1), margin={"t": 40, "l": 10},
                      xaxis={"range": [view.t0 / 1e6, view.t1 / 1e6], "title": "ms (aligned to rank 0's clock)"},
                      yaxis={"tickvals": list(range(len(shown))), "ticktext": [lanes.labels[i] for i in shown],
                             "autorange": "reversed", "fixedrange": True, "automargin": True},
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"}, bargap=0, uirevision="timeline",
                      clickmode="event", hovermode="closest")
    return fig


def _short(names: np.ndarray) -> np.ndarray:
    """Op names cut to :data:`HOVER_NAME_CHARS` for the hover (a click shows the whole name):
    kernel names run to hundreds of characters and would be most of a view's bytes."""
    cut = HOVER_NAME_CHARS
    return np.array([n if len(n) <= cut else n[:cut] + "…" for n in map(str, names)], dtype=object)


def _add_links(fig: go.Figure, lanes: Lanes, view: View, links: pd.DataFrame, position: np.ndarray,
               limit: int) -> None:
    ops = links["op"].to_numpy()
    inside = (lanes.start[ops] <= view.t1) & (lanes.end[ops] >= view.t0) & (position[lanes.lane[ops]] >= 0)
    calls = links[inside]
    calls = links[links["call"].isin(calls["call"].unique()[:limit])]
    calls = calls[position[lanes.lane[calls["op"].to_numpy()]] >= 0]
    xs: list[Any] = []
    ys: list[Any] = []
    for _, call in calls.groupby("call", sort=False):
        if len(call) < 2:
            continue
        ops = call["op"].to_numpy()
        order = np.argsort(position[lanes.lane[ops]])
        xs += list(lanes.start[ops][order] / 1e6) + [None]
        ys += list(position[lanes.lane[ops]][order]) + [None]
    if xs:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="collective across ranks", hoverinfo="skip",
                                 line={"color": "#e45756", "width": 1, "dash": "dot"}))


def heatmap_figure(hosts: list[str], matrix: np.ndarray, title: str, unit: str) -> go.Figure:
    """A host × host matrix (row: sender, column: receiver)."""
    fig = go.Figure(go.Heatmap(z=matrix, x=hosts, y=hosts, colorscale="Viridis", colorbar={"title": unit},
                               hovertemplate="%{y} → %{x}: %{z:.1f} " + unit + "<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="to", yaxis_title="from", height=200 + 30 * len(hosts),
                      yaxis={"autorange": "reversed"})
    return fig


def verdict_figure(nights: list[str], columns: list[str], verdicts: list[list[str | None]]) -> go.Figure:
    """A grid of verdicts, a row per night (``nights`` oldest first: the newest on top) and a
    column per node, coloured healthy, degraded or failed (blank: not in that night)."""
    levels = list(VERDICT_COLORS)
    z = [[None if v is None else levels.index(v) for v in row] for row in verdicts]
    scale = [[(i + edge) / len(levels), color] for i, color in enumerate(VERDICT_COLORS.values()) for edge in (0, 1)]
    fig = go.Figure(go.Heatmap(z=z, x=columns, y=nights, text=[[v or "" for v in row] for row in verdicts],
                               texttemplate="%{text}", zmin=-0.5, zmax=len(levels) - 0.5, colorscale=scale,
                               showscale=False, xgap=2, ygap=2, hovertemplate="%{y}, %{x}: %{text}<extra></extra>"))
    fig.update_layout(title="Verdict per night and node (run: the night's overall verdict)",
                      height=110 + 32 * len(nights), margin={"t": 80, "b": 20}, xaxis={"side": "top"},
                      yaxis={"automargin": True, "type": "category"})
    return fig


def trend_figure(nights: list[str], series: dict[str, list[float | None]], title: str,
                 flagged: dict[str, str]) -> go.Figure:
    """A line per node over the nights; the newest value of each node in ``flagged`` marked
    (the mark's hover says why)."""
    fig = go.Figure()
    for host, values in series.items():
        fig.add_trace(go.Scatter(x=nights, y=values, mode="lines+markers", name=host, connectgaps=False,
                                 hovertemplate="%{x}: %{y:.4g}<extra>" + host + "</extra>"))
    marked = [h for h in flagged if h in series]
    if marked:
        fig.add_trace(go.Scatter(x=[nights[-1]] * len(marked), y=[series[h][-1] for h in marked], mode="markers",
                                 name="regression", hovertext=[f"{h}: {flagged[h]}" for h in marked], hoverinfo="text",
                                 marker={"symbol": "x", "size": 16, "color": "#d62728", "line": {"width": 1}}))
    fig.update_layout(title=title, height=420, margin={"t": 50}, xaxis={"type": "category", "title": "night"})
    return fig


def _tiered_layout(topology: Any) -> dict[Any, Any]:
    """Positions in rows by tier: hosts at the bottom, then NICs, then each switch by its hop
    count from the nearest host (leaves, then spines...)."""
    import networkx as nx

    hosts = [n for n, kind in topology.nodes(data="kind") if kind == "host"]
    hops = nx.multi_source_dijkstra_path_length(topology, hosts) if hosts else {}
    graph = nx.Graph()
    for node in topology:
        graph.add_node(node, tier=hops.get(node, 0))
    return nx.multipartite_layout(graph, subset_key="tier", align="horizontal")


def topology_figure(topology: Any, suspect_links: set[frozenset[str]], suspect_nodes: set[str]) -> go.Figure:
    """The fabric's switches and hosts, suspect links in red (thick) and suspect nodes marked."""
    layout = _tiered_layout(topology)
    fig = go.Figure()
    for bad in (False, True):
        xs: list[Any] = []
        ys: list[Any] = []
        for u, v in topology.edges():
            if (frozenset((u, v)) in suspect_links) == bad:
                xs += [layout[u][0], layout[v][0], None]
                ys += [layout[u][1], layout[v][1], None]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="suspect link" if bad else "link", hoverinfo="skip",
                                 line={"color": "#d62728" if bad else "#bbb", "width": 4 if bad else 1}))
    nodes = list(topology.nodes())
    kinds = [str(topology.nodes[n].get("kind", "")) for n in nodes]
    fig.add_trace(go.Scatter(x=[layout[n][0] for n in nodes], y=[layout[n][1] for n in nodes], mode="markers+text",
                             text=nodes, textposition="top center", name="switch / host",
                             hovertext=[f"{n} ({k})" for n, k in zip(nodes, kinds)], hoverinfo="text",
                             marker={"size": 12, "color": ["#d62728" if n in suspect_nodes else "#4c78a8" for n in nodes],
                                     "symbol": ["square" if k == "switch" else "circle" for k in kinds]}))
    fig.update_layout(title="Topology (red: suspects)", showlegend=True, height=520,
                      xaxis={"visible": False}, yaxis={"visible": False})
    return fig
