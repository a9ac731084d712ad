"""``dpro record``: run a command with dpro's bootstrap injected, and the node's collectors around it.

The command runs in a process group of its own; SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2
sent to dpro are forwarded to that group, as a terminal would deliver them, and when the job runs
in the foreground of a terminal, the terminal is handed to it (Ctrl-C reaches the job directly).
dpro ends the way the job ended: with its exit code, or killed by the same signal.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dpro.collectors import hooks
from dpro.collectors.apply import ENV_APPLY
from dpro.collectors.connections import ConnectionSampler
from dpro.collectors.counters import Snapshot, take_snapshot
from dpro.collectors.counters.sysfs import SYSFS_ROOT_ENV
from dpro.collectors.gpu import GpuSampler
from dpro.collectors.job_output import StderrFilter
from dpro.collectors.losses import ENV_REPORT_SOCKET, LossListener, loss
from dpro.collectors.metadata import ENV_NODE
from dpro.collectors.probe import ENV_PROBE
from dpro.errors import DproError
from dpro.run_format import (CONNECTIONS_FILE, COUNTERS_END_FILE, COUNTERS_START_FILE, GPU_SAMPLES_FILE, JOB_STDERR_FILE,
                             NCCL_LOG_PATTERN, NODE_FILE, RunFormatError, create_manifest, is_run_dir, nccl_dir, new_manifest, node_dir,
                             not_saved_reason, open_run, write_atomically, write_json_atomic)

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"
NODE_FILE_ROOM = 16384  # bytes node.json keeps free for its end (see _reserved)
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


class RecordError(DproError):
    """A reason not to start recording, said in one line."""


@dataclass(frozen=True)
class RecordOptions:
    output: Path
    skip: int = 10
    warmup: int = 2
    steps: int = 5
    force: bool = False
    join: bool = False
    gpu_interval_s: float = 0.1
    sysfs_root: str | None = None
    calibrate: bool = True
    probe: bool = False  # a pipeline's probe steps at half its micro-batches (dpro record --probe)
    apply: dict[str, Any] | None = None  # a strategy file's content (dpro record --apply)
    verbose: bool = False  # the job's stderr unfiltered (else the profiler's messages go to the node's log)
    strict: bool = False  # a failure to save fails the recording (dpro record --strict-record)


def prepare_run_dir(opts: RecordOptions, command: list[str]) -> bool:
    """Make ``opts.output`` ready to record into; return whether this node created the run.

    An existing non-empty directory is refused unless ``--join`` (add this node to a run other
    nodes are recording) or ``--force`` (replace a previous dpro run; never anything else).
    """
    out = opts.output
    if out.exists() and not out.is_dir():
        raise RecordError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if opts.join:
            if is_run_dir(out):
                try:
                    joined = open_run(out)
                except RunFormatError as e:
                    raise RecordError(f"cannot join {out}: {e}") from None
                _check_same_strategy(joined.manifest, opts)
        elif opts.force:
            if not is_run_dir(out):
                raise RecordError(f"{out} is not empty and is not a dpro run; --force only replaces "
                                  f"dpro runs")
            shutil.rmtree(out)
        else:
            raise RecordError(f"{out} exists and is not empty; use --force to replace it, or --join "
                              f"to add this node to a run being recorded")
    options = {k: v for k, v in asdict(opts).items() if k in ("skip", "warmup", "steps", "calibrate", "probe", "apply")
               and v is not None}
    return create_manifest(out, new_manifest(command, options, time.time_ns()))


def _check_same_strategy(manifest: dict[str, Any], opts: RecordOptions) -> None:
    """Every node of a job applies the same strategy (ranks whose buckets or hooks differ would
    hang in their first all-reduce): a node joining a run with another ``--apply`` is refused, and
    one with another ``--probe``, or with ``--probe`` and another window (a pipeline's ranks switch
    micro-batches for the probe at one step)."""
    options = manifest.get("options") or {}
    theirs = (options.get("apply") or {}).get("settings")
    ours = (opts.apply or {}).get("settings")
    if theirs != ours:
        raise RecordError(f"the run's other nodes apply {theirs or 'no strategy'}, this node {ours or 'none'}: "
                          "give every node the same --apply")
    if bool(options.get("probe")) != opts.probe:  # a pipeline's ranks switch micro-batches together, or stop
        raise RecordError(f"the run's other nodes record {'with' if options.get('probe') else 'without'} the "
                          "micro-batch probe: give every node the same --probe")
    if opts.probe:
        for name in ("skip", "warmup", "steps"):
            if name in options and options[name] != getattr(opts, name):
                raise RecordError(f"the run's other nodes record with --{name} {options[name]}, this node "
                                  f"{getattr(opts, name)}: give every node the same window (a pipeline's ranks "
                                  "switch micro-batches for the probe at the same step)")


def child_environment(opts: RecordOptions, base: dict[str, str]) -> tuple[dict[str, str], str]:
    """The job's environment with dpro's bootstrap and settings; and a note on NCCL logging."""
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BOOTSTRAP_DIR), base.get("PYTHONPATH")]))
    env[hooks.ENV_RUN_DIR] = str(opts.output.resolve())
    env[hooks.ENV_SKIP], env[hooks.ENV_WARMUP], env[hooks.ENV_STEPS] = (
        str(opts.skip), str(opts.warmup), str(opts.steps))
    env[hooks.ENV_CALIBRATE] = "1" if opts.calibrate else "0"
    env[ENV_PROBE] = "1" if opts.probe else "0"
    if opts.apply is not None:
        env[ENV_APPLY] = json.dumps(opts.apply["settings"])
    if opts.sysfs_root:
        env[SYSFS_ROOT_ENV] = opts.sysfs_root
    if "NCCL_DEBUG" in base:
        return env, f"NCCL_DEBUG={base['NCCL_DEBUG']} set by the user: NCCL logs left where the user sends them"
    try:
        nccl_dir(opts.output).mkdir(exist_ok=True)
    except OSError as e:
        return env, f"NCCL logs not kept: nccl/ cannot be made ({not_saved_reason(e)})"
    env["NCCL_DEBUG"] = "INFO"
    env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,ENV,GRAPH,TUNING")
    env.setdefault("NCCL_DEBUG_FILE", str(nccl_dir(opts.output.resolve()) / NCCL_LOG_PATTERN))
    return env, "NCCL_DEBUG=INFO"


def _foreground_tty() -> int | None:
    """The terminal's file descriptor when dpro runs in its foreground, else None."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def _give_terminal(tty: int | None) -> None:
    """Hand the terminal to the calling process's group (with SIGTTOU ignored meanwhile)."""
    if tty is None:
        return
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(tty, os.getpgrp())
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


