"""NIC checks through the counter layer (:mod:`dpro.collectors.counters`): each RDMA port's state,
physical state and rate, each network interface's state and speed, and the fault counters
(errors, discards, link losses, retries) before and after the job-wide tests.

A netdev's ``rx_dropped`` is left out: Linux counts there every frame nobody wanted (an unknown
protocol, a multicast group no one joined), which says nothing about the link.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path

from dpro.collectors.counters.catalog import FAULT_COUNTERS
from dpro.collectors.counters.snapshot import Snapshot, diff, take_snapshot
from dpro.collectors.counters.sysfs import rdma_devices, sysfs_dir

from dpro.anomaly.health.model import Check, Metric

__all__ = ["NicWatch"]

BENIGN = {("netdev", "rx_drops")}
_RATE = re.compile(r"([\d.]+)\s*Gb/sec")


class NicWatch:
    """Counters of this host's RDMA ports and network interfaces at :meth:`start` and
    :meth:`finish`; ``root``: where sysfs is (a recorded copy in tests)."""

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = root
        self._before: Snapshot | None = None

    def start(self) -> None:
        self._before = take_snapshot(self.root, netdev=self._interfaces(), gpu=False, cpu=False)

    def finish(self) -> list[Check]:
        """One check per RDMA port and per interface that is up (one skipped check when there is none)."""
        interfaces = self._interfaces()
        after = take_snapshot(self.root, netdev=interfaces, gpu=False, cpu=False)
        faults: dict[str, dict[str, int]] = defaultdict(dict)
        if self._before is not None:
            for rate in diff(self._before, after).rates:
                if rate.canonical in FAULT_COUNTERS and rate.delta and (rate.source, rate.canonical) not in BENIGN:
                    faults[rate.device][rate.canonical] = faults[rate.device].get(rate.canonical, 0) + int(rate.delta)
        checks = self._rdma_checks(faults) + self._netdev_checks(interfaces, faults)
        return checks or [Check("nic", "skip", "no RDMA port and no network interface up")]

    def _interfaces(self) -> list[str]:
        base = sysfs_dir(self.root) / "class" / "net"
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if p.name != "lo" and _read(p / "operstate") in ("up", "unknown"))

    def _rdma_checks(self, faults: dict[str, dict[str, int]]) -> list[Check]:
        checks = []
        base = sysfs_dir(self.root) / "class" / "infiniband"
        for dev in rdma_devices(self.root):
            ports = base / dev / "ports"
            for port in sorted(ports.iterdir()) if ports.is_dir() else []:
                name = f"{dev}/{port.name}"
                state, phys, rate = _read(port / "state"), _read(port / "phys_state"), _read(port / "rate")
                check = Check(f"nic.{name}", evidence={"state": state, "phys_state": phys, "rate": rate})
                if m := _RATE.search(rate or ""):
                    check.metrics.append(Metric("rate_gbps", float(m.group(1)), "Gb/s", True))
                if state and "ACTIVE" not in state:
                    check.escalate("fail", f"port state {state}")
                if phys and "LinkUp" not in phys:
                    check.escalate("fail", f"physical state {phys}")
                _add_faults(check, faults.get(name, {}))
                checks.append(check)
        return checks

    def _netdev_checks(self, interfaces: list[str], faults: dict[str, dict[str, int]]) -> list[Check]:
        checks = []
        base = sysfs_dir(self.root) / "class" / "net"
        for iface in interfaces:
            speed = _read(base / iface / "speed")
            check = Check(f"nic.{iface}", evidence={"operstate": _read(base / iface / "operstate")})
            if speed and speed.lstrip("-").isdigit() and int(speed) > 0:
                check.metrics.append(Metric("speed_mbps", float(speed), "Mb/s", True))
            _add_faults(check, faults.get(iface, {}))
            checks.append(check)
        return checks


def _add_faults(check: Check, grown: dict[str, int]) -> None:
    for name, value in sorted(grown.items()):
        check.metrics.append(Metric(name, float(value), "count", False))
    if grown:
        check.evidence["faults_during_check"] = grown
        check.escalate("warn", "fault counters went up: " + ", ".join(f"{k} +{v}" for k, v in sorted(grown.items())))


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # absent, or EINVAL (a veth's speed when down)
        return None
