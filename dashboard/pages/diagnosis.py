"""Diagnosis: the suspects with their evidence, the host-to-host bandwidth matrix, and the
topology with the suspect links marked."""

from __future__ import annotations

from typing import Any

from dash import html

from dpro.anomaly.fabric.probes import to_matrix

from dpro.dashboard.figures import heatmap_figure, topology_figure
from dpro.dashboard.pages.common import figure, missing, table
from dpro.dashboard.runs import RunView

__all__ = ["layout"]


def layout(view: RunView, views: list[RunView]) -> Any:
    suspects = view.suspects
    parts: list[Any] = [html.H2(f"Diagnosis: {view.name}")]
    if suspects:
        rows = [[i, s.kind, s.name, s.host, s.score, ", ".join(f"{k}={v}" for k, v in s.evidence.items())]
                for i, s in enumerate(suspects, 1)]
        parts.append(table(["#", "kind", "name", "host", "score", "evidence"], rows, id="suspects"))
    else:
        parts.append(html.P("Nothing stands out: no rank, host or link is slower than the noise.", id="suspects"))
    hosts, rates = view.host_rates
    if len(hosts) >= 2:
        parts.append(figure("host-rates", heatmap_figure(hosts, rates / 1e6, "The job's own traffic: median sending "
                                                                             "rate between hosts", "Mb/s")))
    else:
        parts.append(missing("host-to-host rates: the run has no connection samples between two or more hosts"))
    probes = view.probes
    if probes is not None:
        parts.append(figure("probe-matrix", heatmap_figure(probes.hosts, to_matrix(probes), "Pairwise probes",
                                                           "bandwidth" if probes.higher_is_better else "latency")))
    if view.topology is not None:
        # a directed link marks its cable; so does each link or switch no probe tells apart from it
        same = [name for s in suspects for name in s.evidence.get("same_as", [])]
        links = {frozenset((s.evidence["from"], s.evidence["to"])) for s in suspects
                 if s.kind == "link" and "from" in s.evidence} | {frozenset(n.split("->")) for n in same if "->" in n}
        nodes = {s.name for s in suspects if s.kind in ("host", "nic", "switch")} | {n for n in same if "->" not in n}
        parts.append(figure("topology", topology_figure(view.topology, links, nodes)))
    else:
        parts.append(missing("topology: none given (dpro dashboard RUN --topology FILE)"))
    return html.Div(parts)
