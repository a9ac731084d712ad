"""The CPU time the hypervisor took from each host during the check (steal time).

Each host's lowest rank reads ``/proc/stat`` before and after the job-wide tests; its ``cpu``
check keeps ``steal_pct``, the share of the CPU time its CPUs wanted that the hypervisor ran
something else in (:func:`dpro.collectors.counters.procstat.steal_share`). The value is only
recorded, never compared with its baseline: the other tenants' load moves it by the hour. A host
whose share stands out from the check's other hosts' (:func:`dpro.anomaly.steal.stolen_hosts`:
10 points above their median) warns, and a host or NIC the pairwise matrix suspects there says
that its probes ran on CPUs the hypervisor took. A check of one host judges none: on its own a
share cannot tell a stolen host from a contended cloud.
"""

from __future__ import annotations

import os

from dpro.anomaly.steal import stolen_hosts
from dpro.anomaly.suspects import Suspect
from dpro.collectors.counters.procstat import PROC_STAT, read_cpu_times, steal_share

from dpro.anomaly.health.model import Check, HealthReport, Metric

__all__ = ["CpuWatch", "judge_steal"]


class CpuWatch:
    """This host's CPU time at :meth:`start` and :meth:`finish`; ``path``: where ``/proc/stat``
    is (a written copy in tests)."""

    def __init__(self, path: str | os.PathLike = PROC_STAT) -> None:
        self.path = path
        self._before: dict[str, int] = {}

    def start(self) -> None:
        self._before, _ = read_cpu_times(self.path)

    def finish(self) -> list[Check]:
        """The ``cpu`` check with ``steal_pct`` (skipped where the kernel keeps no steal time)."""
        after, note = read_cpu_times(self.path)
        share = steal_share(self._before, after)
        if share is None:
            return [Check("cpu", "skip", note or "the CPUs wanted no time during the check")]
        return [Check("cpu", metrics=[Metric("steal_pct", 100 * share, "%")],
                      evidence={"steal_share": round(share, 4)})]


def judge_steal(report: HealthReport, suspects: list[Suspect]) -> None:
    """Warn on each host whose stolen CPU stands out from the other hosts' (two hosts or more),
    and say so in the evidence of the ``suspects`` on those hosts."""
    checks = {node.host: check for node in report.nodes for check in node.checks
              if check.name == "cpu" and "steal_share" in check.evidence}
    shares = {host: check.evidence["steal_share"] for host, check in checks.items()}
    if len(shares) < 2:
        return
    for host, usual in stolen_hosts(shares).items():
        checks[host].evidence["other_hosts_steal_share"] = round(usual, 4)
        checks[host].escalate("warn", f"the hypervisor took {100 * shares[host]:.0f}% of the CPU time its CPUs "
                                      f"wanted, the other hosts {100 * usual:.0f}%")
        for suspect in suspects:
            if suspect.host == host:
                suspect.evidence["steal_share"] = shares[host]
                suspect.evidence["other_hosts_steal_share"] = round(usual, 4)
