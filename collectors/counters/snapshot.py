"""Counter snapshots of one host (RDMA ports, netdev, ``ethtool -S``, NVML) and their rates.

A :class:`Snapshot` is every counter read at one instant, keyed by (source, device, raw name),
with the driver of each device, a note for each source that could not be read, and the host's
CPU time (``cpu_times``, apart from the counters, whose sources readers of run format 1.4 know).
:func:`diff` turns two snapshots into per-second rates, in canonical names and units (bytes, not
the 4-byte words of ``port_xmit_data``), across wrap-around (:mod:`dpro.collectors.counters.wrap`).

Missing hardware never raises: a device, interface, GPU or tool that is not there gives a note.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from dpro.collectors.counters import sysfs
from dpro.collectors.counters.catalog import NOT_COUNTERS, describe
from dpro.collectors.counters.ethtool import read_ethtool_file, run_ethtool_stats
from dpro.collectors.counters.nvml import read_gpu_counters
from dpro.collectors.counters.procstat import read_cpu_times
from dpro.collectors.counters.wrap import delta


class CounterKey(NamedTuple):
    """Where a counter comes from: ``source`` (see :mod:`dpro.collectors.counters.catalog`), ``device``
    (``mlx5_0/1`` for port 1 of an RDMA device, an interface name, ``gpu0``) and its raw name."""

    source: str
    device: str
    name: str


@dataclass(frozen=True)
class Snapshot:
    """Counters of one host at one instant."""

    host: str
    time_ns: int  # wall clock, for the record
    monotonic_ns: int  # for elapsed time between two snapshots of the same host
    values: dict[CounterKey, int]
    drivers: dict[str, str] = field(default_factory=dict)  # device -> kernel driver
    notes: list[str] = field(default_factory=list)
    cpu_times: dict[str, int] = field(default_factory=dict)  # /proc/stat's, by state (:mod:`.procstat`)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per counter: source, device, name, canonical, unit, value (raw), value_in_unit."""
        out = []
        for key, value in sorted(self.values.items()):
            info = describe(key.source, key.name, self.drivers.get(key.device))
            out.append({**key._asdict(), "canonical": info.canonical, "unit": info.unit,
                        "value": value, "value_in_unit": value * info.scale})
        return out

    def to_frame(self) -> Any:
        """The counters as a pandas DataFrame (columns of :meth:`rows`)."""
        import pandas as pd

        return pd.DataFrame(self.rows(), columns=["source", "device", "name", "canonical", "unit", "value",
                                                  "value_in_unit"])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form; :meth:`from_dict` reads it back."""
        return {"host": self.host, "time_ns": self.time_ns, "monotonic_ns": self.monotonic_ns,
                "counters": [[*key, value] for key, value in sorted(self.values.items())],
                "drivers": self.drivers, "notes": self.notes, "cpu_times": self.cpu_times}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Snapshot:
        """The snapshot written by :meth:`to_dict`."""
        return cls(host=d["host"], time_ns=d["time_ns"], monotonic_ns=d["monotonic_ns"],
                   values={CounterKey(s, dev, n): v for s, dev, n, v in d["counters"]},
                   drivers=dict(d.get("drivers", {})), notes=list(d.get("notes", [])),
                   cpu_times=dict(d.get("cpu_times", {})))


def take_snapshot(root: str | os.PathLike | None = None, *, rdma: Iterable[str] | None = None,
                  netdev: Iterable[str] | None = None, ethtool: Iterable[str] = (),
                  ethtool_files: Mapping[str, str | os.PathLike] | None = None,
                  gpu: bool = True, cpu: bool = True) -> Snapshot:
    """Read this host's counters now.

    ``root``: where sysfs is (:func:`dpro.collectors.counters.sysfs.sysfs_dir`). ``rdma``/``netdev``: the
    RDMA devices / interfaces to read, all when None, none when empty. ``ethtool``: interfaces to
    run ``ethtool -S`` on; ``ethtool_files``: ``{interface: recorded ethtool -S output}``.
    ``gpu``: read NVML counters. ``cpu``: read the CPU time of the host this runs on
    (``/proc/stat``, whatever ``root`` is).
    """
    values: dict[CounterKey, int] = {}
    drivers: dict[str, str] = {}
    notes: list[str] = []
    _read_rdma(root, rdma, values, drivers, notes)
    _read_netdev(root, netdev, values, drivers, notes)
    readings = [(iface, run_ethtool_stats(iface)) for iface in ethtool]
    readings += [(iface, read_ethtool_file(path)) for iface, path in (ethtool_files or {}).items()]
    for iface, (stats, note) in readings:
        values.update({CounterKey("ethtool", iface, name): v for name, v in stats.items()})
        if driver := sysfs.netdev_driver(root, iface):
            drivers[iface] = driver
        if note:
            notes.append(note)
    if gpu:
        gpus, gpu_notes = read_gpu_counters()
        values.update({CounterKey("gpu", dev, name): v for dev, fields in gpus.items() for name, v in fields.items()})
        notes += gpu_notes
    times, note = read_cpu_times() if cpu else ({}, None)
    notes += [note] if note else []
    return Snapshot(socket.gethostname(), time.time_ns(), time.monotonic_ns(), values, drivers, notes, times)


def _absent(where: Path, things: str, thing: str, wanted: list[str] | None, found: Collection[str]) -> list[str]:
    """Notes on what was not found under ``where``: no ``things`` at all (when any would do),
    or each ``thing`` of ``wanted`` that is missing."""
    if wanted is None:
        return [] if found else [f"no {things} under {where}"]
    return [f"{thing} {name} not found under {where}" for name in wanted if name not in found]


def _read_rdma(root: str | os.PathLike | None, devices: Iterable[str] | None, values: dict[CounterKey, int],
               drivers: dict[str, str], notes: list[str]) -> None:
    wanted = None if devices is None else list(devices)
    ports = sysfs.read_rdma_ports(root, wanted)
    notes += _absent(sysfs.sysfs_dir(root) / "class" / "infiniband", "RDMA devices", "RDMA device", wanted, ports)
    for dev, by_port in ports.items():
        driver = sysfs.rdma_driver(root, dev)
        for port, kinds in by_port.items():
            device = f"{dev}/{port}"
            if driver:
                drivers[device] = driver
            if not kinds["hw_counters"]:
                notes.append(f"{device}: no hw_counters (none exposed by the driver, or unreadable)")
            for kind, source in (("counters", "rdma"), ("hw_counters", "rdma_hw")):
                values.update({CounterKey(source, device, name): v for name, v in kinds[kind].items()
                               if (source, name) not in NOT_COUNTERS})


def _read_netdev(root: str | os.PathLike | None, interfaces: Iterable[str] | None, values: dict[CounterKey, int],
                 drivers: dict[str, str], notes: list[str]) -> None:
    wanted = None if interfaces is None else list(interfaces)
    stats = sysfs.read_netdev_statistics(root, wanted)
    notes += _absent(sysfs.sysfs_dir(root) / "class" / "net", "network interfaces", "interface", wanted, stats)
    for iface, counters in stats.items():
        if driver := sysfs.netdev_driver(root, iface):
            drivers[iface] = driver
        values.update({CounterKey("netdev", iface, name): v for name, v in counters.items()})


@dataclass(frozen=True)
class CounterRate:
    """How one counter moved between two snapshots; ``delta`` is in ``unit`` (None: unknown)."""

    source: str
    device: str
    name: str
    canonical: str | None
    unit: str
    delta: int | None
    per_s: float | None
    wrapped: bool = False


@dataclass(frozen=True)
class CounterDiff:
    """Rates of every counter present in both snapshots, and notes (resets, wraps, missing)."""

    elapsed_s: float
    rates: list[CounterRate]
    notes: list[str] = field(default_factory=list)

    def find(self, name: str, device: str | None = None, source: str | None = None) -> list[CounterRate]:
        """The rates whose raw or canonical name is ``name`` (optionally of one device/source)."""
        return [r for r in self.rates if name in (r.name, r.canonical)
                and device in (None, r.device) and source in (None, r.source)]

    def to_frame(self) -> Any:
        """The rates as a pandas DataFrame, one row per counter."""
        import pandas as pd

        return pd.DataFrame([r.__dict__ for r in self.rates], columns=list(CounterRate.__dataclass_fields__))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {"elapsed_s": self.elapsed_s, "rates": [r.__dict__ for r in self.rates], "notes": self.notes}


def diff(before: Snapshot, after: Snapshot) -> CounterDiff:
    """Per-second rates from ``before`` to ``after`` (two snapshots of the same host)."""
    same_host = before.host == after.host
    elapsed_s = ((after.monotonic_ns - before.monotonic_ns) if same_host else (after.time_ns - before.time_ns)) / 1e9
    notes = list(dict.fromkeys(before.notes + after.notes))
    if not same_host:
        notes.append(f"snapshots of two hosts ({before.host}, {after.host}): elapsed time from their wall clocks")
    if elapsed_s <= 0:
        notes.append(f"elapsed time is {elapsed_s:g} s: no per-second rates")
    rates = []
    for key in sorted(before.values.keys() & after.values.keys()):
        info = describe(key.source, key.name, after.drivers.get(key.device))
        d = delta(before.values[key], after.values[key], info.width, info.saturates)
        if d.note:
            notes.append(f"{key.source} {key.device} {key.name}: {d.note}")
        value = None if d.value is None else d.value * info.scale
        per_s = value / elapsed_s if value is not None and elapsed_s > 0 else None
        rates.append(CounterRate(*key, info.canonical, info.unit, value, per_s, d.wrapped))
    for key in sorted(before.values.keys() ^ after.values.keys()):
        when = "before" if key in before.values else "after"
        notes.append(f"{key.source} {key.device} {key.name}: only in the snapshot {when}")
    return CounterDiff(elapsed_s, rates, notes)