def _start_child(command: list[str], env: dict[str, str], tty: int | None, stderr: int | None) -> subprocess.Popen:
    def in_child() -> None:
        os.setpgid(0, 0)
        _give_terminal(tty)

    try:
        return subprocess.Popen(command, env=env, preexec_fn=in_child, stderr=stderr)
    except FileNotFoundError:
        raise RecordError(f"command not found: {command[0]}") from None
    except PermissionError:
        raise RecordError(f"permission denied: {command[0]}") from None


@dataclass
class Recorded:
    """How a recording ended: the job's ``status`` (negative: killed by that signal), and what
    dpro could not save (:func:`dpro.collectors.losses.loss` entries; empty when all was)."""

    status: int
    lost: list[dict[str, Any]]
    unrecorded: str | None = None  # why the job ran without dpro (the run directory could not be made)


def record(command: list[str], opts: RecordOptions, say: Callable[[str], None] = lambda line: None) -> Recorded:
    """Record ``command``. Whatever happens to dpro's own writing (a full disk, a read-only or
    removed run folder) the job runs to its end; what was not saved is returned and kept in the
    node's ``node.json`` where anything can be written. Bad options and a run folder in use are
    refused before the job starts (:class:`RecordError`). ``say`` is told, before the job
    starts, when it runs unrecorded."""
    if not command:
        raise RecordError("missing the command to record, e.g. dpro record -o RUN -- torchrun "
                          "--nproc-per-node 2 train.py")
    host = socket.gethostname()
    node = node_dir(opts.output, host, os.getpid())
    try:
        prepare_run_dir(opts, command)
        node.mkdir(parents=True)
    except OSError as e:  # the run cannot be written at all: the job runs as it would without dpro
        why = f"cannot write the run directory {opts.output}: {not_saved_reason(e)}"
        if opts.strict:
            raise RecordError(f"{why} (--strict-record: the job was not started)") from None
        say(f"{why}; the job runs unrecorded (--strict-record refuses to start it)")
        return Recorded(_run_unrecorded(command), [loss(str(opts.output), e)], why)
    lost: list[dict[str, Any]] = []
    saved = lambda path, write: _saved(path, write, opts.output, lost)  # noqa: E731
    env, nccl_note = child_environment(opts, dict(os.environ))
    env[ENV_NODE] = node.name
    listener = LossListener()
    env[ENV_REPORT_SOCKET] = listener.name
    facts: dict[str, Any] = {"host": host, "pid": os.getpid(), "command": command,
                             "started_ns": time.time_ns(), "collectors": {"nccl": nccl_note}}
    saved(node / NODE_FILE, lambda path: write_atomically(path, lambda tmp: tmp.write_text(_reserved(facts)), False))
    saved(node / COUNTERS_START_FILE, lambda path: write_json_atomic(path, take_snapshot(opts.sysfs_root).to_dict(), parents=False))
    tty = _foreground_tty()
    stderr = None if opts.verbose else StderrFilter(node / JOB_STDERR_FILE)
    try:
        child = _start_child(command, env, tty, stderr.child_fd if stderr else None)
    except RecordError:
        listener.close()
        raise
    finally:
        if stderr:
            stderr.start()
    sampler = GpuSampler(node / GPU_SAMPLES_FILE, opts.gpu_interval_s)
    facts["collectors"]["gpu"] = sampler.start()
    connections = ConnectionSampler(node / CONNECTIONS_FILE, child.pid)
    facts["collectors"]["connections"] = connections.start()
    try:
        status = _wait(child, tty)
    finally:
        sampler.stop()
        connections.stop()
        if stderr:
            stderr.stop()
        lost += listener.close()
    end = take_snapshot(opts.sysfs_root)
    saved(node / COUNTERS_END_FILE, lambda path: write_json_atomic(path, end.to_dict(), parents=False))
    facts["collectors"]["counters"] = _counters_note(end)
    facts["collectors"]["nccl"] += _nccl_logs_note(nccl_dir(opts.output))
    if sampler.error:
        facts["collectors"]["gpu"] += f"; stopped early: {sampler.error}"
    if connections.error:
        facts["collectors"]["connections"] += f"; stopped early: {connections.error}"
    for path, sampled in ((node / GPU_SAMPLES_FILE, sampler), (node / CONNECTIONS_FILE, connections)):
        if sampled.lost is not None:
            lost.append(loss(_relative(path, opts.output), sampled.lost))
    if stderr and stderr.error:
        lost.append(loss(_relative(node / JOB_STDERR_FILE, opts.output), stderr.error))
    if stderr and stderr.kept:
        facts["collectors"]["stderr"] = (f"{stderr.kept} line(s) of torch's messages about profiling kept off the "
                                         f"terminal, in {JOB_STDERR_FILE} (-v shows them)")
    facts.update(ended_ns=time.time_ns(), exit_code=status if status >= 0 else None,
                 signal=signal.Signals(-status).name if status < 0 else None)
    facts["lost"] = lost = _unique(lost)
    _save_node_facts(node / NODE_FILE, facts, opts.output, lost)
    return Recorded(status, lost)


