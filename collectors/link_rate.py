"""The rate of the links between the job's ranks, measured with plain TCP streams.

A collective's cost per byte mixes the host's work (gloo's copies and threads, NCCL's kernels)
with the wire's; only the wire's share changes with the link. Every rank streams to the next rank
around the ring for :data:`STREAM_S` on a TCP connection of its own, from the address it reaches
the job's rendezvous store from, while receiving from the previous one (both directions of each
link are busy at once, as in a ring collective); the receiver times the bytes after the first
read up to the last, so the send buffer's drain after the sender stops is counted, in windows
of 50 ms. :func:`dpro.replayer.linkmodel.wire_rates` reads the links' rates from them: the
share of a send's time that ``dpro whatif --bandwidth-scale`` scales
(:class:`dpro.replayer.cost.AlphaBeta`).
"""

from __future__ import annotations

import datetime
import json
import socket
import threading
import time
from typing import Any

STREAM_S = 1.0
BLOCK = 1 << 20
WINDOW_NS = 50_000_000
TIMEOUT_S = 20.0

__all__ = ["ring_streams"]


def ring_streams(store: Any, store_host: str, rank: int, world_size: int, seconds: float = STREAM_S) -> dict[str, Any]:
    """Stream to rank ``rank + 1`` while timing what rank ``rank - 1`` streams here:
    ``{"src", "dst", "bytes", "ns", "window_ns", "window_bytes"}`` of the received stream (the
    bytes of each :data:`WINDOW_NS` window of it, the last one partial). ``store``: a store every rank
    reaches (``store_host``: its host), where ranks publish where they listen."""
    with socket.create_server((_own_address(store_host), 0), family=_family(store_host)) as listener:
        listener.settimeout(TIMEOUT_S)
        host, port = listener.getsockname()[:2]
        store.set(f"link/{rank}", json.dumps([host, port]))
        received: dict[str, Any] = {}
        receiver = threading.Thread(target=_receive, args=(listener, received), name="dpro-link-receiver", daemon=True)
        receiver.start()
        nxt = (rank + 1) % world_size
        store.wait([f"link/{nxt}"], datetime.timedelta(seconds=TIMEOUT_S))
        _send(tuple(json.loads(store.get(f"link/{nxt}"))), seconds)
        receiver.join(TIMEOUT_S)
    if "ns" not in received:
        raise TimeoutError(f"rank {(rank - 1) % world_size}'s stream did not end within {TIMEOUT_S:.0f} s")
    return {"src": (rank - 1) % world_size, "dst": rank, **received}


def _own_address(store_host: str) -> str:
    """The address this host reaches ``store_host`` from (no packet is sent)."""
    family = _family(store_host)
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((store_host, 9))
        return probe.getsockname()[0]


def _family(host: str) -> socket.AddressFamily:
    return socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)[0][0]


def _send(address: tuple[str, int], seconds: float) -> None:
    block = bytes(BLOCK)
    with socket.create_connection(address, timeout=TIMEOUT_S) as sock:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            sock.sendall(block)
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # the receiver closes once it has read everything


def _receive(listener: socket.socket, out: dict[str, Any]) -> None:
    try:
        conn, _ = listener.accept()
    except OSError:
        return
    with conn:
        conn.settimeout(TIMEOUT_S)
        buffer = bytearray(BLOCK)
        windows: list[int] = []
        first = last = None
        try:
            while n := conn.recv_into(buffer):
                last = time.perf_counter_ns()
                if first is None:  # the clock starts here: what came before is not counted
                    first = last
                    continue
                k = (last - first) // WINDOW_NS
                windows += [0] * (k + 1 - len(windows))
                windows[k] += n
        except OSError:
            return
    if first is not None and last is not None and last > first:
        out.update(bytes=sum(windows), ns=last - first, window_ns=WINDOW_NS, window_bytes=windows)
