"""A real PostgreSQL server for tests: ``initdb`` and ``pg_ctl`` in a temporary folder, run as a
non-root user (PostgreSQL refuses root; ``nobody`` when the tests run as root), on a free port,
stopped and removed at the end. Optionally inside a network namespace, listening on its host's
address, so that namespace hosts can reach it.

    >>> with PostgresServer() as server:                      # doctest: +SKIP
    ...     server.url("health")                              # postgresql://dpro@127.0.0.1:PORT/health
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

__all__ = ["PostgresServer", "missing_postgres"]

USER = "dpro"  # the server's superuser (trust authentication: a test server on loopback or a test namespace)


def missing_postgres() -> str | None:
    """Why no server can be started here (for pytest.skip), or None."""
    absent = [b for b in ("initdb", "pg_ctl", "psql") if shutil.which(b) is None]
    if absent:
        return f"PostgreSQL's {' and '.join(absent)} not found (Debian: apt-get install postgresql)"
    return None


class PostgresServer:
    """A server of its own (a context manager). ``netns``: run it in this network namespace,
    listening on ``address`` there (default loopback)."""

    def __init__(self, netns: str | None = None, address: str = "127.0.0.1") -> None:
        self.netns = netns
        self.address = address
        self.port = _free_port() if netns is None else 5432
        self.folder = Path(tempfile.mkdtemp(prefix="dpro-pg-"))

    def __enter__(self) -> PostgresServer:
        if os.geteuid() == 0:
            shutil.chown(self.folder, "nobody")
        try:
            self._as_owner(["initdb", "-D", str(self.folder / "data"), "-U", USER, "--auth=trust", "-E", "UTF8",
                            "--no-instructions"])
            if self.address != "127.0.0.1":  # the namespace hosts of its subnet reach it too
                with open(self.folder / "data" / "pg_hba.conf", "a") as hba:
                    hba.write("host all all samenet trust\n")
            self._as_owner(["pg_ctl", "-D", str(self.folder / "data"), "-l", str(self.folder / "log"), "-w", "-o",
                            f"-p {self.port} -k {self.folder} -c listen_addresses={self.address}", "start"])
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._as_owner(["pg_ctl", "-D", str(self.folder / "data"), "-m", "immediate", "-w", "stop"])
        finally:
            self._remove()

    def url(self, database: str = "postgres") -> str:
        """A SQLAlchemy URL of ``database`` (created first unless it is ``postgres``)."""
        if database != "postgres":
            self.psql(f'CREATE DATABASE "{database}"')
        return f"postgresql://{USER}@{self.address}:{self.port}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` with the server's own ``psql`` (through its Unix socket); its output."""
        return self._as_owner(["psql", "-h", str(self.folder), "-p", str(self.port), "-U", USER, "-d", database,
                               "-At", "-c", sql])

    def _as_owner(self, argv: list[str]) -> str:
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        owner = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
        done = subprocess.run([*prefix, *owner, *argv], capture_output=True, text=True, timeout=120, cwd="/")
        if done.returncode:
            log = (self.folder / "log").read_text() if (self.folder / "log").exists() else ""
            raise RuntimeError(f"{' '.join(argv[:2])} failed: {done.stderr.strip()} {log[-2000:]}")
        return done.stdout

    def _remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
