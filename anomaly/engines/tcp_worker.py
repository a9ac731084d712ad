"""One end of the TCP engine's traffic; run as ``python -m dpro.anomaly.engines.tcp_worker server|client``.

Protocol, per connection: the client first sends one role byte (``C``: the client sends on this
connection, ``S``: the server does). The sender writes ``message_size``-byte messages, ``batch``
per system call (each split into ``sges`` buffers, as a scatter-gather list), keeping at most
``queue_depth`` unacknowledged; the receiver answers one ACK byte per complete message. Latency
is from a message's send call to its ACK. When the duration is over the sender drains its ACKs,
shuts down its side, and both close. Every socket operation times out after ``--io-timeout``.

Prints ``{"event": "ready", "port": N}`` (server), then ``{"event": "done", "senders": [...],
"receivers": [...]}``; on failure ``{"event": "error", "errors": [...]}`` and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NoReturn

from dpro.anomaly.engines.latency import LatencyHistogram

ACK = b"\x06"
CLIENT_SENDS, SERVER_SENDS = b"C", b"S"
RECV_BUFFER = 1 << 20
HEADERS = 40  # IPv4 + TCP header bytes: MSS = MTU - 40


def _message_buffers(args: argparse.Namespace) -> list[memoryview]:
    """``batch`` messages, each as ``sges`` buffers (the last one takes the remainder)."""
    piece = args.size // args.sges
    sizes = [piece] * (args.sges - 1) + [args.size - piece * (args.sges - 1)]
    return [memoryview(bytearray(n)) for _ in range(args.batch) for n in sizes]


def _send_buffers(sock: socket.socket, buffers: list[memoryview]) -> None:
    if len(buffers) == 1:
        sock.sendall(buffers[0])
        return
    sent = sock.sendmsg(buffers)
    for buf in buffers:  # a partial sendmsg: send what is left
        if sent >= len(buf):
            sent -= len(buf)
            continue
        sock.sendall(buf[sent:])
        sent = 0


def send(sock: socket.socket, args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    """Send messages until ``deadline`` (a ``time.monotonic()`` value), then drain the ACKs."""
    buffers, latency = _message_buffers(args), LatencyHistogram()
    outstanding: deque[int] = deque()
    acked = 0
    start = time.perf_counter_ns()
    while True:
        if time.monotonic() < deadline:
            while len(outstanding) + args.batch <= args.queue_depth:
                _send_buffers(sock, buffers)
                outstanding.extend([time.perf_counter_ns()] * args.batch)
        if not outstanding:
            break
        acks = sock.recv(len(outstanding))
        if not acks:
            raise ConnectionError(f"the receiver closed the connection with {len(outstanding)} message(s) "
                                  f"unacknowledged")
        now = time.perf_counter_ns()
        for _ in acks:
            latency.add(now - outstanding.popleft())
        acked += len(acks)
    end = time.perf_counter_ns()
    sock.shutdown(socket.SHUT_WR)
    extra = sock.recv(1)  # the receiver closes once it has acknowledged everything
    sock.close()
    if extra:
        raise ConnectionError("the receiver sent data after the last acknowledgement")
    return {"messages": acked, "bytes": acked * args.size, "elapsed_s": (end - start) / 1e9, "start_ns": start,
            "end_ns": end, "latency": latency.to_dict()}


def receive(sock: socket.socket, args: argparse.Namespace) -> dict[str, Any]:
    """Receive messages until the sender closes, acknowledging each complete one."""
    buf = bytearray(RECV_BUFFER)
    total = acked = 0
    start = time.perf_counter_ns()
    while n := sock.recv_into(buf):
        total += n
        if (complete := total // args.size) > acked:
            sock.sendall(ACK * (complete - acked))
            acked = complete
    sock.close()  # tells the sender everything was acknowledged
    if total % args.size:
        raise ConnectionError(f"the sender stopped in the middle of a message ({total % args.size} of "
                              f"{args.size} bytes)")
    return {"messages": acked, "bytes": total, "elapsed_s": (time.perf_counter_ns() - start) / 1e9}


def _tune(sock: socket.socket, args: argparse.Namespace) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if args.mtu:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, args.mtu - HEADERS)


def _family(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def _run_threads(jobs: list[tuple[str, Callable[[], dict[str, Any]]]], args: argparse.Namespace) -> dict[str, Any]:
    """Run each job in a thread; ``{"senders": [...], "receivers": [...]}``, or exit on a failure."""
    results: dict[str, list[dict[str, Any]]] = {"senders": [], "receivers": []}
    errors: list[str] = []

    def run(kind: str, job: Callable[[], dict[str, Any]]) -> None:
        try:
            results[kind].append(job())
        except socket.timeout:
            errors.append(f"no progress from the peer within {args.io_timeout:g} s")
        except OSError as e:
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=job, daemon=True) for job in jobs]
    for t in threads:
        t.start()
    end = time.monotonic() + args.duration + 3 * args.io_timeout
    for t in threads:
        t.join(timeout=max(end - time.monotonic(), 0))
    if any(t.is_alive() for t in threads):
        errors.append("a connection made no progress: gave up")
    if errors:
        _fail(errors)
    return results


def _fail(errors: list[str]) -> NoReturn:
    print(json.dumps({"event": "error", "errors": errors}), flush=True)
    print("; ".join(dict.fromkeys(errors)), file=sys.stderr)
    raise SystemExit(1)


def server(args: argparse.Namespace) -> dict[str, Any]:
    """Listen, accept every connection the client opens, then run the senders/receivers."""
    listener = socket.socket(_family(args.bind), socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _tune(listener, args)
    listener.bind((args.bind, args.port))
    listener.listen(64)
    listener.settimeout(args.io_timeout)
    print(json.dumps({"event": "ready", "port": listener.getsockname()[1]}), flush=True)
    expected = args.connections * (2 if args.direction == "bi" else 1)
    jobs = []
    for i in range(expected):
        try:
            conn, _ = listener.accept()
            conn.settimeout(args.io_timeout)
            role = conn.recv(1)
        except socket.timeout:
            _fail([f"only {i} of {expected} connection(s) arrived within {args.io_timeout:g} s"])
        _tune(conn, args)
        if role == SERVER_SENDS:
            jobs.append(("senders", lambda c=conn: send(c, args, time.monotonic() + args.duration)))
        elif role == CLIENT_SENDS:
            jobs.append(("receivers", lambda c=conn: receive(c, args)))
        else:
            _fail([f"connection {i} did not start with a role byte (got {role!r})"])
    listener.close()
    return _run_threads(jobs, args)


def client(args: argparse.Namespace) -> dict[str, Any]:
    """Open the connections, then send (and, both ways, receive) for the duration."""
    host, _, port = args.connect.rpartition(":")
    host = host.strip("[]")
    roles = [CLIENT_SENDS] * args.connections + ([SERVER_SENDS] * args.connections if args.direction == "bi" else [])
    socks = []
    for role in roles:
        sock = socket.socket(_family(host), socket.SOCK_STREAM)
        sock.settimeout(args.io_timeout)
        _tune(sock, args)
        try:
            if args.source:
                sock.bind((args.source, 0))
            sock.connect((host, int(port)))
            sock.sendall(role)
        except OSError as e:
            why = f"no answer within {args.io_timeout:g} s" if isinstance(e, socket.timeout) else str(e)
            _fail([f"cannot connect to {args.connect}: {why}"])
        socks.append((role, sock))
    deadline = time.monotonic() + args.duration
    jobs = [("senders", lambda s=s: send(s, args, deadline)) if role == CLIENT_SENDS
            else ("receivers", lambda s=s: receive(s, args)) for role, s in socks]
    return _run_threads(jobs, args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dpro.anomaly.engines.tcp_worker")
    parser.add_argument("role", choices=["server", "client"])
    parser.add_argument("--bind", default="0.0.0.0", help="server: address to listen on")
    parser.add_argument("--port", type=int, default=0, help="server: port (0: any free one)")
    parser.add_argument("--connect", help="client: HOST:PORT of the server")
    parser.add_argument("--source", help="client: local address to send from")
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--queue-depth", type=int, default=1)
    parser.add_argument("--sges", type=int, default=1)
    parser.add_argument("--mtu", type=int)
    parser.add_argument("--direction", choices=["uni", "bi"], default="uni")
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--io-timeout", type=float, required=True)
    args = parser.parse_args(argv)
    try:
        result = server(args) if args.role == "server" else client(args)
    except OSError as e:
        _fail([f"{type(e).__name__}: {e}"])
    print(json.dumps({"event": "done", **result}), flush=True)


if __name__ == "__main__":
    main()
