"""One launcher command for a torchrun job across a namespace cluster's hosts: what a user's
``srun``/``mpirun`` line is to ``dpro optimize --trial``, which wraps one command in ``dpro
record``. Each host's torchrun runs in its namespace (``ip netns exec``, its own hostname, its
veth for gloo), in this process's session, so that stopping the trial stops them all.

    python -m benchmarks.testbed.launch HOSTS.json -- job.py --spec ... --steps 60

``HOSTS.json``: ``[{"index", "name", "netns", "ip", "veth"}, ...]`` (:func:`hosts_file`). The
master port is drawn free at each launch. Exits with the first failing host's code.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tools.testing.netns import _SET_HOSTNAME_AND_EXEC, FAIL_FAST_S, TERM_GRACE_S


def hosts_file(cluster, path: Path) -> Path:
    """Write ``cluster``'s hosts for the launcher to ``path``."""
    path.write_text(json.dumps([{k: v for k, v in asdict(h).items() if k != "bridge_port"} for h in cluster.hosts]))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def main(argv: list[str]) -> int:
    hosts = json.loads(Path(argv[0]).read_text())
    program = argv[argv.index("--") + 1:]
    port = _free_port()
    procs = []
    for h in hosts:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(hosts)), "--nproc-per-node", "1",
                    "--node-rank", str(h["index"]), "--master-addr", hosts[0]["ip"], "--master-port", str(port),
                    *program]
        command = ["ip", "netns", "exec", h["netns"], "unshare", "--uts", "--", sys.executable, "-c",
                   _SET_HOSTNAME_AND_EXEC, h["name"], *torchrun]
        procs.append(subprocess.Popen(command, env={**os.environ, "GLOO_SOCKET_IFNAME": h["veth"]}))
    stop_at = None
    while None in (codes := [p.poll() for p in procs]):
        if stop_at is None and any(code not in (None, 0) for code in codes):
            stop_at = time.monotonic() + FAIL_FAST_S
        if stop_at is not None and time.monotonic() > stop_at:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            time.sleep(TERM_GRACE_S)
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.1)
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
