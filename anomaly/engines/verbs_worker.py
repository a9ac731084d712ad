"""One end of the verbs engine's traffic, through pyverbs; run as
``python -m dpro.anomaly.engines.verbs_worker server|client``.

Both ends open the device, one PD, one CQ, one MR (a slot of ``size`` bytes per outstanding
message per QP) and ``connections`` QPs of the transport (RC, UC or UD). The client connects a
TCP control socket to the server and sends its QP numbers, LID, GID, MR address and rkey; the
server moves its QPs to RTS (RC/UC: connected to the client's), posts its receives, and answers
the same. The client then posts SEND/WRITE/READ work requests, ``batch`` at a time, keeping
``queue_depth`` in flight per QP, each signalled (latency = post to completion), for the
duration; then it drains, tells the server it is done, and reads the server's count.

Prints ``{"event": "ready", "port": N}`` (server) and ``{"event": "done", ...}``; on failure
``{"event": "error", "errors": [...]}`` and exit code 1. Needs pyverbs and an RDMA device.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import select
import socket
import sys
import time
from collections import deque
from typing import Any, NoReturn

from dpro.anomaly.engines.latency import LatencyHistogram

QKEY = 0x11111111
GRH_BYTES = 40  # UD receives start with the 40-byte global routing header
MTU_ENUM = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}


def _fail(errors: list[str]) -> NoReturn:
    print(json.dumps({"event": "error", "errors": errors}), flush=True)
    print("; ".join(errors), file=sys.stderr)
    raise SystemExit(1)


class Verbs:
    """The device objects of one end, and the operations the engine needs on them."""

    def __init__(self, args: argparse.Namespace) -> None:
        import pyverbs.device as d
        import pyverbs.enums as e
        from pyverbs.cq import CQ
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        self.e, self.args = e, args
        self.ctx = d.Context(name=args.device)
        self.port = self.ctx.query_port(args.ib_port)
        self.gid_index = args.gid_index
        if self.gid_index is None and self.port.link_layer == e.IBV_LINK_LAYER_ETHERNET:
            self.gid_index = self._roce_v2_gid_index(args.address)
        self.ud = args.transport == "ud"
        self.slot = args.size + (GRH_BYTES if self.ud else 0)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 2 * args.queue_depth * args.connections)
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        self.mr = MR(self.pd, self.slot * args.queue_depth * args.connections, access)
        qp_type = {"rc": e.IBV_QPT_RC, "uc": e.IBV_QPT_UC, "ud": e.IBV_QPT_UD}[args.transport]
        cap = QPCap(max_send_wr=args.queue_depth, max_recv_wr=args.queue_depth, max_send_sge=args.sges, max_recv_sge=1)
        init = QPAttr()
        init.port_num, init.qkey, init.qp_access_flags = args.ib_port, QKEY, access
        # UD QPs come back in RTS, RC/UC ones in INIT (they need the peer's QP number first).
        self.qps = [QP(self.pd, QPInitAttr(qp_type=qp_type, scq=self.cq, rcq=self.cq, cap=cap), init)
                    for _ in range(args.connections)]
        self.ahs: list[Any] = []

    def _roce_v2_gid_index(self, address: str) -> int:
        mapped = ipaddress.IPv6Address(f"::ffff:{address}").exploded
        for i in range(self.port.gid_tbl_len):
            try:
                if (str(self.ctx.query_gid(self.args.ib_port, i)) == mapped
                        and self.ctx.query_gid_type(self.args.ib_port, i) == self.e.IBV_GID_TYPE_ROCE_V2):
                    return i
            except Exception:
                continue  # an empty GID table entry
        raise RuntimeError(f"{self.args.device} port {self.args.ib_port} has no RoCE v2 GID for {address}; "
                           f"give the endpoint a gid_index")

    def info(self) -> dict[str, Any]:
        """What the peer needs to reach this end."""
        gid = str(self.ctx.query_gid(self.args.ib_port, self.gid_index)) if self.gid_index is not None else None
        return {"qpns": [qp.qp_num for qp in self.qps], "lid": self.port.lid, "gid": gid,
                "mtu": self.port.active_mtu, "addr": self.mr.buf, "rkey": self.mr.rkey}

    def _ah_attr(self, peer: dict[str, Any]) -> Any:
        from pyverbs.addr import GID, AHAttr, GlobalRoute

        if peer["gid"] is None:
            return AHAttr(port_num=self.args.ib_port, dlid=peer["lid"])
        route = GlobalRoute(dgid=GID(peer["gid"]), sgid_index=self.gid_index)
        return AHAttr(gr=route, is_global=1, port_num=self.args.ib_port, dlid=peer["lid"])

    def connect(self, peer: dict[str, Any]) -> None:
        """Move the QPs to RTS towards ``peer`` (RC/UC), or make the address handle (UD)."""
        from pyverbs.addr import AH
        from pyverbs.qp import QPAttr

        if self.ud:
            mtu_bytes = 128 << min(self.port.active_mtu, peer["mtu"])
            if self.args.size > mtu_bytes:
                raise ValueError(f"UD messages must fit in one MTU: {self.args.size} > {mtu_bytes} bytes")
            self.ahs = [AH(self.pd, attr=self._ah_attr(peer))]
            return
        wanted = MTU_ENUM.get(self.args.mtu, 5) if self.args.mtu else 5
        for qp, remote_qpn in zip(self.qps, peer["qpns"]):
            attr = QPAttr()
            attr.path_mtu = min(self.port.active_mtu, peer["mtu"], wanted)
            attr.dest_qp_num, attr.rq_psn, attr.sq_psn = remote_qpn, 0, 0
            attr.max_dest_rd_atomic = attr.max_rd_atomic = 16
            attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
            attr.qp_access_flags = self.e.IBV_ACCESS_LOCAL_WRITE | self.e.IBV_ACCESS_REMOTE_WRITE | \
                self.e.IBV_ACCESS_REMOTE_READ
            attr.ah_attr = self._ah_attr(peer)
            qp.to_rts(attr)

    def _addr(self, qp_index: int, seq: int) -> int:
        return self.mr.buf + (qp_index * self.args.queue_depth + seq % self.args.queue_depth) * self.slot

    def post_recv(self, qp_index: int, seq: int) -> None:
        from pyverbs.wr import SGE, RecvWR

        sge = SGE(self._addr(qp_index, seq), self.slot, self.mr.lkey)
        self.qps[qp_index].post_recv(RecvWR(wr_id=(qp_index << 32) | (seq & 0xFFFFFFFF), num_sge=1, sg=[sge]))

    def post_send(self, qp_index: int, seq: int, peer: dict[str, Any]) -> None:
        from pyverbs.wr import SGE, SendWR

        opcode = {"send": self.e.IBV_WR_SEND, "write": self.e.IBV_WR_RDMA_WRITE,
                  "read": self.e.IBV_WR_RDMA_READ}[self.args.opcode]
        base, piece = self._addr(qp_index, seq), self.args.size // self.args.sges
        lengths = [piece] * (self.args.sges - 1) + [self.args.size - piece * (self.args.sges - 1)]
        offsets = [sum(lengths[:i]) for i in range(len(lengths))]
        sges = [SGE(base + off, n, self.mr.lkey) for off, n in zip(offsets, lengths)]
        wr = SendWR(wr_id=(qp_index << 32) | (seq & 0xFFFFFFFF), opcode=opcode, num_sge=len(sges), sg=sges,
                    send_flags=self.e.IBV_SEND_SIGNALED)
        if self.ud:
            wr.set_wr_ud(self.ahs[0], peer["qpns"][qp_index], QKEY)
        elif self.args.opcode != "send":
            remote = peer["addr"] + (qp_index * self.args.queue_depth + seq % self.args.queue_depth) * self.slot
            wr.set_wr_rdma(peer["rkey"], remote)
        self.qps[qp_index].post_send(wr)

    def poll(self) -> list[Any]:
        """Completions now; a failed one raises with its status."""
        n, wcs = self.cq.poll(num_entries=64)
        for wc in wcs[:n]:
            if wc.status != self.e.IBV_WC_SUCCESS:
                raise RuntimeError(f"work completion failed with ibv_wc_status {wc.status} "
                                   f"(QP {wc.qp_num}, vendor error {wc.vendor_err})")
        return list(wcs[:n])


def _read_line(sock: socket.socket) -> dict[str, Any]:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the peer closed the control connection")
        data += chunk
    return json.loads(data)


def _send_line(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


def server(args: argparse.Namespace) -> dict[str, Any]:
    """Wait for the client, connect, keep receives posted until the client says it is done."""
    verbs = Verbs(args)
    listener = socket.create_server((args.bind, 0))
    listener.settimeout(args.io_timeout)
    print(json.dumps({"event": "ready", "port": listener.getsockname()[1]}), flush=True)
    control, _ = listener.accept()
    control.settimeout(args.io_timeout)
    peer = _read_line(control)
    verbs.connect(peer)
    receiving = args.opcode == "send"
    if receiving:
        for i in range(args.connections):
            for seq in range(args.queue_depth):
                verbs.post_recv(i, seq)
    _send_line(control, verbs.info())
    posted = [args.queue_depth] * args.connections
    received = 0
    deadline = time.monotonic() + args.duration + 2 * args.io_timeout
    while not select.select([control], [], [], 0)[0]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the client did not finish within {args.duration + 2 * args.io_timeout:g} s")
        for wc in verbs.poll() if receiving else []:
            i = wc.wr_id >> 32
            received += 1
            verbs.post_recv(i, posted[i])
            posted[i] += 1
        if not receiving:
            time.sleep(0.01)  # WRITE/READ: the server's CPU takes no part
    done = _read_line(control)
    _send_line(control, {"received": received})
    return {"received": received, "client_messages": done["messages"]}


def client(args: argparse.Namespace) -> dict[str, Any]:
    """Connect, post work requests for the duration, drain, and report."""
    verbs = Verbs(args)
    host, _, port = args.connect.rpartition(":")
    control = socket.create_connection((host, int(port)), timeout=args.io_timeout)
    _send_line(control, verbs.info())
    peer = _read_line(control)
    verbs.connect(peer)
    latency = LatencyHistogram()
    outstanding: list[deque[int]] = [deque() for _ in verbs.qps]
    seqs = [0] * len(verbs.qps)
    completed = 0
    start = last_progress = time.monotonic()
    deadline = start + args.duration
    while True:
        now = time.monotonic()
        if now < deadline:
            for i, queue in enumerate(outstanding):
                while len(queue) + args.batch <= args.queue_depth:
                    for _ in range(args.batch):
                        verbs.post_send(i, seqs[i], peer)
                        seqs[i] += 1
                    queue.extend([time.perf_counter_ns()] * args.batch)
        elif not any(outstanding):
            break
        wcs = verbs.poll()
        done_ns = time.perf_counter_ns()
        for wc in wcs:
            latency.add(done_ns - outstanding[wc.wr_id >> 32].popleft())
        if wcs:
            completed += len(wcs)
            last_progress = now
        elif now - last_progress > args.io_timeout:
            raise TimeoutError(f"no completion for {args.io_timeout:g} s ({sum(map(len, outstanding))} in flight)")
    elapsed_s = time.monotonic() - start
    _send_line(control, {"event": "done", "messages": completed})
    server_count = _read_line(control)["received"]
    return {"messages": completed, "bytes": completed * args.size, "elapsed_s": elapsed_s,
            "server_received": server_count, "latency": latency.to_dict()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dpro.anomaly.engines.verbs_worker")
    parser.add_argument("role", choices=["server", "client"])
    parser.add_argument("--bind", default="0.0.0.0", help="server: control address to listen on")
    parser.add_argument("--connect", help="client: HOST:PORT of the server's control socket")
    parser.add_argument("--address", required=True, help="this end's IP address (finds its RoCE GID)")
    parser.add_argument("--device", required=True)
    parser.add_argument("--ib-port", type=int, default=1)
    parser.add_argument("--gid-index", type=int)
    parser.add_argument("--transport", choices=["rc", "uc", "ud"], default="rc")
    parser.add_argument("--opcode", choices=["send", "write", "read"], default="send")
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--queue-depth", type=int, default=1)
    parser.add_argument("--sges", type=int, default=1)
    parser.add_argument("--mtu", type=int)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--io-timeout", type=float, required=True)
    args = parser.parse_args(argv)
    try:
        result = server(args) if args.role == "server" else client(args)
    except ImportError as e:
        _fail([f"pyverbs is not importable: {e}"])
    except Exception as e:  # pyverbs raises its own error types; all end the run the same way
        _fail([f"{type(e).__name__}: {e}"])
    print(json.dumps({"event": "done", **result}), flush=True)


if __name__ == "__main__":
    main()
