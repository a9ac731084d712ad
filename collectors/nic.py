"""Snapshots of NIC counters: RDMA port counters and netdev statistics from sysfs.

The sysfs root is configurable (``DPRO_SYSFS_ROOT`` or the ``root`` argument) so that a recorded
tree from a machine with RDMA NICs can be read where none exists.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SYSFS_ROOT_ENV = "DPRO_SYSFS_ROOT"


def sysfs_root(root: str | os.PathLike | None = None) -> Path:
    """The sysfs root to read: ``root``, else ``$DPRO_SYSFS_ROOT``, else ``/sys``."""
    return Path(root or os.environ.get(SYSFS_ROOT_ENV) or "/sys")


def _read_counter_dir(d: Path) -> dict[str, int]:
    values: dict[str, int] = {}
    if not d.is_dir():
        return values
    for f in sorted(d.iterdir()):
        try:
            values[f.name] = int(f.read_text().strip())
        except (OSError, ValueError):
            continue  # write-only or non-numeric entries (e.g. hw_counters/lifespan is numeric, others not)
    return values


def read_rdma_counters(root: str | os.PathLike | None = None) -> dict[str, dict[str, dict[str, dict[str, int]]]]:
    """``{device: {port: {"counters": {...}, "hw_counters": {...}}}}`` for every RDMA port."""
    base = sysfs_root(root) / "class" / "infiniband"
    out: dict[str, dict[str, dict[str, dict[str, int]]]] = {}
    if not base.is_dir():
        return out
    for dev in sorted(base.iterdir()):
        ports = dev / "ports"
        if not ports.is_dir():
            continue
        out[dev.name] = {
            port.name: {kind: _read_counter_dir(port / kind) for kind in ("counters", "hw_counters")}
            for port in sorted(ports.iterdir())
        }
    return out


def read_netdev_statistics(root: str | os.PathLike | None = None) -> dict[str, dict[str, int]]:
    """``{interface: {statistic: value}}`` from ``class/net/*/statistics``."""
    base = sysfs_root(root) / "class" / "net"
    if not base.is_dir():
        return {}
    return {iface.name: _read_counter_dir(iface / "statistics") for iface in sorted(base.iterdir())}


def snapshot(root: str | os.PathLike | None = None) -> dict[str, Any]:
    """All NIC counters of this host now, with a one-line note per missing source."""
    import time

    rdma = read_rdma_counters(root)
    netdev = read_netdev_statistics(root)
    notes = {}
    if not rdma:
        notes["rdma"] = f"no RDMA devices under {sysfs_root(root) / 'class' / 'infiniband'}"
    if not netdev:
        notes["netdev"] = f"no network interfaces under {sysfs_root(root) / 'class' / 'net'}"
    return {"time_ns": time.time_ns(), "rdma": rdma, "netdev": netdev, "notes": notes}
