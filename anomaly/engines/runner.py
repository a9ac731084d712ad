"""Run a server and a client process on two endpoints, watch both, and diff their counters.

Every wait is bounded: the server must say it is ready within ``timeout_s``; the pair must end
within ``run_s + timeout_s``; once one side has finished or failed, the other gets ``timeout_s``
(a failure: a short grace) before it is killed. Each process runs in a session of its own and
is killed with its whole group. Errors name the side and quote the end of its output.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO

from dpro.collectors.counters.snapshot import CounterDiff, Snapshot, diff
from dpro.anomaly.engines.base import Endpoint

POLL_S = 0.05
FAILURE_GRACE_S = 2.0  # how long the other side may take to notice a failure and exit


@dataclass
class Outcome:
    """What a pair run left: each side's output and exit code, counter diffs, errors."""

    server_stdout: str = ""
    client_stdout: str = ""
    ready_line: str | None = None
    counters: dict[str, CounterDiff] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class _Process:
    """A process behind an endpoint's prefix, its output read by threads as it comes."""

    def __init__(self, role: str, endpoint: Endpoint, argv: Sequence[str]) -> None:
        self.role = role
        self.proc = subprocess.Popen([*endpoint.prefix, *argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.stdout, True), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr, False), daemon=True)]
        for t in self._readers:
            t.start()

    def _read(self, stream: IO[str], into: list[str], forward: bool) -> None:
        for line in stream:
            into.append(line)
            if forward:
                self.lines.put(line)

    def poll(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def finish(self) -> str:
        """Wait for the output readers (the process has ended) and return its stdout."""
        for t in self._readers:
            t.join(timeout=5)
        return "".join(self.stdout)

    def tail(self) -> str:
        """The last lines it wrote (stderr first), for an error message."""
        text = "".join(self.stderr).strip() or "".join(self.stdout).strip()
        return " | ".join(line.strip() for line in text.splitlines()[-3:]) or "no output"

    def exit_error(self) -> str | None:
        code = self.proc.returncode
        if code == 0 or code is None:
            return None
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return f"{self.role} {how}: {self.tail()}"


def run_pair(server: Endpoint, client: Endpoint, server_argv: Sequence[str],
             client_argv: Callable[[str], Sequence[str]], ready: Callable[[str], bool],
             probe_args: Callable[[Endpoint], Sequence[str]], run_s: float, timeout_s: float) -> Outcome:
    """Start the server, wait for a stdout line that ``ready`` accepts, start the client with
    ``client_argv(that line)``, and watch both; counters are snapshotted on both endpoints
    (``python -m dpro.collectors.counters *probe_args(endpoint)``) before and after."""
    out = Outcome()
    endpoints = {"server": server, "client": client}
    before = _snapshots(endpoints, probe_args, timeout_s, out.notes)
    procs: list[_Process] = []
    try:
        srv = _start("server", server, server_argv, out)
        if srv is None:
            return out
        procs.append(srv)
        out.ready_line = _wait_ready(srv, ready, timeout_s, out)
        if out.ready_line is None:
            return out
        cli = _start("client", client, client_argv(out.ready_line), out)
        if cli is None:
            return out
        procs.append(cli)
        _watch(srv, cli, run_s, timeout_s, out)
    finally:
        for p in procs:
            p.kill()
        out.server_stdout = procs[0].finish() if procs else ""
        out.client_stdout = procs[1].finish() if len(procs) > 1 else ""
    after = _snapshots({role: endpoints[role] for role in before}, probe_args, timeout_s, out.notes)
    out.counters = {role: diff(before[role], after[role]) for role in after}
    return out


def _start(role: str, endpoint: Endpoint, argv: Sequence[str], out: Outcome) -> _Process | None:
    try:
        return _Process(role, endpoint, argv)
    except OSError as e:
        out.errors.append(f"{role} could not start ({' '.join([*endpoint.prefix, *argv][:3])}...): {e}")
        return None


def _wait_ready(srv: _Process, ready: Callable[[str], bool], timeout_s: float, out: Outcome) -> str | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = srv.lines.get(timeout=POLL_S)
        except queue.Empty:
            if srv.poll() is not None:
                srv.finish()
                out.errors.append(f"server ended before it was ready: {srv.exit_error() or srv.tail()}")
                return None
            continue
        if ready(line):
            return line
    out.errors.append(f"server did not become ready within {timeout_s:g} s: killed (its output: {srv.tail()})")
    return None


def _watch(srv: _Process, cli: _Process, run_s: float, timeout_s: float, out: Outcome) -> None:
    deadline = time.monotonic() + run_s + timeout_s
    ended: dict[str, float] = {}
    while True:
        now = time.monotonic()
        for p in (srv, cli):
            if p.role not in ended and p.poll() is not None:
                ended[p.role] = now
                p.finish()  # all its output, for the error message
                if error := p.exit_error():
                    out.errors.append(error)
        if len(ended) == 2:
            return
        if ended:
            [(role, at)] = ended.items()
            other = cli if role == "server" else srv
            wait = FAILURE_GRACE_S if out.errors else timeout_s
            if now - at > wait:
                out.errors.append(f"{other.role} still running {wait:g} s after the {role} ended: killed")
                return
        if now > deadline:
            running = " and ".join(p.role for p in (srv, cli) if p.role not in ended)
            out.errors.append(f"{running} still running after {run_s + timeout_s:g} s "
                              f"(duration {run_s:g} s + timeout {timeout_s:g} s): killed")
            return
        time.sleep(POLL_S)


def _snapshots(endpoints: dict[str, Endpoint], probe_args: Callable[[Endpoint], Sequence[str]],
               timeout_s: float, notes: list[str]) -> dict[str, Snapshot]:
    if not endpoints:
        return {}
    with ThreadPoolExecutor(len(endpoints)) as pool:
        futures = {role: pool.submit(_probe, e, probe_args(e), timeout_s) for role, e in endpoints.items()}
    snaps = {}
    for role, f in futures.items():
        snap, error = f.result()
        if snap is None:
            notes.append(f"{role} counters not read: {error}")
        else:
            snaps[role] = snap
    return snaps


def _probe(endpoint: Endpoint, args: Sequence[str], timeout_s: float) -> tuple[Snapshot | None, str | None]:
    argv = [*endpoint.prefix, endpoint.python, "-m", "dpro.collectors.counters", *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, start_new_session=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    if proc.returncode != 0:
        return None, (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    try:
        return Snapshot.from_dict(json.loads(proc.stdout)), None
    except (ValueError, KeyError) as e:
        return None, f"unreadable probe output ({e})"
