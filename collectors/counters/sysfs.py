"""Reading RDMA port counters and netdev statistics from a sysfs tree.

The tree is found from a *root*: the ``root`` argument, else ``$DPRO_SYSFS_ROOT``, else ``/``.
A root that holds ``class/`` is a sysfs tree itself (what ``dpro record --sysfs-root`` takes,
e.g. a copy of ``/sys``); any other root is a filesystem root whose sysfs is ``<root>/sys``
(``/`` gives ``/sys``; a recorded tree ``before/`` gives ``before/sys``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

SYSFS_ROOT_ENV = "DPRO_SYSFS_ROOT"
RDMA_KINDS = ("counters", "hw_counters")


def sysfs_dir(root: str | os.PathLike | None = None) -> Path:
    """The sysfs directory to read for ``root`` (see the module's rule)."""
    base = Path(root or os.environ.get(SYSFS_ROOT_ENV) or "/")
    return base if (base / "class").is_dir() else base / "sys"


def read_counter_dir(d: Path) -> dict[str, int]:
    """``{file name: integer value}`` of a counters directory; unreadable or non-numeric files are left out."""
    values: dict[str, int] = {}
    if not d.is_dir():
        return values
    for f in sorted(d.iterdir()):
        try:
            values[f.name] = int(f.read_text().strip())
        except (OSError, ValueError):
            continue  # write-only or non-numeric entries
    return values


def rdma_devices(root: str | os.PathLike | None = None) -> list[str]:
    """Names of the RDMA devices under ``class/infiniband``."""
    base = sysfs_dir(root) / "class" / "infiniband"
    return sorted(p.name for p in base.iterdir()) if base.is_dir() else []


def read_rdma_ports(root: str | os.PathLike | None = None, devices: Iterable[str] | None = None,
                    ) -> dict[str, dict[str, dict[str, dict[str, int]]]]:
    """``{device: {port: {"counters": {...}, "hw_counters": {...}}}}``; all devices when ``devices`` is None.

    A device that does not exist is left out; a port without ``hw_counters`` gets an empty dict.
    """
    base = sysfs_dir(root) / "class" / "infiniband"
    out: dict[str, dict[str, dict[str, dict[str, int]]]] = {}
    for dev in rdma_devices(root) if devices is None else devices:
        ports = base / dev / "ports"
        if ports.is_dir():
            out[dev] = {port.name: {kind: read_counter_dir(port / kind) for kind in RDMA_KINDS}
                        for port in sorted(ports.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0)}
    return out


def net_interfaces(root: str | os.PathLike | None = None) -> list[str]:
    """Names of the network interfaces under ``class/net``."""
    base = sysfs_dir(root) / "class" / "net"
    return sorted(p.name for p in base.iterdir()) if base.is_dir() else []


def read_netdev_statistics(root: str | os.PathLike | None = None, interfaces: Iterable[str] | None = None,
                           ) -> dict[str, dict[str, int]]:
    """``{interface: {statistic: value}}`` from ``class/net/*/statistics``; missing interfaces are left out."""
    base = sysfs_dir(root) / "class" / "net"
    names = net_interfaces(root) if interfaces is None else interfaces
    return {name: read_counter_dir(base / name / "statistics") for name in names
            if (base / name / "statistics").is_dir()}


def driver_of(device_dir: Path) -> str | None:
    """The kernel driver bound to a sysfs device (the name its ``device/driver`` link points to)."""
    try:
        return os.path.basename(os.readlink(device_dir / "device" / "driver"))
    except OSError:
        return None


def rdma_driver(root: str | os.PathLike | None, device: str) -> str | None:
    """The driver of an RDMA device (``mlx5_core`` for ``mlx5_0``); from sysfs, else from the name."""
    driver = driver_of(sysfs_dir(root) / "class" / "infiniband" / device)
    if driver is None and device.startswith("mlx5_"):
        driver = "mlx5_core"  # the default name of mlx5 devices, for trees recorded without links
    return driver


def netdev_driver(root: str | os.PathLike | None, interface: str) -> str | None:
    """The driver of a network interface (``mlx5_core``, ``virtio_net``...), None for virtual ones."""
    return driver_of(sysfs_dir(root) / "class" / "net" / interface)
