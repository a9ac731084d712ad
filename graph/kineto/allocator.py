"""The allocator's memory events of a trace recorded with ``profile_memory=True``.

Each ``[memory]`` instant event is one allocation (``Bytes`` > 0) or free (< 0) and carries the
allocator's ``Total Allocated`` after it. On CUDA that total is the caching allocator's, all the
process holds on the device; on the CPU it counts only what was allocated since the profiler
started (it starts from zero). The peak a step added on top of what it began with is the same
on both: the highest total less the total before the first event. Traces from before Kineto
wrote the total (2021) have only ``Bytes``: the total is then their running sum.

**Frees the profiler misses.** The profiler sees a free only on a thread it follows: a tensor
whose last reference is dropped elsewhere (gloo's worker thread releasing a finished collective
after FSDP dropped its output) is freed unseen. A GPU's total is the caching allocator's own and
drops for it all the same; the CPU's never does (torch counts the block until the process ends,
and counts its address again once reused), nor does a running sum of the events. There the
allocator handing out the same address again, with no free between, proves such a free: the
totals drop by the block at that reallocation, the latest it can have been freed. Whether it
was still held at the peak cannot be told (:attr:`MemoryPeak.unseen_free_bytes`). A free
missed on an address never handed out again stays counted.
"""

from __future__ import annotations

import bisect
import itertools
import os
import re

import msgspec

from dpro.graph.kineto.schema import TraceFormatError, whole_text

__all__ = ["DeviceMemory", "MemoryPeak", "MemoryTrace", "memory_peaks"]

MEMORY_EVENT = "[memory]"
DEVICE_TYPES = {0: "cpu", 1: "cuda"}


class _Args(msgspec.Struct, gc=False):
    total_allocated: int | float | None = msgspec.field(name="Total Allocated", default=None)
    nbytes: int | float = msgspec.field(name="Bytes", default=0)
    device_type: int = msgspec.field(name="Device Type", default=-1)
    device_id: int = msgspec.field(name="Device Id", default=-1)
    addr: int | None = msgspec.field(name="Addr", default=None)


class _Event(msgspec.Struct, gc=False):
    name: str | None = None
    ts: int | float = 0
    args: _Args | None = None


class _File(msgspec.Struct):
    traceEvents: list[_Event] = []


_DECODER = msgspec.json.Decoder(_File)


class MemoryPeak(msgspec.Struct, frozen=True):
    """One device's memory in a trace: ``added_bytes``, the most allocated on top of what was
    held before the trace's first allocation; ``total_bytes``, the highest total (``Total
    Allocated``, less the frees the profiler missed where they are proven; on the CPU, counted
    from the profiler's start); ``events``; ``allocations``, the sizes of the trace's
    allocations still held at the peak, largest first (empty where the events name no
    addresses); ``unseen_free_bytes``, how much of the peak is allocations freed where the
    profiler did not see it, their address handed out again only after the peak: they may have
    been freed before it (0 on a GPU, whose total is right whichever thread frees)."""

    device: str
    added_bytes: int
    total_bytes: int
    events: int
    allocations: list[int] = []
    unseen_free_bytes: int = 0


def memory_peaks(path: str | os.PathLike) -> list[MemoryPeak]:
    """The memory peak of each device in the trace at ``path`` (``.json`` or ``.json.gz``); an
    empty list when the trace holds no memory events (recorded without ``profile_memory``)."""
    return MemoryTrace.read(path).peaks()


class DeviceMemory(msgspec.Struct, frozen=True):
    """One device's allocator events in time order: their times (us), the total allocated after
    each (less the frees the profiler missed, from the reallocation that proves each), the
    total before the first, the sizes of the allocations made since then and still held at the
    highest total (first reached), largest first, and the bytes of those whose free was missed
    (:attr:`MemoryPeak.unseen_free_bytes`)."""

    times: list[float]
    totals: list[float]
    before: float
    at_peak: list[int] = []
    unseen_at_peak: int = 0