def _saved(path: Path, write: Any, root: Path, lost: list[dict[str, Any]]) -> bool:
    """``write(path)``; a failure to write is kept in ``lost``, not raised."""
    try:
        write(path)
        return True
    except OSError as e:
        lost.append(loss(_relative(path, root), e))
        return False


def _reserved(facts: dict[str, Any]) -> str:
    """The node's facts as first written: JSON, then blanks (still JSON) that keep room on the disk
    for the facts of its end, which a full disk may have none left for."""
    return json.dumps(facts, indent=1, default=str) + "\n" + " " * NODE_FILE_ROOM + "\n"


def _save_node_facts(path: Path, facts: dict[str, Any], root: Path, lost: list[dict[str, Any]]) -> None:
    """Write the node's facts (its losses among them): atomically, else over the file written at
    the start, in the room it kept (never cut short: the losses are cut to fit first)."""
    if _saved(path, lambda p: write_json_atomic(p, facts, parents=False), root, []):
        return
    try:
        with open(path, "r+b") as f:  # never creates it: a removed run folder stays removed
            room = os.fstat(f.fileno()).st_size
            text = json.dumps(facts, default=str).encode()
            kept = list(facts.get("lost") or [])
            while len(text) > room and kept:
                kept.pop()
                text = json.dumps({**facts, "lost": kept, "lost_more": len(facts["lost"]) - len(kept)},
                                  default=str).encode()
            if len(text) <= room:
                f.write(text.ljust(room))  # within the blocks it holds: nothing new to allocate
                return
        lost.append(loss(_relative(path, root), "disk full (the node's facts no longer fit its file)"))
    except FileNotFoundError:  # never written (said when it was not), or its folder removed
        if not any(x["file"] == _relative(path, root) for x in lost):
            lost.append(loss(_relative(path, root), "its folder was removed"))
    except OSError as e:
        lost.append(loss(_relative(path, root), e))


