"""The run directory: its layout, its manifest, its writers' helpers and its reader.

This module alone knows where things live in a run directory (see ``docs/run-format.md``)::

    RUN/
      run.json                      manifest: format name and version, command, options
      nodes/<host>-<pid>/node.json  one per ``dpro record`` process: host, times, exit status,
                                    what each node-level collector did
      nodes/<host>-<pid>/counters-start.json, counters-end.json   host counter snapshots
      nodes/<host>-<pid>/gpu-samples.csv, connections.csv          samplers
      ranks/<rank>/meta.json        per-rank metadata (host, groups, versions, devices, DDP buckets)
      ranks/<rank>/steps.csv        wall time of every step: step,start_ns,end_ns,phase
      ranks/<rank>/clock.json       offset of this rank's clock against rank 0
      ranks/<rank>/trace.json.gz    torch.profiler (Kineto) trace of the profiled steps
      ranks/<rank>/trace-shapes.json.gz  the second step after the window, with input shapes
      ranks/<rank>/calibration.json the profiler's cost per event, the job's collectives timed
      ranks/<rank>/collectives.json the window's collectives with their process groups, and its
                                    sends and receives with their peers (what gloo's traces omit)
      ranks/<rank>/trace-probe.json.gz, collectives-probe.json, probe.json  a pipeline's probe
                                    steps at half its micro-batches, their log and count
      ranks/<rank>/errors.log       failures of dpro's hooks in this rank (the job went on)
      nccl/<host>.<pid>.log         NCCL_DEBUG=INFO output, when NCCL is used
      derived/                      caches of the analysis (rebuilt whenever their inputs change)

Writers create files atomically (write to a temporary name, then rename) so that a reader never
sees half a file, even when the job is killed. Importing this module is cheap (no pandas): the
hooks inside the training job use it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from dpro.errors import DproError
from dpro.run_records import Calibration, NodeRecord, RankMeta

if TYPE_CHECKING:
    import pandas as pd

FORMAT_NAME = "dpro-run"
FORMAT_VERSION = "1.5"
MANIFEST = "run.json"
STEPS_COLUMNS = ("step", "start_ns", "end_ns", "phase")
DPRO_PHASES = ("warmup", "shapes", "probe", "export")
"""Phases of ``steps.csv`` whose extra time is dpro's own: the profiler's warm-up, the step
profiled with shapes, a pipeline's probe steps at another micro-batch count
(:mod:`dpro.collectors.probe`), and (format 1.0) the step that exported the trace."""

# file names inside a rank's and a node's directory
META_FILE, STEPS_FILE, CLOCK_FILE, TRACE_FILE, ERRORS_FILE, CALIBRATION_FILE = (
    "meta.json", "steps.csv", "clock.json", "trace.json.gz", "errors.log", "calibration.json")
SHAPES_TRACE_FILE = "trace-shapes.json.gz"
PROBE_FILE, PROBE_TRACE_FILE, PROBE_COLLECTIVES_FILE = "probe.json", "trace-probe.json.gz", "collectives-probe.json"
COLLECTIVES_FILE = "collectives.json"
NODE_FILE, COUNTERS_START_FILE, COUNTERS_END_FILE = "node.json", "counters-start.json", "counters-end.json"
GPU_SAMPLES_FILE, CONNECTIONS_FILE = "gpu-samples.csv", "connections.csv"
JOB_STDERR_FILE = "job-stderr.log"  # the job's stderr lines dpro kept off the terminal
CONNECTION_LIMITED_COLUMNS = ("rwnd_limited_ms", "sndbuf_limited_ms")
NCCL_LOG_PATTERN = "%h.%p.log"  # NCCL_DEBUG_FILE: NCCL replaces %h by the host and %p by the pid
DERIVED = "derived"
# the profiler events of autograd's backward functions (and every event nested in them) cost
# the profiler more than other events: calibration.json prices the two classes apart
BACKWARD_EVENT_PREFIX = "autograd::engine::evaluate_function"


class RunFormatError(DproError, ValueError):
    """A path that is not a run directory this version of dpro can read."""


# --- where things live ---------------------------------------------------------------------------


def rank_dir(root: Path, rank: int) -> Path:
    """The directory of one rank of a run."""
    return root / "ranks" / str(rank)


def node_dir(root: Path, host: str, pid: int) -> Path:
    """The directory of one ``dpro record`` process (a node) of a run."""
    return root / "nodes" / f"{host}-{pid}"


def nccl_dir(root: Path) -> Path:
    """Where the job's NCCL logs go (``NCCL_DEBUG_FILE``)."""
    return root / "nccl"


