"""The host's CPU time from ``/proc/stat``, and the share of it the hypervisor took (steal).

On a virtual machine, *steal* is the time a virtual CPU wanted to run and the hypervisor ran
something else: CPU time the job asked for and did not get, which no profile of the job shows.
The aggregate ``cpu`` line holds each state's time since boot in ``USER_HZ`` ticks (man 5 proc);
``guest`` and ``guest_nice`` are already counted in ``user`` and ``nice`` and are left out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PROC_STAT = Path("/proc/stat")
CPU_STATES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
BUSY_STATES = ("user", "nice", "system", "irq", "softirq")

__all__ = ["BUSY_STATES", "CPU_STATES", "read_cpu_times", "steal_share"]


def read_cpu_times(path: str | os.PathLike = PROC_STAT) -> tuple[dict[str, int], str | None]:
    """Every CPU's time in each of :data:`CPU_STATES` (ticks), and a note where it cannot be read
    (no ``/proc``, or a kernel too old to count steal)."""
    try:
        line = Path(path).read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return {}, f"no CPU times in {path}"
    if not line or line[0] != "cpu" or len(line) < 1 + len(CPU_STATES):
        return {}, f"no steal time in {path} (its first line: {' '.join(line)[:60]!r})"
    try:
        return {state: int(v) for state, v in zip(CPU_STATES, line[1:])}, None
    except ValueError:
        return {}, f"unreadable CPU times in {path}"


def steal_share(before: Mapping[str, int], after: Mapping[str, int]) -> float | None:
    """Of the CPU time the host's CPUs wanted between two readings (busy or stolen), the share the
    hypervisor took; None where the readings lack a state or the CPUs wanted none."""
    try:
        busy = sum(after[s] - before[s] for s in BUSY_STATES)
        steal = after["steal"] - before["steal"]
    except KeyError:
        return None
    return steal / (busy + steal) if busy + steal > 0 and steal >= 0 else None
