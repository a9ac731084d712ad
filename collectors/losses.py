"""What dpro could not save while recording, and why: told by the ranks to their node's ``dpro
record`` over a socket that needs no disk (a full disk is the commonest reason), kept by it in the
node's ``node.json`` and said on the terminal.

A rank sends one datagram per loss to an abstract Unix socket (Linux: a name, no file) that the
recorder bound and named in ``$DPRO_REPORT_SOCKET``; a rank that cannot reach it (another network
namespace, no recorder) keeps the loss in its ``errors.log`` alone, as before.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from typing import Any

from dpro.run_format import not_saved_reason

__all__ = ["ENV_REPORT_SOCKET", "LossListener", "loss", "report_loss"]

ENV_REPORT_SOCKET = "DPRO_REPORT_SOCKET"
_MAX_DATAGRAM = 4096
_MAX_TEXT = 1000  # of a loss's why and detail: a datagram holds the whole entry


def loss(file: str, error: BaseException | str, rank: int | None = None, step: int | None = None,
         stopped: bool = False) -> dict[str, Any]:
    """One loss: ``file`` (relative to the run) not saved, ``why`` in words (``disk full``...),
    ``detail`` (the error), the ``rank`` and the ``step`` it happened at where known, and whether
    dpro ``stopped`` recording in that rank for it."""
    why = not_saved_reason(error) if isinstance(error, OSError) else str(error)
    detail = str(error) if isinstance(error, BaseException) else why
    return {"file": file, "why": why[:_MAX_TEXT], "detail": detail[:_MAX_TEXT], "rank": rank, "step": step,
            "stopped": stopped}


def report_loss(entry: dict[str, Any]) -> None:
    """Tell this node's recorder (best effort: never raises)."""
    name = os.environ.get(ENV_REPORT_SOCKET)
    if not name:
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.setblocking(False)  # a recorder that stopped reading never holds the job up: the report is dropped
            s.sendto(json.dumps(entry).encode(), "\0" + name)
    except OSError:
        pass


class LossListener:
    """The recorder's end: collects the ranks' losses in :attr:`received` while the job runs."""

    def __init__(self) -> None:
        self.name = f"dpro-record-{os.getpid()}-{os.urandom(4).hex()}"
        self.received: list[dict[str, Any]] = []
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind("\0" + self.name)
        self._socket.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dpro-losses", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                data = self._socket.recv(_MAX_DATAGRAM)
            except TimeoutError:
                if self._stop.is_set():  # asked to stop, and nothing left to read
                    return
                continue
            except OSError:
                return
            try:
                entry = json.loads(data)
            except ValueError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("file"), str) and isinstance(entry.get("why"), str):
                self.received.append(entry)  # a datagram of another process of the host, malformed: dropped

    def close(self) -> list[dict[str, Any]]:
        """Stop listening (after the job ended); every loss received."""
        self._stop.set()
        self._thread.join(timeout=2)
        self._socket.close()
        return self.received