def early_errors_file(root: Path, pid: int) -> Path:
    """Where a hook's failure goes before its process knows its rank."""
    return root / f"errors-{pid}.log"


def user_cache_dir() -> Path:
    """dpro's per-user cache: ``$XDG_CACHE_HOME/dpro`` (default ``~/.cache/dpro``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dpro"


def may_write(folder: Path) -> bool:
    """Writable, and not marked read-only by its permission bits (which root would ignore); a
    folder not there yet, where its closest existing parent is (where it would be created)."""
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    try:
        return os.access(folder, os.W_OK) and bool(folder.stat().st_mode & 0o222)
    except OSError:
        return False


# --- writing ---------------------------------------------------------------------------------


def format_major(version: str) -> int:
    """The major number of a ``MAJOR.MINOR`` format version."""
    return int(str(version).split(".", 1)[0])


def write_atomically(path: Path, write: Callable[[Path], Any], parents: bool = True) -> None:
    """Call ``write(temporary path)``, then rename the file to ``path`` (readers never see half)."""
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_NOT_SAVED = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded", errno.EROFS: "read-only file system",
              errno.EACCES: "permission denied", errno.EPERM: "permission denied",
              errno.ENOENT: "its folder was removed", errno.ESTALE: "its folder was removed"}


def not_saved_reason(error: OSError) -> str:
    """Why a file could not be written, in the words ``dpro info`` shows (``disk full``...)."""
    return _NOT_SAVED.get(error.errno or 0, error.strerror or str(error))


def write_json_atomic(path: Path, data: Any, parents: bool = True) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and a rename (``parents``: make
    the folders above it where missing; the recorder's writes do not, so that a run folder
    removed while recording stays removed)."""
    text = json.dumps(data, indent=1, default=str) + "\n"
    write_atomically(path, lambda tmp: tmp.write_text(text), parents)


