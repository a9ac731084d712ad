"""The interface every traffic engine implements: a workload, two endpoints, one result.

An engine runs a server and a client as two processes, each behind its endpoint's command
prefix (``ip netns exec h1``, ``ssh host``...), diffs both endpoints' counters around the run and
says in :attr:`Result.errors` what went wrong, never hanging past its timeouts.
"""

from __future__ import annotations

import re
import sys
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Protocol

from dpro.collectors.counters.snapshot import CounterDiff


class Opcode(str, Enum):
    SEND = "send"
    WRITE = "write"
    READ = "read"


class Direction(str, Enum):
    UNI = "uni"  # the client sends
    BI = "bi"  # both send at once


TRANSPORTS = ("rc", "uc", "ud")
_PLACEMENT = re.compile(r"host|cuda:\d+")


@dataclass(frozen=True)
class Workload:
    """What traffic to make. ``queue_depth``: messages outstanding per connection (unacknowledged,
    or not yet completed); ``batch``: messages handed over per post/syscall; ``transport``: RDMA
    queue pair type (None: the engine's default); ``placement``: ``host`` or ``cuda:<gpu>`` memory."""

    message_size: int = 65536
    connections: int = 1
    opcode: Opcode = Opcode.SEND
    transport: str | None = None
    mtu: int | None = None
    sges: int = 1
    batch: int = 1
    queue_depth: int = 16
    direction: Direction = Direction.UNI
    placement: str = "host"

    def __post_init__(self) -> None:
        for name in ("message_size", "connections", "sges", "batch", "queue_depth"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.batch > self.queue_depth:
            raise ValueError(f"batch ({self.batch}) cannot exceed queue_depth ({self.queue_depth})")
        if self.sges > self.message_size:
            raise ValueError(f"{self.sges} SGEs cannot split a {self.message_size}-byte message")
        if self.mtu is not None and self.mtu < 256:
            raise ValueError(f"mtu must be at least 256, not {self.mtu}")
        if self.transport not in (None, *TRANSPORTS):
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {self.transport!r}")
        if not _PLACEMENT.fullmatch(self.placement):
            raise ValueError(f"placement must be 'host' or 'cuda:<index>', not {self.placement!r}")
        object.__setattr__(self, "opcode", Opcode(self.opcode))
        object.__setattr__(self, "direction", Direction(self.direction))

    def features(self) -> frozenset[str]:
        """What an engine must support to run this workload (compared with ``supported_features()``)."""
        needed = {f"opcode:{self.opcode.value}", f"direction:{self.direction.value}",
                  f"placement:{self.placement.split(':')[0]}"}
        needed |= {name for name in ("connections", "sges", "batch", "queue_depth") if getattr(self, name) > 1}
        if self.mtu is not None:
            needed.add("mtu")
        if self.transport is not None:
            needed.add(f"transport:{self.transport}")
        return frozenset(needed)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {**asdict(self), "opcode": self.opcode.value, "direction": self.direction.value}


@dataclass(frozen=True)
class Endpoint:
    """One host of a run. ``address``: the server listens there, the client sends from there;
    ``prefix``: the command that runs a program on that host (empty: here); ``interface``:
    netdev whose counters are diffed (None: the one holding ``address``); ``rdma_device``/
    ``rdma_port``/``gid_index``: for RDMA engines; ``python``: an interpreter there with dpro."""

    address: str
    prefix: tuple[str, ...] = ()
    interface: str | None = None
    rdma_device: str | None = None
    rdma_port: int = 1
    gid_index: int | None = None
    python: str = sys.executable


@dataclass
class Result:
    """What a run measured. ``latency_us``: percentiles (``p50``, ``p90``, ``p99``, ``p99.9``,
    ``max``), empty when the engine does not measure latency; ``counters``: counter diffs per
    role (``server``, ``client``); ``errors``: empty when the run succeeded."""

    engine: str
    workload: Workload
    throughput_gbps: float | None = None
    msgs_per_s: float | None = None
    latency_us: dict[str, float] = field(default_factory=dict)
    counters: dict[str, CounterDiff] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {"engine": self.engine, "workload": self.workload.to_dict(), "throughput_gbps": self.throughput_gbps,
                "msgs_per_s": self.msgs_per_s, "latency_us": self.latency_us,
                "counters": {role: d.to_dict() for role, d in self.counters.items()},
                "errors": self.errors, "notes": self.notes}


class Engine(Protocol):
    """A way to make traffic between two endpoints."""

    name: str

    def unavailable_reason(self) -> str | None:
        """Why this engine cannot run here (missing tool, library or device), None when it can."""

    def supported_features(self) -> frozenset[str]:
        """The :meth:`Workload.features` this engine can honour."""

    def run(self, workload: Workload, server_host: Endpoint, client_host: Endpoint,
            duration_s: float = 5.0, timeout_s: float = 10.0) -> Result:
        """Run ``workload`` from ``client_host`` to ``server_host`` for ``duration_s``; every
        wait (start, connection, progress, exit) gives up after ``timeout_s``."""


def refusal(engine: Engine, workload: Workload) -> Result | None:
    """A failed :class:`Result` when ``engine`` is unavailable or cannot honour ``workload``."""
    reason = engine.unavailable_reason()
    if reason:
        return Result(engine.name, workload, errors=[f"{engine.name} engine unavailable: {reason}"])
    missing = workload.features() - engine.supported_features()
    if missing:
        return Result(engine.name, workload,
                      errors=[f"{engine.name} engine does not support: {', '.join(sorted(missing))}"])
    return None
