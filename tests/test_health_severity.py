"""Severity from the evidence (issue 31), on reports built in memory: a suspect graded by its
measured drop, the line-rate rule where there is no baseline, "no baseline" never shown as
"ok", and the page that leads with the verdict. The namespace tests in ``test_health.py`` run
the same rules on real hosts."""

from __future__ import annotations

import numpy as np
import pytest

from dpro.anomaly.fabric.probes import Probes
from dpro.anomaly.health.config import HealthConfig, Rules
from dpro.anomaly.health.model import JOB, Check, HealthReport, Metric, Node
from dpro.anomaly.health.network import judge_network, matrix_as_judged
from dpro.anomaly.health.report import html, markdown, shown_status
from dpro.anomaly.health.rules import apply_rules, line_rates_gbps

HOSTS = ["h0", "h1", "h2", "h3"]


def _nic(gbps: float = 10.0) -> Check:
    return Check("nic.eth0", metrics=[Metric("speed_mbps", gbps * 1000, "Mb/s", True)])


def _report(hosts: list[str], reduce_gbps: float) -> HealthReport:
    nodes = [Node(h, [_nic()]) for h in hosts]
    job = Node(JOB, [Check("collective.all_reduce", metrics=[Metric("busbw_gbps_1mb", reduce_gbps, "Gb/s", True)])])
    return HealthReport("2026-11-27T00:00:00+00:00", "2026-11-27T00:05:00+00:00", nodes + [job],
                        facts={"world_size": len(hosts), "backend": "gloo"})


def _probes(slow_host: int, factor: float, noise: float = 0.02) -> Probes:
    """Every ordered pair of :data:`HOSTS` at about 12 Gb/s (``noise``: the spread), ``slow_host``'s
    probes both ways at ``factor`` of that."""
    rng = np.random.default_rng(7)
    pairs = [(s, d) for s in range(len(HOSTS)) for d in range(len(HOSTS)) if s != d] * 3
    src, dst = (np.array(x) for x in zip(*pairs))
    value = 12.0 * rng.normal(1.0, noise, len(pairs)) * np.where((src == slow_host) | (dst == slow_host), factor, 1.0)
    return Probes(HOSTS, src, dst, np.repeat(np.arange(3), len(pairs) // 3), value)


@pytest.mark.parametrize("factor, status", [(0.003, "fail"), (0.6, "warn")])
def test_a_suspect_is_graded_by_its_drop(factor: float, status: str) -> None:
    report = _report(HOSTS, 5.0)
    suspects = judge_network(report, _probes(2, factor), None, rules=Rules())
    assert suspects[0].name == "h2"
    drop = suspects[0].evidence["drop_pct"]
    assert drop == pytest.approx(100 * (1 - factor), abs=2)
    assert suspects[0].evidence["severity"] == ("failed" if status == "fail" else "degraded")
    check = next(c for c in report.node("h2").checks if c.name == "pairwise")
    assert check.status == status and f"{drop:.1f}% below the others'" in check.message
    assert report.node("h2").verdict == ("failed" if status == "fail" else "degraded")


def test_with_no_baseline_the_line_rate_flags_a_slow_all_reduce_and_the_rest_reads_no_baseline() -> None:
    report = _report(["h0", "h1"], 0.03)  # 0.3% of 10 Gb/s: a 300x slow all-reduce
    apply_rules(report, HealthConfig())
    [reduce] = report.node(JOB).checks
    assert reduce.status == "warn" and "0.30% of the NICs' line rate 10 Gb/s" in reduce.message
    assert report.verdict == "degraded"
    nic = report.node("h0").checks[0]
    assert nic.status == "pass" and shown_status(nic) == "no baseline"
    assert "| h0 | nic.eth0 | no baseline | speed_mbps=1e+04 Mb/s (no baseline) |" in markdown(report)
    assert "| ok |" not in markdown(report)


def test_the_line_rate_rule_leaves_alone_one_host_a_fast_job_and_probes_the_matrix_explains() -> None:
    assert JOB not in line_rates_gbps(_report(["h0"], 0.03)), "on one host the collectives cross no NIC"
    healthy = _report(["h0", "h1"], 2.0)
    apply_rules(healthy, HealthConfig())
    assert healthy.verdict == "healthy" and shown_status(healthy.node(JOB).checks[0]) == "no baseline"
    # h2's slow probes are the suspect's, graded by their drop: not flagged again against the line rate
    report = _report(HOSTS, 5.0)
    report.suspects = judge_network(report, _probes(2, 0.6), None, rules=Rules())
    apply_rules(report, HealthConfig(rules=Rules(line_rate_pct=90.0)))
    pairwise = next(c for c in report.node("h2").checks if c.name == "pairwise")
    assert "line rate" not in pairwise.message and "below the others'" in pairwise.message


def test_the_page_leads_with_the_verdict_and_the_top_suspect() -> None:
    report = _report(HOSTS, 5.0)
    report.suspects = judge_network(report, _probes(2, 0.003), None, rules=Rules())
    apply_rules(report, HealthConfig())
    page = html(report, "")
    verdict = page.index("id='verdict'")
    assert page.index("Verdict: failed") > verdict and page.index("Top suspect: host <b>h2</b> (failed, ") > verdict
    assert page.index("Top suspect") < page.index("<h2>Suspects") < page.index("<h2>Checks (failing first)")
    checks = page[page.index("<h2>Checks (failing first)"):]
    assert checks.index("<td>h2</td><td>pairwise</td><td><span class='fail'>FAIL") < checks.index("no baseline")


def test_a_failed_hosts_probes_are_left_out_of_its_peers_rates() -> None:
    """CI, 2026-11-28: beside a host throttled to 2%, h1's probes to h3 at half the rate made
    both a 51% regression: their medians over three peers fell to those probes."""
    probes = _probes(2, 0.02, noise=0.2)  # loopback between namespaces on a busy machine
    probes.value[(probes.src == 1) & (probes.dst == 3)] *= 0.5
    report = _report(HOSTS, 5.0)
    report.suspects = judge_network(report, probes, None, rules=Rules())
    assert [s.name for s in report.suspects] == ["h2"]
    history = {"pairwise/send_gbps": [12.0] * 3, "pairwise/recv_gbps": [12.0] * 3}
    apply_rules(report, HealthConfig(rules=Rules(degraded_pct=40, failed_pct=60)),
                lambda host, key: history.get(key, []))
    rates = {h: next(c for c in report.node(h).checks if c.name == "pairwise") for h in HOSTS}
    assert rates["h1"].evidence["peers_left_out"] == ["h2"] and "peers_left_out" not in rates["h2"].evidence
    matrix = matrix_as_judged(probes, None)  # without a topology, a direction measured thrice at its best
    assert rates["h1"].metrics[0].value == pytest.approx((matrix[1, 0] + matrix[1, 3]) / 2)  # not matrix[1, 3]
    assert matrix[1, 3] < 0.6 * 12 < rates["h1"].metrics[0].value
    assert [h for h in HOSTS if report.node(h).verdict != "healthy"] == ["h2"]
    assert report.node("h2").verdict == "failed" and rates["h2"].metrics[0].value < 1.0
