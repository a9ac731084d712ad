"""The rate of the links between the job's ranks, measured with plain TCP streams.

A collective's cost per byte mixes the host's work (gloo's copies and threads, NCCL's kernels)
with the wire's; only the wire's share changes with the link. Every rank streams to the next rank
around the ring for :data:`STREAM_S` on a TCP connection of its own, while receiving from the
previous one (both directions of each link are busy at once, as in a ring collective); the
receiver times the bytes after the first read up to the last, in windows of 50 ms, for at most
:data:`DRAIN_S` after the sender stopped (the send buffer drains meanwhile).
:func:`dpro.replayer.linkmodel.wire_rates` reads the links' rates from them: the share of a
send's time that ``dpro whatif --bandwidth-scale`` scales (:class:`dpro.replayer.cost.AlphaBeta`).

A rank listens on every address and publishes the one it reaches the job's rendezvous store
from, or, when that is a loopback address (it runs beside the store, whose host name may
resolve to 127.0.1.1 there), none: its peer then connects to the store's host as it resolves it.
The streams' listening ports go to the calibration (``listen``), so that the connection
analysis leaves dpro's own traffic out.
"""

from __future__ import annotations

import datetime
import json
import socket
import threading
import time
from ipaddress import ip_address
from typing import Any

STREAM_S = 2.0  # a stream through a 20 Mb/s shaper can spend most of a first second recovering from
# its losses (1 s streams found 64% of tc's rate in 2 of 4 runs of a test; 2 s streams, in none of 4)
DRAIN_S = 2.0
BLOCK = 1 << 20
WINDOW_NS = 50_000_000
TIMEOUT_S = 10.0

__all__ = ["ring_streams"]


def ring_streams(store: Any, store_host: str, rank: int, world_size: int, seconds: float = STREAM_S) -> dict[str, Any]:
    """Stream to rank ``rank + 1`` while timing what rank ``rank - 1`` streams here:
    ``{"src", "dst", "listen", "bytes", "ns", "window_ns", "window_bytes"}`` of the received
    stream (``listen``: this rank's address and port; the bytes of each :data:`WINDOW_NS`
    window, the last one partial). ``store``: a store every rank reaches (``store_host``: its
    host), where ranks publish where they listen."""
    own = _own_address(store_host)
    family = _family(store_host)
    with socket.create_server(("::" if family == socket.AF_INET6 else "0.0.0.0", 0), family=family) as listener:
        listener.settimeout(TIMEOUT_S)
        port = listener.getsockname()[1]
        store.set(f"link/{rank}", json.dumps([None if ip_address(own).is_loopback else own, port]))
        received: dict[str, Any] = {}
        receiver = threading.Thread(target=_receive, args=(listener, received, seconds + DRAIN_S),
                                    name="dpro-link-receiver", daemon=True)
        receiver.start()
        nxt = (rank + 1) % world_size
        store.wait([f"link/{nxt}"], datetime.timedelta(seconds=TIMEOUT_S))
        host, peer_port = json.loads(store.get(f"link/{nxt}"))
        _send((host or store_host, peer_port), seconds)
        receiver.join(TIMEOUT_S + seconds + DRAIN_S)
    if "ns" not in received:
        raise TimeoutError(f"no stream from rank {(rank - 1) % world_size} was received")
    return {"src": (rank - 1) % world_size, "dst": rank, "listen": [own, port], **received}


def _own_address(store_host: str) -> str:
    """The address this host reaches ``store_host`` from (no packet is sent)."""
    with socket.socket(_family(store_host), socket.SOCK_DGRAM) as probe:
        probe.connect((store_host, 9))
        return probe.getsockname()[0]


def _family(host: str) -> socket.AddressFamily:
    return socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)[0][0]


def _send(address: tuple[str, int], seconds: float) -> None:
    """Send for ``seconds`` (never blocked longer on a slow link), then wait for the receiver to
    close."""
    block = memoryview(bytes(BLOCK))
    with socket.create_connection(address, timeout=TIMEOUT_S) as sock:
        end = time.perf_counter() + seconds
        while (left := end - time.perf_counter()) > 0:
            sock.settimeout(left)
            try:
                sock.send(block)
            except TimeoutError:
                break
        sock.settimeout(DRAIN_S + TIMEOUT_S)
        try:
            sock.shutdown(socket.SHUT_WR)
            sock.recv(1)  # the receiver closes once it has read everything, or stopped reading
        except OSError:
            pass


def _receive(listener: socket.socket, out: dict[str, Any], limit_s: float) -> None:
    try:
        conn, _ = listener.accept()
    except OSError:
        return
    with conn:
        conn.settimeout(limit_s)
        buffer = bytearray(BLOCK)
        windows: list[int] = []
        first = last = None
        stop = time.perf_counter_ns() + int(limit_s * 1e9)
        try:
            while (n := conn.recv_into(buffer)) and (last := time.perf_counter_ns()) < stop:
                if first is None:  # the clock starts here: what came before is not counted
                    first = last
                    continue
                k = (last - first) // WINDOW_NS
                windows += [0] * (k + 1 - len(windows))
                windows[k] += n
        except OSError:
            pass
    if first is not None and last is not None and last > first and windows:
        out.update(bytes=sum(windows), ns=last - first, window_ns=WINDOW_NS, window_bytes=windows)