def read_json(path: Path) -> Any:
    """Read a JSON file written by dpro, with a one-line error when it is unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RunFormatError(f"cannot read {path}: {e}") from None


def new_manifest(command: list[str], options: dict[str, Any], created_ns: int) -> dict[str, Any]:
    """The manifest of a new run."""
    from dpro import __version__

    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "dpro_version": __version__,
        "created_ns": created_ns,
        "command": command,
        "options": options,
    }


def create_manifest(root: Path, manifest: dict[str, Any]) -> bool:
    """Create ``run.json`` unless it exists; return whether this call created it.

    Creation is exclusive (``O_EXCL``), so when several nodes start recording into the same
    shared directory at once, exactly one of them writes the manifest.
    """
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    try:
        os.link(tmp, root / MANIFEST)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


# --- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """A run directory opened for reading."""

    root: Path
    manifest: dict[str, Any]
    trace_file: ClassVar[str] = TRACE_FILE  # the profiled steps' trace and collective log
    collectives_file: ClassVar[str] = COLLECTIVES_FILE

    @property
    def ranks(self) -> list[int]:
        """Ranks that wrote something, in ascending order."""
        d = self.root / "ranks"
        if not d.is_dir():
            return []
        return sorted(int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit())

    def rank_dir(self, rank: int) -> Path:
        return rank_dir(self.root, rank)

    def rank_meta(self, rank: int) -> RankMeta:
        """The rank's ``meta.json`` (not ``present`` when the rank wrote none); an unreadable
        one raises :class:`RunFormatError`."""
        path = self.rank_dir(rank) / META_FILE
        return RankMeta.from_json(read_json(path)) if path.exists() else RankMeta()


    def _written(self, rank: int, name: str) -> Path | None:
        """The rank's file ``name``, when it was written."""
        path = self.rank_dir(rank) / name
        return path if path.exists() else None

    def trace_path(self, rank: int) -> Path | None:
        """The rank's Kineto trace, when it was written."""
        return self._written(rank, self.trace_file)

    def collective_log_path(self, rank: int) -> Path | None:
        """The rank's ``collectives.json`` (groups and peers of its window's communication), if written."""
        return self._written(rank, self.collectives_file)

    def errors_path(self, rank: int) -> Path:
        return self.rank_dir(rank) / ERRORS_FILE

    def error_count(self, rank: int) -> int:
        """How many failures of dpro's hooks the rank logged (``errors.log``: one timestamped line each)."""
        path = self.errors_path(rank)
        if not path.exists():
            return 0
        return sum(1 for line in path.read_text(errors="replace").splitlines() if line[:4].isdigit())

    def clock_offset_ns(self, rank: int) -> int:
        """The rank's recorded clock offset against rank 0 (0 where it was not measured)."""
        path = self.rank_dir(rank) / CLOCK_FILE
        return int((read_json(path).get("offset_ns") if path.exists() else None) or 0)

    def calibration(self, rank: int) -> Calibration:
        """The rank's ``calibration.json`` (empty when it was not calibrated)."""
        path = self.rank_dir(rank) / CALIBRATION_FILE
        return Calibration.from_json(read_json(path)) if path.exists() else Calibration()

    def steps(self, rank: int) -> pd.DataFrame:
        """Every step the rank timed: ``step`` (int64), ``start_ns``, ``end_ns`` (Int64, epoch ns;
        ``start_ns`` is missing for step 0, which begins somewhere in the script's setup),
        ``dur_ns`` (Int64) and ``phase`` ("", "warmup", "profiled", "shapes", "probe"; "export" in
        1.0 runs; a :class:`ProbeRun` reads its probe steps as "profiled", the window's as "window")."""
        import pandas as pd

        path = self.rank_dir(rank) / STEPS_FILE
        if not path.exists():
            return pd.DataFrame({"step": pd.Series(dtype="int64"), "start_ns": pd.Series(dtype="Int64"),
                                 "end_ns": pd.Series(dtype="Int64"), "dur_ns": pd.Series(dtype="Int64"),
                                 "phase": pd.Series(dtype="string")})
        try:
            df = pd.read_csv(path, dtype={"step": "int64", "start_ns": "Int64",
                                          "end_ns": "Int64", "phase": "string"},
                             keep_default_na=False, na_values={"start_ns": [""]})
        except (ValueError, pd.errors.ParserError) as e:
            raise RunFormatError(f"cannot read {path}: {e}") from None
        df["phase"] = df["phase"].fillna("")
        df["dur_ns"] = df["end_ns"] - df["start_ns"]
        return df[["step", "start_ns", "end_ns", "dur_ns", "phase"]]

    @cached_property
    def traced_ranks(self) -> list[int]:
        """The ranks that wrote a trace."""
        return [r for r in self.ranks if self.trace_path(r) is not None]

    @cached_property
    def metas(self) -> dict[int, RankMeta | None]:
        """Each rank's ``meta.json`` (:meth:`rank_meta`), read once per opened run; None where it
        is unreadable."""
        out: dict[int, RankMeta | None] = {}
        for r in self.ranks:
            try:
                out[r] = self.rank_meta(r)
            except RunFormatError:
                out[r] = None
        return out

    @cached_property
    def gaps(self) -> list[str]:
        """What this run lacks that a whole recording holds, one line each (empty when whole):
        ranks of the job (``world_size`` in the ranks' metadata) that wrote nothing, ranks whose
        ``meta.json`` is missing or unreadable, ranks without the trace the others wrote. Cheap
        (no trace is decoded) and read once per opened run."""
        ranks, metas = self.ranks, self.metas
        gaps = [f"rank {r}'s {META_FILE} is unreadable" for r, m in metas.items() if m is None]
        gaps += [f"rank {r} wrote no {META_FILE}" for r, m in metas.items() if m is not None and not m.present]
        world = max((m.world_size or 0 for m in metas.values() if m is not None), default=0)
        absent = sorted(set(range(world)) - set(ranks))
        if absent:
            gaps.insert(0, f"{_rank_list(absent)} of the job's {world} wrote nothing")
        traced = self.traced_ranks
        if traced and len(traced) < len(ranks):
            gaps += [self.why_no_trace(r) for r in ranks if r not in traced]
        gaps += [f"node {n.name} was lost{self.last_step_note(n)}" for n in self.node_records if not n.ended]
        return gaps

    @cached_property
    def node_records(self) -> list[NodeRecord]:
        """Every node's ``node.json`` as a record (an unreadable one: a node lost early), read once
        per opened run."""
        out = []
        for d in self.node_dirs():
            try:
                out.append(NodeRecord.from_json(d.name, read_json(d / NODE_FILE)))
            except RunFormatError:
                out.append(NodeRecord(d.name))
        return out

    def why_no_trace(self, rank: int) -> str:
        """Why ``rank`` has no trace, in one line: not saved (and why), its node lost, the rank
        stopped inside the profiling window, or the window not reached."""
        name = f"ranks/{rank}/{TRACE_FILE}"
        losses = [x for n in self.node_records for x in n.lost if x.file == name or (x.rank == rank and x.stopped)]
        if losses:
            lost = min(losses, key=lambda x: x.file != name)  # the trace's own loss first
            how = "" if lost.file == name else f" (writing {lost.file} at step {lost.step} failed)"
            return f"rank {rank}'s trace was not saved: {lost.why}{how}"
        node = self._node_of(rank)
        if node is not None and not node.ended:
            return f"rank {rank}'s node {node.name} was lost{self.last_step_note(node)}"
        steps = self.steps(rank)
        window = self.window()
        if not len(steps):
            return f"rank {rank} timed no step"
        last = int(steps["step"].max())
        if window is not None and window[0] <= last < window[1]:
            return f"rank {rank} stopped at step {last}, inside the profiling window (steps {window[0]}-{window[1] - 1})"
        if window is not None and last < window[0]:
            return f"rank {rank} ran {last + 1} steps: the profiling window (from step {window[0]}) was not reached"
        return f"rank {rank} wrote no trace"

    def why_no_traces(self) -> str:
        """:meth:`why_no_trace` of every rank, on one line (a run whose ranks wrote no trace)."""
        return "; ".join(self.why_no_trace(r) for r in self.ranks) or "no rank recorded anything"

    def window(self) -> tuple[int, int] | None:
        """The steps the profiler ran, ``[first, end)`` (warm-up and recorded), from the run's
        options; None where they are not known."""
        options = self.manifest.get("options") or {}
        try:
            first = int(options["skip"])
            return first, first + int(options["warmup"]) + int(options["steps"])
        except (KeyError, TypeError, ValueError):
            return None

    def _node_of(self, rank: int) -> NodeRecord | None:
        """The node whose ``dpro record`` started the rank (by the name the rank recorded; by its
        host where one node ran there)."""
        meta = self.metas.get(rank)
        if meta is None or not meta.present:
            return None
        nodes = self.node_records
        named = [n for n in nodes if meta.node and n.name == meta.node]
        on_host = [n for n in nodes if n.host == meta.host]
        return (named or (on_host if len(on_host) == 1 else [None]))[0]

    def last_step_note(self, node: NodeRecord) -> str:
        """`` (no end record) after step N, at HH:MM:SS``: how a lost node's ranks last were seen."""
        ranks = [r for r in self.ranks if self._node_of(r) == node]
        ends = [(int(s["step"]), int(s["end_ns"])) for r in ranks
                for s in self.steps(r).dropna(subset=["end_ns"]).tail(1).to_dict("records")]
        if not ends:
            return " (no end record; none of its ranks timed a step)"
        step, end = max(ends, key=lambda x: x[1])
        return f" (no end record) after step {step}, at {time.strftime('%H:%M:%S', time.localtime(end / 1e9))}"

    @cached_property
    def job_command(self) -> list[str]:
        """The job's command as every node ran it: the nodes' own commands where they agree, an
        argument that differs (``--node_rank=1``) shown as ``--node_rank=<per node>``; the
        manifest's where no node recorded one."""
        commands = [list(n.command) for n in self.node_records if n.command]
        if not commands:
            return list(self.manifest.get("command") or [])
        first = commands[0]
        if any(len(c) != len(first) for c in commands):
            return first
        out = []
        for i, arg in enumerate(first):
            if all(c[i] == arg for c in commands):
                out.append(arg)
            else:
                out.append(arg.split("=", 1)[0] + "=<per node>" if arg.startswith("-") and "=" in arg
                           else "<per node>")
        return out

    def node_dirs(self) -> list[Path]:
        """The directory of every recording process (node), sorted."""
        d = self.root / "nodes"
        return sorted(p.parent for p in d.glob(f"*/{NODE_FILE}")) if d.is_dir() else []

    def nodes(self) -> list[dict[str, Any]]:
        """The ``node.json`` of every recording process."""
        return [read_json(d / NODE_FILE) for d in self.node_dirs()]

    def _node_files(self, *names: str) -> list[tuple[str, list[Path]]]:
        """For each node holding every file of ``names``: its host and those files' paths."""
        out = []
        for d, node in zip(self.node_dirs(), self.nodes()):
            paths = [d / name for name in names]
            if all(p.is_file() and p.stat().st_size for p in paths):
                out.append((str(node.get("host", d.name)), paths))
        return out

    def gpu_samples(self) -> list[tuple[str, pd.DataFrame]]:
        """Each node's GPU samples (NVML, ``gpu-samples.csv``) with its host; nodes without any left out."""
        return self._node_samples(GPU_SAMPLES_FILE)

    def connection_samples(self) -> list[tuple[str, pd.DataFrame]]:
        """Each node's samples of the job's TCP connections (``ss``, ``connections.csv``) with its
        host; nodes without any left out. The time the receiver's window or the send buffer
        held a connection back (``rwnd_limited_ms``, ``sndbuf_limited_ms``) is 0 where ``ss``
        printed none, and in runs recorded before dpro sampled it."""
        return [(host, frame.assign(**{c: frame[c].fillna(0) if c in frame else 0 for c in CONNECTION_LIMITED_COLUMNS}))
                for host, frame in self._node_samples(CONNECTIONS_FILE)]

    def _node_samples(self, name: str) -> list[tuple[str, pd.DataFrame]]:
        import pandas as pd

        out = []
        for host, (path,) in self._node_files(name):
            try:
                frame = pd.read_csv(path)
            except (ValueError, pd.errors.ParserError) as e:
                raise RunFormatError(f"cannot read {path}: {e}") from None
            if len(frame):
                out.append((host, frame))
        return out

    def counter_snapshots(self) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
        """Each node's host counter snapshots taken at the job's start and end, with its host."""
        return [(host, read_json(start), read_json(end))
                for host, (start, end) in self._node_files(COUNTERS_START_FILE, COUNTERS_END_FILE)]

    def shapes_trace_path(self, rank: int) -> Path | None:
        """The rank's trace of one step with the ops' input shapes, when it was written."""
        return self._written(rank, SHAPES_TRACE_FILE)

    def probe_report(self, rank: int) -> dict[str, Any] | None:
        """The rank's ``probe.json`` (its probe steps, their micro-batch count and the job's), if
        written; an unreadable or malformed one raises :class:`RunFormatError`."""
        path = self.rank_dir(rank) / PROBE_FILE
        if not path.exists():
            return None
        report = read_json(path)
        try:
            return {"steps": [int(s) for s in report["steps"]], "microbatches": int(report["microbatches"]),
                    "recorded_microbatches": int(report["recorded_microbatches"]), "schedule": str(report["schedule"])}
        except (KeyError, TypeError, ValueError) as e:
            raise RunFormatError(f"{path} is not a probe report ({type(e).__name__}: {e})") from None

    def probe(self) -> tuple[ProbeRun | None, str]:
        """The pipeline's probe steps as a run of their own, where every rank with a trace
        wrote their trace and ``probe.json`` at one count; else None and why, in words."""
        traced = self.traced_ranks
        if not traced:
            return None, "no traces"
        try:
            reports = {r: self.probe_report(r) for r in traced}
        except RunFormatError as e:
            return None, str(e)
        missing = [r for r, p in reports.items() if p is None or self._written(r, PROBE_TRACE_FILE) is None]
        if len(missing) == len(traced):
            return None, "no probe steps (dpro record --probe, on a pipeline it can switch)"
        if missing:
            return None, f"{_rank_list(missing)} kept no probe steps"
        if len({(p["microbatches"], tuple(p["steps"])) for p in reports.values()}) != 1:
            return None, "the ranks' probe steps differ"
        return ProbeRun(self.root, self.manifest), ""

    def nccl_logs(self) -> list[Path]:
        """The NCCL log files the job wrote."""
        d = nccl_dir(self.root)
        return sorted(d.glob("*.log")) if d.is_dir() else []

    def analysis_inputs(self) -> list[Path]:
        """Every file the analysis of the traces reads (its caches are keyed by them)."""
        files = [self.root / MANIFEST]
        for rank in self.ranks:
            files += [self.rank_dir(rank) / name for name in (META_FILE, STEPS_FILE, CLOCK_FILE, self.trace_file,
                                                               CALIBRATION_FILE, self.collectives_file)]
        return [f for f in files + self.nccl_logs() if f.exists()]

    def derived_dir(self) -> Path:
        """Where the analysis keeps its caches: ``RUN/derived/``, or a folder of the user's cache
        (``~/.cache/dpro/runs/<hash of the run's path>/``) when the run cannot be written."""
        inside = self.root / DERIVED
        if may_write(inside):
            return inside
        return user_cache_dir() / "runs" / hashlib.sha1(str(self.root.resolve()).encode()).hexdigest()


