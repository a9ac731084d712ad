"""node-problem-detector's custom plugin protocol (``dpro health --npd``): this node's GPU and
NIC checks and the last nightly verdict as one line of at most :data:`NPD_MAX_CHARS`, and an exit
code: 0 OK, 1 NonOK, 2 Unknown."""

from __future__ import annotations

import os
import socket

from dpro.anomaly.health.gpu_checks import GpuWatch
from dpro.anomaly.health.history import DEFAULT_DB, History
from dpro.anomaly.health.model import Node
from dpro.anomaly.health.nic import NicWatch

__all__ = ["NPD_MAX_CHARS", "NPD_NONOK", "NPD_OK", "NPD_UNKNOWN", "node_problem"]

NPD_OK, NPD_NONOK, NPD_UNKNOWN = 0, 1, 2  # node-problem-detector's custom plugin exit codes
NPD_MAX_CHARS = 80  # node-problem-detector's default max_output_length


def node_problem(db: str | None) -> tuple[int, str]:
    """The plugin's exit code and its line (any failure is "unknown", said in the line)."""
    try:
        gpus, nics = GpuWatch(), NicWatch()
        gpus.start()
        nics.start()
        node = Node(socket.gethostname(), gpus.finish() + nics.finish())
        last = None
        if db or os.environ.get("DPRO_HEALTH_DB") or DEFAULT_DB.expanduser().exists():
            with History.open(db) as history:
                last = history.last_verdict(node.host)
    except Exception as e:  # noqa: BLE001 -- the protocol: any failure is "unknown", said in the line
        return NPD_UNKNOWN, f"unknown: {type(e).__name__}: {e}"[:NPD_MAX_CHARS]
    bad = [c for c in node.checks if c.status in ("warn", "fail")]
    nightly_bad = last is not None and last[0] != "healthy"
    if not bad and not nightly_bad:
        tail = f"; nightly {last[1][:10]} healthy" if last else ""
        return NPD_OK, f"healthy: {sum(c.status == 'pass' for c in node.checks)} checks passed{tail}"[:NPD_MAX_CHARS]
    parts = [f"{c.name}: {c.message}" for c in bad] + ([f"nightly {last[1][:10]}: {last[0]}"] if nightly_bad else [])
    return NPD_NONOK, f"{node.verdict if bad else last[0]}: {'; '.join(parts)}"[:NPD_MAX_CHARS]
