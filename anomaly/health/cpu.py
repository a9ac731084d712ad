"""The CPU time the hypervisor took from each host during the check (steal time).

Each host's lowest rank reads ``/proc/stat`` before and after the job-wide tests; its ``cpu``
check keeps ``steal_pct``, the share of the CPU time its CPUs wanted that the hypervisor ran
something else in (:func:`dpro.collectors.counters.procstat.steal_share`). The value is only
recorded, never compared with its baseline: the other tenants' load moves it by the hour. A host
whose share stands out from the check's other hosts' (:func:`dpro.anomaly.steal.stolen_hosts`:
10 points above their median) warns, and a host or NIC the pairwise matrix suspects there says
that its probes ran on CPUs the hypervisor took. A warned host's nightly verdict is degraded, so
``dpro health --npd`` reads it as a problem until the next night.

A check of one host judges none, where ``dpro diagnose`` names a run's lone host at 10%: a slow
run asks what slowed it, and a tenth of its CPU taken is an answer; a nightly grade of a host
asks whether it is worse than its peers, and a share alone cannot tell a stolen host from a
contended cloud.
"""

from __future__ import annotations

import os

from dpro.anomaly.steal import stolen_hosts
from dpro.collectors.counters.procstat import PROC_STAT, read_cpu_times, steal_share

from dpro.anomaly.health.model import Check, HealthReport, Metric

__all__ = ["CpuWatch", "judge_steal"]


class CpuWatch:
    """This host's CPU time at :meth:`start` and :meth:`finish`; ``path``: where ``/proc/stat``
    is (a written copy in tests)."""

    def __init__(self, path: str | os.PathLike = PROC_STAT) -> None:
        self.path = path
        self._before: dict[str, int] = {}
        self._note: str | None = None

    def start(self) -> None:
        self._before, self._note = read_cpu_times(self.path)

    def finish(self) -> list[Check]:
        """The ``cpu`` check with ``steal_pct`` (skipped, with why, where the kernel keeps no
        steal time or the readings cannot be compared)."""
        after, note = read_cpu_times(self.path)
        share = steal_share(self._before, after)
        if share is None:
            why = self._note or note or "no usable CPU times: none wanted, or a counter went back"
            return [Check("cpu", "skip", why)]
        return [Check("cpu", metrics=[Metric("steal_pct", 100 * share, "%")],
                      evidence={"steal_share": round(share, 4)})]


def judge_steal(report: HealthReport) -> None:
    """Warn on each host whose stolen CPU stands out from the other hosts' (two hosts or more),
    and say so in the evidence of the report's suspects on those hosts."""
    checks = {node.host: check for node in report.nodes for check in node.checks
              if check.name == "cpu" and "steal_share" in check.evidence}
    shares = {host: check.evidence["steal_share"] for host, check in checks.items()}
    if len(shares) < 2:
        return
    for host, usual in stolen_hosts(shares).items():
        checks[host].evidence["other_hosts_steal_share"] = round(usual, 4)
        checks[host].escalate("warn", f"the hypervisor took {100 * shares[host]:.0f}% of the CPU time its CPUs "
                                      f"wanted, the other hosts {100 * usual:.0f}%")
        for suspect in report.suspects:
            if suspect.host == host:
                suspect.evidence["steal_share"] = shares[host]
                suspect.evidence["other_hosts_steal_share"] = round(usual, 4)
