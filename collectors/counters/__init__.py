"""Host counters: RDMA ports, netdev statistics, ``ethtool -S`` and NVML, in one snapshot format.

:func:`take_snapshot` reads every counter of this host at one instant (:class:`Snapshot`, whose
:meth:`~Snapshot.to_dict` form is what ``dpro record`` writes into each node's
``counters-start.json`` and ``counters-end.json``); :func:`diff` turns two snapshots into
per-second rates in canonical names and units, across counter wrap. The readers
(:mod:`.sysfs`, :mod:`.ethtool`, :mod:`.nvml`; :mod:`.procstat` for the host's CPU time), the
counter catalog (:mod:`.catalog`) and the wrap rule (:mod:`.wrap`) are modules of their own;
``python -m dpro.collectors.counters`` prints a snapshot as JSON (what the traffic engines run on
each endpoint).
"""

from __future__ import annotations

from dpro.collectors.counters.snapshot import CounterDiff, CounterKey, CounterRate, Snapshot, diff, take_snapshot

__all__ = ["CounterDiff", "CounterKey", "CounterRate", "Snapshot", "diff", "take_snapshot"]
