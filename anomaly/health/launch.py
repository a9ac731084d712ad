"""``dpro health`` without a launcher: the check started as a local job of ``nproc`` processes
of the same command, each a rank (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``... set as torchrun
would), waited for and cleaned up."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

__all__ = ["COULD_NOT_RUN", "LOCAL_GRACE_S", "run_locally"]

COULD_NOT_RUN = 3  # dpro health's exit code for any error (0, 1 and 2 are verdicts)
LOCAL_GRACE_S = 30.0  # how long the other ranks may outlive rank 0 (or a failed rank)


def run_locally(nproc: int, args: list[str]) -> int:
    """Start ``nproc`` processes of ``python -m dpro health ARGS`` as the ranks of a local job;
    rank 0's exit code, or :data:`COULD_NOT_RUN` when any rank ended with another code."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(nproc):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, "-m", "dpro", "health", *args], env=env))
    try:
        while procs[0].poll() is None and all(p.poll() in (None, 0, 1, 2) for p in procs):
            time.sleep(0.1)
        deadline = time.monotonic() + LOCAL_GRACE_S  # the others finish with rank 0, or are stopped
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in procs]
    return codes[0] if all(c in (0, 1, 2) for c in codes) else COULD_NOT_RUN
