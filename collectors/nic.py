"""Snapshots of NIC counters: RDMA port counters and netdev statistics from sysfs.

The reading itself lives in :mod:`dpro.anomaly.sysfs`, shared with the anomaly layer; the sysfs
root is configurable (``DPRO_SYSFS_ROOT`` or the ``root`` argument) so that a recorded tree from
a machine with RDMA NICs can be read where none exists.
"""

from __future__ import annotations

import os
import time
from typing import Any

from dpro.anomaly.sysfs import SYSFS_ROOT_ENV, read_netdev_statistics, read_rdma_ports, sysfs_dir

__all__ = ["SYSFS_ROOT_ENV", "snapshot"]


def snapshot(root: str | os.PathLike | None = None) -> dict[str, Any]:
    """All NIC counters of this host now, with a one-line note per missing source."""
    rdma = read_rdma_ports(root)
    netdev = read_netdev_statistics(root)
    notes = {}
    if not rdma:
        notes["rdma"] = f"no RDMA devices under {sysfs_dir(root) / 'class' / 'infiniband'}"
    if not netdev:
        notes["netdev"] = f"no network interfaces under {sysfs_dir(root) / 'class' / 'net'}"
    return {"time_ns": time.time_ns(), "rdma": rdma, "netdev": netdev, "notes": notes}
