"""From the pairwise matrix to verdicts: each host's median sending and receiving rate (a
``pairwise`` check, which the rules compare with its baseline), the job's (the median of the
unsuspected hosts': what they lost together is judged there), and the suspects the matrix
points at — hosts from the matrix alone, or, when the topology is known, NICs and links one
direction at a time (:mod:`dpro.anomaly.fabric.localize`: any equal-cost path, the prober cannot
see ECMP's choice), at the pooled threshold of the probes followed up
(:data:`dpro.anomaly.fabric.follow_up.Z_CLASS`). A suspect's severity follows its measured drop
(its probes' shortfall against the others', :func:`drop_pct`) by the thresholds of the history's
rules: ``failed_pct`` or more fails its check, less degrades it.

A host's rates leave out its probes with the hosts (and NICs' hosts) the matrix suspects: with
them, a slow host drags down each peer's median, on four hosts to the lower of its two other
probes. Left out, the median of those two is their mean: one slow probe between healthy hosts
still moves both hosts' rates, by half its own drop, which the rules' thresholds must allow."""

from __future__ import annotations

from typing import Any

import networkx as nx
import numpy as np

from dpro.anomaly.fabric import follow_up
from dpro.anomaly.fabric.localize import localize
from dpro.anomaly.fabric.probes import Probes, to_matrix
from dpro.anomaly.fabric.routing import Routing
from dpro.anomaly.suspects import Suspect

from dpro.anomaly.health.config import Rules
from dpro.anomaly.health.model import JOB, Check, HealthReport, Metric

__all__ = ["drop_pct", "judge_network", "matrix_as_judged"]


def judge_network(report: HealthReport, probes: Probes, topology: nx.MultiGraph | None,
                  routing: Routing | None = None, rules: Rules = Rules()) -> list[Suspect]:
    """Add each host's ``pairwise`` check and the fabric's suspects to ``report``, each judged
    by its drop (module docstring); the suspects, most likely first (``routing``: the fabric's
    known routes, if any)."""
    suspects = localize(topology, probes, z_class=follow_up.Z_CLASS, routing=routing)  # the check follows up
    hosts = {s.host for s in suspects if s.kind in ("host", "nic")}
    suspected = [j for j, h in enumerate(probes.hosts) if h in hosts]
    pairwise: dict[str, Check] = {}
    matrix = matrix_as_judged(probes, topology)
    for i, host in enumerate(probes.hosts):
        sent, received, left_out = _with_peers(matrix, i, suspected)
        evidence: dict[str, Any] = {"probes": int(len(sent) + len(received))}
        if left_out:
            evidence["peers_left_out"] = [probes.hosts[j] for j in left_out]
        pairwise[host] = Check("pairwise", metrics=[
            Metric("send_gbps", float(np.median(sent)), "Gb/s", True),
            Metric("recv_gbps", float(np.median(received)), "Gb/s", True)], evidence=evidence)
        report.node(host).checks.append(pairwise[host])
    report.node(JOB).checks.append(_typical(pairwise, hosts))
    fabric = Check("fabric")
    for suspect in suspects:
        check = pairwise[suspect.host] if suspect.kind in ("host", "nic") and suspect.host in pairwise else fabric
        drop = drop_pct(suspect)
        severe = drop is not None and drop >= rules.failed_pct
        if drop is not None:
            suspect.evidence["drop_pct"] = drop
        suspect.evidence["severity"] = "failed" if severe else "degraded"
        check.evidence.setdefault("suspects", []).append({"kind": suspect.kind, "name": suspect.name,
                                                          "score": round(float(suspect.score), 3), "drop_pct": drop})
        check.escalate("fail" if severe else "warn", f"the pairwise matrix points at {suspect.kind} {suspect.name}"
                       + ("" if drop is None else f": its probes {drop:.1f}% below the others'"
                          + (f" (failed at {rules.failed_pct:g}%)" if severe else "")))
    if fabric.evidence or topology is not None:
        if not fabric.evidence:
            fabric.message = "no link or switch stands out"
        report.node(JOB).checks.append(fabric)
    return suspects


def matrix_as_judged(probes: Probes, topology: nx.MultiGraph | None) -> np.ndarray:
    """The probes' ``n x n`` matrix as the check judges it: a direction the follow-ups probed
    again counts once, at its median; one probed again to confirm a path (no topology), at its
    best, as the matrix's analysis weighs it (:meth:`Probes.at_best`)."""
    return to_matrix(probes if topology is not None else probes.at_best())


def _typical(pairwise: dict[str, Check], suspected: set[str]) -> Check:
    """The job's ``pairwise`` check: the median of the unsuspected hosts' rates (all hosts' where
    every one is suspected), where a loss the hosts share is judged (the hosts' own rates are
    judged beyond it, :func:`dpro.anomaly.health.rules.common_changes`)."""
    typical = [c for h, c in pairwise.items() if h not in suspected] or list(pairwise.values())
    return Check("pairwise", metrics=[
        Metric(name, float(np.median([next(m.value for m in c.metrics if m.name == name) for c in typical])),
               "Gb/s", True) for name in ("send_gbps", "recv_gbps")], evidence={"hosts": len(typical)})


def _with_peers(matrix: np.ndarray, i: int, suspected: list[int]) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Host ``i``'s probes sent and received, leaving out its peers among ``suspected`` where
    probes with others remain both ways; the peers left out."""
    others = np.arange(len(matrix)) != i
    unsuspected = others.copy()
    unsuspected[suspected] = False
    for peers in (unsuspected, others):
        sent, received = matrix[i, peers], matrix[peers, i]
        sent, received = sent[~np.isnan(sent)], received[~np.isnan(received)]
        if len(sent) and len(received):
            break
    return sent, received, np.flatnonzero(others & ~peers).tolist()


def drop_pct(suspect: Suspect) -> float | None:
    """How far below the others the suspect's probes fell (percent): for a host, the smaller of
    its sends' and receives' median drops; for a NIC, link or switch, the mean shortfall of the
    probes that may cross it; None where the localizer measured none (a path)."""
    evidence = suspect.evidence
    if "row_drop" in evidence and "col_drop" in evidence:
        return round(100 * min(evidence["row_drop"], evidence["col_drop"]), 1)
    return evidence.get("mean_shortfall_pct")
