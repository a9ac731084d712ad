"""The allocator's memory events of a trace recorded with ``profile_memory=True``.

Each ``[memory]`` instant event is one allocation (``Bytes`` > 0) or free (< 0) and carries the
allocator's ``Total Allocated`` after it. On CUDA that total is the caching allocator's, all the
process holds on the device; on the CPU it counts only what was allocated since the profiler
started (it starts from zero). The peak a step added on top of what it began with is the same
on both: the highest total less the total before the first event. Traces from before Kineto
wrote the total (2021) have only ``Bytes``: the total is then their running sum.
"""

from __future__ import annotations

import gzip
import itertools
import os
import zlib
from pathlib import Path

import msgspec

from dpro.graph.kineto.schema import TraceFormatError

__all__ = ["MemoryPeak", "memory_peaks"]

MEMORY_EVENT = "[memory]"
DEVICE_TYPES = {0: "cpu", 1: "cuda"}


class _Args(msgspec.Struct, gc=False):
    total_allocated: int | float | None = msgspec.field(name="Total Allocated", default=None)
    nbytes: int | float = msgspec.field(name="Bytes", default=0)
    device_type: int = msgspec.field(name="Device Type", default=-1)
    device_id: int = msgspec.field(name="Device Id", default=-1)


class _Event(msgspec.Struct, gc=False):
    name: str | None = None
    ts: int | float = 0
    args: _Args | None = None


class _File(msgspec.Struct):
    traceEvents: list[_Event] = []


_DECODER = msgspec.json.Decoder(_File)


class MemoryPeak(msgspec.Struct, frozen=True):
    """One device's memory in a trace: ``added_bytes``, the most allocated on top of what was
    held before the trace's first allocation; ``total_bytes``, the highest ``Total
    Allocated`` (on the CPU, counted from the profiler's start); ``events``."""

    device: str
    added_bytes: int
    total_bytes: int
    events: int


def memory_peaks(path: str | os.PathLike) -> list[MemoryPeak]:
    """The memory peak of each device in the trace at ``path`` (``.json`` or ``.json.gz``); an
    empty list when the trace holds no memory events (recorded without ``profile_memory``)."""
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
        trace = _DECODER.decode(raw)
    except (OSError, EOFError, zlib.error, msgspec.DecodeError) as e:
        raise TraceFormatError(f"cannot read the memory events of {path}: {str(e).splitlines()[0]}") from None
    per_device: dict[tuple[int, int], list[_Args]] = {}
    for e in sorted((e for e in trace.traceEvents if e.name == MEMORY_EVENT and e.args is not None),
                    key=lambda e: e.ts):
        per_device.setdefault((e.args.device_type, e.args.device_id), []).append(e.args)
    peaks = []
    for (kind, index), events in sorted(per_device.items()):
        if any(e.total_allocated is None for e in events):
            totals = list(itertools.accumulate(e.nbytes for e in events))
        else:
            totals = [e.total_allocated for e in events]
        before = totals[0] - events[0].nbytes
        top = max(totals)
        name = DEVICE_TYPES.get(kind, f"device-type-{kind}")
        peaks.append(MemoryPeak(name if index < 0 else f"{name}:{index}", max(0, int(top - before)), int(top),
                                len(events)))
    return peaks
