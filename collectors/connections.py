"""A background sampler of the job's TCP connections (``ss -tinH``), per node.

Gloo, NCCL's socket transport and the rendezvous store talk over TCP; the kernel keeps, per
connection, the bytes acknowledged, the time spent with data to send (``busy``) and how much of
it the receiver's window (``rwnd_limited``) or the sender's own buffer (``sndbuf_limited``)
held the connection back rather than the network, the RTT and retransmissions. Sampled every ``interval_s`` in the ``dpro record`` process (the job pays
nothing) and appended to a CSV as they come, they give each connection's sending rate while it
was busy: the per-connection statistics C4 localizes slow NICs and links from.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from dpro.collectors.sampling import CsvSampler

COLUMNS = ("time_ns", "pid", "local", "peer", "bytes_acked", "bytes_received", "busy_ms", "rtt_ms",
           "min_rtt_ms", "delivery_rate_bps", "retrans_total", "rwnd_limited_ms", "sndbuf_limited_ms")

# "[State] Recv-Q Send-Q Local Peer [users:((...))]" (no state column when ss filters by state)
_SOCKET = re.compile(r"^(?:[A-Z][A-Z-]*\s+)?\d+\s+\d+\s+(?P<local>\S+)\s+(?P<peer>\S+)(?:\s+users:\(\((?P<users>.*)\)\))?")
_PIDS = re.compile(r"pid=(\d+)")
_FIELDS = {
    "bytes_acked": re.compile(r"\bbytes_acked:(\d+)"), "bytes_received": re.compile(r"\bbytes_received:(\d+)"),
    "busy_ms": re.compile(r"\bbusy:(\d+)ms"), "rtt_ms": re.compile(r"\brtt:([\d.]+)/"),
    "min_rtt_ms": re.compile(r"\bminrtt:([\d.]+)"), "delivery_rate_bps": re.compile(r"\bdelivery_rate (\d+)bps"),
    "retrans_total": re.compile(r"\bretrans:\d+/(\d+)"),
    "rwnd_limited_ms": re.compile(r"\brwnd_limited:(\d+)ms"), "sndbuf_limited_ms": re.compile(r"\bsndbuf_limited:(\d+)ms"),
}


def parse_ss(text: str) -> list[dict[str, str]]:
    """Sockets of ``ss -tinpH`` output (a socket line, then its indented info line), each with
    ``local``, ``peer``, ``pids`` and the :data:`COLUMNS` found in its info ("" if absent)."""
    out: list[dict[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            m = _SOCKET.match(line)
            if m:
                out.append({"local": m["local"], "peer": m["peer"], "pids": " ".join(_PIDS.findall(m["users"] or ""))})
        elif out:
            for name, pattern in _FIELDS.items():
                found = pattern.search(line)
                out[-1][name] = found.group(1) if found else ""
    return out


class ConnectionSampler(CsvSampler):
    """Samples the TCP connections of process ``root`` (the job) and its descendants (torchrun
    starts its workers in sessions of their own)."""

    columns = COLUMNS

    def __init__(self, path: Path, root: int, interval_s: float = 0.5) -> None:
        super().__init__(path, interval_s)
        self.root = root

    def start(self) -> str:
        """Start sampling; a one-line note of what is sampled, or why nothing is."""
        if shutil.which("ss") is None:
            return "not sampled: ss (iproute2) not found"
        self._launch("dpro-connection-sampler")
        return f"the job's TCP connections sampled every {self.interval_s * 1000:.0f} ms (ss)"

    def _sample(self) -> list[list[Any]]:
        now = time.time_ns()
        text = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True, text=True,
                              timeout=10).stdout
        job = descendants(self.root)
        rows = []
        for sock in parse_ss(text):
            pid = next((p for p in sock["pids"].split() if int(p) in job), None)
            if pid is not None:
                rows.append([now, pid, sock["local"], sock["peer"], *(sock.get(c, "") for c in COLUMNS[4:])])
        return rows


def descendants(root: int, proc: Path = Path("/proc")) -> set[int]:
    """``root`` and every process below it, from the parent ids in ``/proc/<pid>/stat``."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # gone meanwhile
            parent = int(stat[stat.rindex(")") + 2:].split()[1])  # after "pid (comm) state"
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found