def _unique(lost: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per file and reason (a rank tells each failure; the first says it)."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for entry in lost:
        seen.setdefault((entry.get("rank"), entry.get("file"), entry.get("why")), entry)
    return list(seen.values())


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _run_unrecorded(command: list[str]) -> int:
    """Run the job as it is, with no dpro in it; its exit status."""
    tty = _foreground_tty()
    return _wait(_start_child(command, dict(os.environ), tty, None), tty)


def _wait(child: subprocess.Popen, tty: int | None) -> int:
    """The job's exit status, the signals dpro gets meanwhile forwarded to its process group;
    then the terminal back to dpro."""
    forward = lambda signum, frame: _forward(child.pid, signum)  # noqa: E731
    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    try:
        return child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _give_terminal(tty)


def _forward(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def _nccl_logs_note(nccl_dir: Path) -> str:
    """Remove the NCCL log folder when the job left it empty (no NCCL in the job)."""
    if not nccl_dir.is_dir():
        return ""
    try:
        logs = len(list(nccl_dir.iterdir()))
    except FileNotFoundError:  # another node of the run found it empty and removed it meanwhile
        return "; no NCCL log written (the job did not use NCCL)"
    if logs:
        return f"; {logs} log file(s) in nccl/"
    try:
        nccl_dir.rmdir()
    except OSError:  # another node of the run wrote into it meanwhile
        return ""
    return "; no NCCL log written (the job did not use NCCL)"


def _counters_note(snapshot: Snapshot) -> str:
    """What the counter snapshots hold: devices per source, and what was missing."""
    devices: dict[str, set[str]] = {}
    for key in snapshot.values:
        devices.setdefault(key.source, set()).add(key.device)
    held = ", ".join(f"{source} {len(d)} device(s)" for source, d in sorted(devices.items()))
    return "; ".join([f"snapshots at start and end: {held or 'no counter'}", *snapshot.notes])


def exit_like(status: int) -> int:
    """Leave the way the job left: return its exit code, or die by the signal that killed it."""
    if status >= 0:
        return status
    signum = -status
    if signum not in (signal.SIGKILL, signal.SIGSTOP):  # the only two that cannot be caught
        signal.signal(signum, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signum)
    return 128 + signum  # only reached for signals whose default action is not to terminate