@dataclass(frozen=True)
class ProbeRun(Run):
    """A pipeline run's probe steps read as a run of their own (:mod:`dpro.collectors.probe`):
    their trace and collective log, every rank's pipeline at the probe's micro-batch count, the
    probe steps the profiled ones (the window's are ``window``), their analysis cached apart."""

    trace_file: ClassVar[str] = PROBE_TRACE_FILE
    collectives_file: ClassVar[str] = PROBE_COLLECTIVES_FILE

    def shapes_trace_path(self, rank: int) -> Path | None:
        return None  # the shapes step ran at the job's count

    def rank_meta(self, rank: int) -> RankMeta:
        meta = super().rank_meta(rank)
        probe = self.probe_report(rank)
        if probe is None:
            return meta
        pipeline = tuple({**p, "microbatches": int(probe["microbatches"])}
                         if (p.get("schedule"), p.get("microbatches")) == (probe["schedule"], probe["recorded_microbatches"])
                         else p for p in meta.parallel.pipeline)
        return replace(meta, parallel=replace(meta.parallel, pipeline=pipeline))

    def steps(self, rank: int) -> pd.DataFrame:
        df = super().steps(rank)
        probed = set((self.probe_report(rank) or {}).get("steps") or ())
        phase = df["phase"].where(df["phase"] != "profiled", "window")
        df["phase"] = phase.where(~df["step"].isin(probed), "profiled")
        return df

    def analysis_inputs(self) -> list[Path]:
        return super().analysis_inputs() + list(filter(None, (self._written(r, PROBE_FILE) for r in self.ranks)))

    def derived_dir(self) -> Path:
        return super().derived_dir() / "probe"


def _rank_list(ranks: list[int]) -> str:
    """``rank 1``, ``ranks 1, 3``, ``ranks 0-5, 7`` (``ranks`` sorted)."""
    spans: list[list[int]] = []
    for r in ranks:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` looks like a run directory (has a manifest)."""
    return (path / MANIFEST).is_file()


def open_run(path: str | os.PathLike) -> Run:
    """Open a run directory, checking that this version of dpro can read it."""
    root = Path(path)
    if not root.is_dir():
        raise RunFormatError(f"{root} is not a directory")
    if not is_run_dir(root):
        raise RunFormatError(f"{root} is not a dpro run directory (no {MANIFEST})")
    manifest = read_json(root / MANIFEST)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise RunFormatError(f"{root / MANIFEST} is not a dpro run manifest")
    version = str(manifest.get("format_version", ""))
    try:
        major = format_major(version)
    except ValueError:
        raise RunFormatError(f"{root} has an invalid run format version {version!r}") from None
    if major != format_major(FORMAT_VERSION):
        raise RunFormatError(
            f"{root} uses run format {version}; this dpro reads {format_major(FORMAT_VERSION)}.x "
            f"(use a dpro release that matches)")
    return Run(root, manifest)
