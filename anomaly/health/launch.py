"""``dpro health`` without a launcher: the check started as a local job of ``nproc`` processes
of the same command, each a rank (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``... set as torchrun
would), waited for and cleaned up."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

__all__ = ["LOCAL_GRACE_S", "VERDICTS", "run_locally"]

VERDICTS = (0, 1, 2)  # dpro health's exit codes that are verdicts (healthy, degraded, failed)
LOCAL_GRACE_S = 30.0  # how long the other ranks may outlive rank 0 (or a failed rank)


def run_locally(nproc: int, args: list[str]) -> list[int]:
    """Start ``nproc`` processes of ``python -m dpro health ARGS`` as the ranks of a local job;
    their exit codes, by rank (the others are stopped once rank 0 or a failed rank has ended and
    :data:`LOCAL_GRACE_S` passed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(nproc):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, "-m", "dpro", "health", *args], env=env))
    try:
        while procs[0].poll() is None and all(p.poll() in (None, *VERDICTS) for p in procs):
            time.sleep(0.1)
        deadline = time.monotonic() + LOCAL_GRACE_S  # the others finish with rank 0, or are stopped
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [p.returncode for p in procs]
