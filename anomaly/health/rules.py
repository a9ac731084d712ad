"""Rules in the manner of SuperBench: each measured value against a baseline, each verdict with
its evidence.

The baseline of a metric (``check/metric`` on a host) is the baseline file's value when it has
one, else learned from the history: the median of the same host's values in the last
``rules.nights`` runs, after dropping outliers, given at least ``rules.min_nights`` of them.
Night-to-night noise is taken as multiplicative (a bandwidth varies by a factor, not by a
fixed amount), so the history is judged on a log scale: its robust deviation is 1.4826 × the
median absolute deviation of the log values, and an outlier lies more than 3.5 of them from
their median. A value worse than its baseline by ``degraded_pct`` or more — and, for a learned
baseline, by more than three robust deviations of the history on that log scale, so that a
metric that is noisy night to night is not flagged for its noise — degrades the check; by
``failed_pct`` or more, fails it. Counts (errors, events) are judged by their own checks, not
against a baseline.

A host's pairwise rates are judged beyond the night's common change (:func:`common_changes`):
where the hosts the matrix does not suspect, :data:`MIN_HOSTS` or more, were slower than their
baselines together (load on the fabric, a slow night), their median ratio is taken out of each
host's value before it is judged. A host regresses when it fell behind the others, as the
matrix judges it within a night; what they lost together is the job's, judged on the job's own
pairwise rates (the median host's, :mod:`dpro.anomaly.health.network`) and its collectives.

A metric with no baseline (a first night, no baseline file) is listed as such in its check's
evidence (``no_baseline``: the reports show the check as "no baseline", never "ok"), and one rule
still holds: the job's bus bandwidth, or a host's probes, below ``line_rate_pct`` percent of what
the NICs' line rate allows (:func:`line_rates_gbps`) degrades the check. A host's probes are
judged so only where the matrix points at no suspect (all of them slow alike): where it does,
the slow probes are the suspect's, graded by their drop (:mod:`dpro.anomaly.health.network`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from dpro.stats import robust_spread

from dpro.anomaly.health.config import HealthConfig, Rules
from dpro.anomaly.health.model import JOB, Check, HealthReport, Metric

__all__ = ["Baseline", "apply_rules", "common_changes", "judge", "learned", "line_rates_gbps", "no_baseline"]

OUTLIER_Z = 3.5
NOISE_SIGMAS = 3.0
MIN_HOSTS = 3
"""The fewest unsuspected hosts with a baseline whose median ratio is taken as the night's
common change: with two, one slow host would move it by half its own drop."""
PEERED = "pairwise"
"""The check whose hosts' metrics are judged beyond the night's common change."""


@dataclass(frozen=True)
class Baseline:
    """An expected value, the robust deviation of the log of the values it was learned from (0
    when given, not learned) and where it came from."""

    value: float
    spread: float
    source: str


def learned(history: Sequence[float], rules: Rules) -> Baseline | None:
    """The baseline learned from earlier values (module docstring), or None with too few."""
    values = np.asarray([v for v in history if np.isfinite(v) and v > 0], np.float64)
    if len(values) < rules.min_nights:
        return None
    logs = np.log(values)
    sigma = robust_spread(logs)
    if sigma > 0:
        values = values[np.abs(logs - np.median(logs)) <= OUTLIER_Z * sigma]
        sigma = robust_spread(np.log(values))
    return Baseline(float(np.median(values)), sigma, f"median of {len(values)} earlier runs")


def judge(metric: Metric, baseline: Baseline, rules: Rules, common: float = 1.0) -> tuple[str, float]:
    """``(status, worse)``: pass, warn or fail, and how much worse than the baseline the value is
    (a fraction of it, negative when better), once the night's ``common`` change
    (:func:`common_changes`; of a value where higher is better) is taken out of it."""
    if baseline.value == 0:
        return "pass", 0.0
    metric = replace(metric, value=metric.value / common)
    worse = (baseline.value - metric.value) / abs(baseline.value)
    if not metric.higher_is_better:
        worse = -worse
    beyond_noise = _log_shortfall(metric, baseline) > NOISE_SIGMAS * baseline.spread
    if worse * 100 >= rules.failed_pct and beyond_noise:
        return "fail", worse
    if worse * 100 >= rules.degraded_pct and beyond_noise:
        return "warn", worse
    return "pass", worse


def _log_shortfall(metric: Metric, baseline: Baseline) -> float:
    """How many times worse than the baseline the value is, on a log scale (inf for a value of 0
    or less where higher is better)."""
    if baseline.spread == 0:
        return np.inf
    if metric.value <= 0:
        return np.inf if metric.higher_is_better else -np.inf
    ratio = float(np.log(baseline.value / metric.value))
    return ratio if metric.higher_is_better else -ratio


def common_changes(judged: Iterable[tuple[str, str, Metric, Baseline]],
                   suspected: set[str]) -> dict[tuple[str, str], float]:
    """The common change each host's value of a peered key (``pairwise/...``, where higher is
    better) is judged beyond, by ``(host, key)``, from ``(host, key, metric, baseline)``: the
    median of the unsuspected hosts' ratios of value to baseline (the judged host's own among
    them), where there are :data:`MIN_HOSTS` or more and it is a loss; else 1 (a common gain is
    not taken out: a host that kept its own baseline has not regressed). The job's own value is
    neither one of them nor judged beyond them."""
    hosts = [(host, key, metric, baseline) for host, key, metric, baseline in judged
             if host != JOB and key.startswith(f"{PEERED}/") and metric.higher_is_better]
    ratios: dict[str, list[float]] = {}
    for host, key, metric, baseline in hosts:
        found = ratios.setdefault(key, [])
        if host not in suspected and baseline.value > 0 and metric.value > 0:
            found.append(metric.value / baseline.value)
    common = {key: min(1.0, float(np.median(found))) if len(found) >= MIN_HOSTS else 1.0
              for key, found in ratios.items()}
    return {(host, key): common[key] for host, key, _, _ in hosts}


def apply_rules(report: HealthReport, config: HealthConfig,
                history: Callable[[str, str], list[float]] | None = None) -> None:
    """Compare every comparable metric of ``report`` with its baseline, set ``Metric.baseline``
    and raise the checks' statuses with the reason. ``history(host, key)``: earlier values of
    ``key`` (``check/metric``) on ``host``, newest first."""
    rates = line_rates_gbps(report)
    compared: list[tuple[str, Check, Metric, Baseline]] = []
    for node in report.nodes:
        for check in node.checks:
            for metric in check.metrics:
                if not metric.comparable:
                    continue
                key = f"{check.name}/{metric.name}"
                expected = config.expected(node.host, key)
                baseline = Baseline(expected, 0.0, "baseline file") if expected is not None else \
                    learned(history(node.host, key)[:config.rules.nights], config.rules) if history else None
                if baseline is None:
                    check.evidence.setdefault("no_baseline", []).append(metric.name)
                    if check.name != PEERED or not report.suspects:
                        _against_line_rate(check, metric, rates.get(node.host), config.rules)
                    continue
                metric.baseline = baseline.value
                compared.append((node.host, check, metric, baseline))
    common = common_changes(((host, f"{c.name}/{m.name}", m, b) for host, c, m, b in compared),
                            {s.host for s in report.suspects if s.kind in ("host", "nic")})
    for host, check, metric, baseline in compared:
        shared = common.get((host, f"{check.name}/{metric.name}"), 1.0)
        if shared < 1.0:
            check.evidence.setdefault("common_change_pct", {})[metric.name] = round((shared - 1) * 100, 1)
        status, worse = judge(metric, baseline, config.rules, shared)
        if status != "pass":
            check.evidence.setdefault("regressions", {})[metric.name] = {
                "value": round(metric.value, 4), "baseline": round(baseline.value, 4),
                "worse_pct": round(worse * 100, 1), "baseline_from": baseline.source,
                **({"common_change_pct": round((shared - 1) * 100, 1)} if shared < 1.0 else {})}
            if shared == 1.0:
                said = f"is {worse:.0%} worse than its baseline {baseline.value:.4g} ({baseline.source})"
            else:
                said = (f"is {1 - metric.value / baseline.value:.0%} below its baseline {baseline.value:.4g} "
                        f"({baseline.source}); with the {1 - shared:.0%} the unsuspected hosts' median lost taken "
                        f"out, {worse:.0%}")
            check.escalate(status, f"{metric.name} {metric.value:.4g} {metric.unit} {said}")


def line_rates_gbps(report: HealthReport) -> dict[str, float]:
    """Each host's line rate (Gb/s): its fastest NIC's (a netdev's ``speed``, an RDMA port's
    ``rate``), which carries the fabric's traffic; the job's: the slowest host's, where there are
    two hosts or more and every one has one (on one host the collectives never cross a NIC)."""
    rates = {}
    for node in report.nodes:
        found = [m.value / 1000 if m.name == "speed_mbps" else m.value for c in node.checks if c.name.startswith("nic.")
                 for m in c.metrics if m.name in ("speed_mbps", "rate_gbps")]
        if found:
            rates[node.host] = max(found)
    hosts = [n.host for n in report.nodes if n.host != JOB]
    if len(hosts) > 1 and all(h in rates for h in hosts):
        rates[JOB] = min(rates[h] for h in hosts)
    return rates


def _against_line_rate(check: Check, metric: Metric, rate_gbps: float | None, rules: Rules) -> None:
    """Degrade ``check`` where ``metric`` (a probe's or a collective's Gb/s) is below
    ``rules.line_rate_pct`` percent of the line rate."""
    measured = check.name == "pairwise" or check.name.startswith("collective.")
    if not (measured and metric.unit == "Gb/s" and rate_gbps and rules.line_rate_pct > 0):
        return
    share = metric.value / rate_gbps
    if share * 100 < rules.line_rate_pct:
        check.evidence.setdefault("below_line_rate", {})[metric.name] = {
            "value": round(metric.value, 4), "line_rate_gbps": rate_gbps, "share_pct": round(share * 100, 3)}
        check.escalate("warn", f"{metric.name} {metric.value:.3g} Gb/s is {share:.2%} of the NICs' line rate "
                               f"{rate_gbps:g} Gb/s (below {rules.line_rate_pct:g}%, with no baseline to compare)")


def no_baseline(check: Check) -> bool:
    """Whether ``check`` passed only for want of a baseline: every metric a rule would compare
    had none (a first night)."""
    compared = [m for m in check.metrics if m.comparable]
    return check.status == "pass" and bool(compared) and \
        set(check.evidence.get("no_baseline", ())) >= {m.name for m in compared}