class MemoryTrace(msgspec.Struct, frozen=True):
    """The memory events of a trace, by device (:class:`DeviceMemory`), with the earliest start
    of each other event's name: all that each device's peak (:meth:`peaks`) and what a device
    held when named events began (:meth:`added_before`) read. Small, and encodable with
    msgspec (the run model caches it)."""

    devices: dict[str, DeviceMemory]
    first_starts: dict[str, float]

    @classmethod
    def read(cls, path: str | os.PathLike) -> MemoryTrace:
        """The memory events of the trace at ``path`` (.json or .json.gz)."""
        return cls.decode(whole_text(path, "the memory events of "), path)

    @classmethod
    def decode(cls, raw: bytes, path: str | os.PathLike) -> MemoryTrace:
        """The memory events of the trace whose decompressed JSON is ``raw`` (read from ``path``)."""
        try:
            trace = _DECODER.decode(raw)
        except msgspec.DecodeError as e:
            raise TraceFormatError(f"cannot read the memory events of {path}: {str(e).splitlines()[0]}") from None
        first: dict[str, float] = {}
        for e in trace.traceEvents:
            if e.name and e.name != MEMORY_EVENT and e.ts < first.get(e.name, float("inf")):
                first[e.name] = e.ts
        return cls({_device_name(kind, index): memory for (kind, index), memory in sorted(_per_device(trace).items())},
                   first)

    def peaks(self) -> list[MemoryPeak]:
        """Each device's :class:`MemoryPeak`; empty where the trace holds no memory events."""
        return [MemoryPeak(device, max(0, int(max(m.totals) - m.before)), int(max(m.totals)), len(m.times), m.at_peak,
                           m.unseen_at_peak)
                for device, m in self.devices.items()]

    def added_before(self, device: str, names: dict[str, re.Pattern]) -> dict[str, int | None]:
        """Per key of ``names``: what ``device`` (a :class:`MemoryPeak`'s name) held on top of
        what it began with when the trace's first event whose name matches began (None: no such
        event, or no memory event of that device)."""
        if device not in self.devices:
            return dict.fromkeys(names)
        memory = self.devices[device]
        found: dict[str, int | None] = {}
        for key, pattern in names.items():
            starts = [ts for name, ts in self.first_starts.items() if pattern.match(name)]
            if not starts:
                found[key] = None
                continue
            at = bisect.bisect_left(memory.times, min(starts))  # the allocations strictly before it
            found[key] = int((memory.totals[at - 1] if at else memory.before) - memory.before)
        return found


    def stretch_peaks(self, device: str, pattern: re.Pattern) -> list[tuple[str | None, int]]:
        """``device``'s highest total over what it began with in each stretch of the trace between
        the starts of successive names matching ``pattern`` (each name's first event, in time
        order), with the name that opens it (None: the stretch before the first); empty where
        ``device`` has no memory events."""
        memory = self.devices.get(device)
        if memory is None or not memory.times:
            return []
        marks = sorted((ts, name) for name, ts in self.first_starts.items() if pattern.match(name))
        starts: list[tuple[float, str | None]] = [(float("-inf"), None), *marks]
        found = []
        for (start, name), (end, _) in zip(starts, [*starts[1:], (float("inf"), None)]):
            lo, hi = bisect.bisect_left(memory.times, start), bisect.bisect_left(memory.times, end)
            top = max([memory.totals[lo - 1] if lo else memory.before, *memory.totals[lo:hi]])
            found.append((name, int(top - memory.before)))
        return found


def _device_name(kind: int, index: int) -> str:
    """``cpu``, ``cuda:0``...: a device of the allocator's events as :class:`MemoryPeak` names it."""
    name = DEVICE_TYPES.get(kind, f"device-type-{kind}")
    return name if index < 0 else f"{name}:{index}"


def _per_device(trace: _File) -> dict[tuple[int, int], DeviceMemory]:
    """Per device (type, index): its memory events in time order."""
    per_device: dict[tuple[int, int], list[_Event]] = {}
    for e in sorted((e for e in trace.traceEvents if e.name == MEMORY_EVENT and e.args is not None),
                    key=lambda e: e.ts):
        per_device.setdefault((e.args.device_type, e.args.device_id), []).append(e)
    out = {}
    for key, events in per_device.items():
        args = [e.args for e in events]
        summed = any(a.total_allocated is None for a in args)
        reported = list(itertools.accumulate(a.nbytes for a in args)) if summed else [a.total_allocated for a in args]
        # a GPU's total already dropped for a free the profiler missed; the CPU's and a sum did not
        unseen = _unseen_frees(args) if summed or DEVICE_TYPES.get(key[0]) == "cpu" else {}
        totals = [float(t - m) for t, m in zip(reported, _missed_so_far(unseen, len(args)))]
        peak = totals.index(max(totals))
        out[key] = DeviceMemory([float(e.ts) for e in events], totals, float(reported[0] - args[0].nbytes),
                                _held_at_peak(args, peak), _unseen_at(unseen, peak))
    return out


def _missed_so_far(unseen: dict[int, tuple[int, int]], count: int) -> list[int]:
    """After each of ``count`` events, the bytes of the unseen frees proven so far."""
    return list(itertools.accumulate(unseen[i][1] if i in unseen else 0 for i in range(count)))


def _unseen_at(unseen: dict[int, tuple[int, int]], peak: int) -> int:
    """The bytes of the unseen-freed allocations made by the event ``peak`` and proven freed only after it."""
    return sum(size for again, (made, size) in unseen.items() if made <= peak < again)


def _unseen_frees(args: list[_Args]) -> dict[int, tuple[int, int]]:
    """The allocations among ``args`` freed where the profiler did not see it, by the index of
    the allocation that reused each one's address with no free between: ``(index of the
    unseen-freed allocation, its bytes)``; empty where the events name no addresses."""
    if any(a.addr is None for a in args):
        return {}
    held: dict[int, int] = {}
    found: dict[int, tuple[int, int]] = {}
    for i, a in enumerate(args):
        if a.nbytes > 0:
            if a.addr in held:
                made = held[a.addr]
                found[i] = (made, int(args[made].nbytes))
            held[a.addr] = i
        else:
            held.pop(a.addr, None)
    return found


def _held_at_peak(args: list[_Args], peak: int) -> list[int]:
    """The sizes of the allocations among ``args`` not yet freed at the event ``peak``, largest
    first (a free is matched to its allocation by address, an allocation that reuses an address
    replaces it); empty where the events name no addresses."""
    if any(a.addr is None for a in args):
        return []
    held: dict[int, int] = {}
    for a in args[:peak + 1]:
        if a.nbytes > 0:
            held[a.addr] = int(a.nbytes)
        else:
            held.pop(a.addr, None)
    return sorted(held.values(), reverse=True)
