"""The offset of each rank's clock against rank 0's, measured when the rank attaches.

Rank 0 answers timestamp ping-pongs from every other rank through the job's own rendezvous
store (the TCPStore behind its default process group), on a connection of dpro's own and in a
background thread: no collective is issued on the job's process groups, so their sequence
numbers are untouched and a rank whose hooks fail cannot make the others hang. NTP-style, the
round with the smallest round trip wins; its half round trip bounds the error.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpro.run_format import write_json_atomic

ROUNDS = 10
TIMEOUT = datetime.timedelta(seconds=120)


def _store_address() -> tuple[str, int] | None:
    """Host and port of the TCPStore behind the default process group, if there is one."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if isinstance(store, dist.TCPStore):
        return store.host, store.port
    return None


def job_store(topic: str) -> tuple[Any, str] | None:
    """A connection of dpro's own to the job's TCPStore, its keys under ``dpro/<topic>/<restart>/``
    (so a restarted job never reads an earlier attempt's), and the store's address; None
    without a TCPStore behind the default process group."""
    import torch.distributed as dist

    address = _store_address()
    if address is None:
        return None
    prefix = f"dpro/{topic}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    client = dist.TCPStore(address[0], address[1], is_master=False, timeout=TIMEOUT, wait_for_workers=False)
    return dist.PrefixStore(prefix, client), f"{address[0]}:{address[1]}"


def _serve(store: Any, world_size: int) -> dict[str, Any]:
    """Rank 0: answer every other rank's pings with rank 0's clock."""
    missed = []
    for rank in range(1, world_size):
        for k in range(ROUNDS):
            try:
                store.wait([f"q/{rank}/{k}"], TIMEOUT)
            except Exception:
                missed.append(rank)
                break
            store.set(f"a/{rank}/{k}", str(time.time_ns()))
    return {"offset_ns": 0, "reference": True, "unanswered_ranks": missed}


def _ping(store: Any, rank: int) -> dict[str, Any]:
    """Any other rank: ping rank 0 and keep the round with the smallest round trip."""
    best: tuple[int, int] | None = None
    for k in range(ROUNDS):
        sent = time.time_ns()
        store.set(f"q/{rank}/{k}", "")
        remote = int(store.get(f"a/{rank}/{k}"))
        received = time.time_ns()
        rtt = received - sent
        if best is None or rtt < best[0]:
            best = (rtt, (sent + received) // 2 - remote)
    assert best is not None
    return {"offset_ns": best[1], "rtt_ns": best[0], "uncertainty_ns": best[0] // 2, "rounds": ROUNDS}


def measure_offset(rank: int, world_size: int) -> dict[str, Any]:
    """This rank's clock minus rank 0's, in ns (``local_ns - offset_ns`` is rank 0's time)."""
    if world_size <= 1:
        return {"offset_ns": 0, "reference": True, "method": "single process"}
    found = job_store("clock")
    if found is None:
        return {"offset_ns": None, "note": "not measured: no TCPStore behind the default process group"}
    store, address = found
    result = _serve(store, world_size) if rank == 0 else _ping(store, rank)
    return {**result, "method": "ping-pong through the job's TCPStore", "store": address, "measured_ns": time.time_ns()}


def measure_offset_in_background(rank: int, world_size: int, path: Path,
                                 log_error: Callable[[str, BaseException], None]) -> None:
    """Measure the offset in a daemon thread and write it to ``path``."""

    def run() -> None:
        try:
            write_json_atomic(path, {"rank": rank, **measure_offset(rank, world_size)}, parents=False)
        except Exception as e:
            log_error("measuring the clock offset", e)
            try:
                write_json_atomic(path, {"rank": rank, "offset_ns": None,
                                         "note": f"not measured: {type(e).__name__}: {e}"}, parents=False)
            except Exception:
                pass

    threading.Thread(target=run, name="dpro-clock", daemon=True).start()
