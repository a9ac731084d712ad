"""The run directory: its layout, its manifest and its reader.

This module alone knows where things live in a run directory (see ``docs/run-format.md``)::

    RUN/
      run.json                      manifest: format name and version, command, options
      nodes/<host>-<pid>/node.json  one per ``dpro record`` process: host, times, exit status,
                                    what each node-level collector did
      nodes/<host>-<pid>/nic-start.json, nic-end.json, gpu-samples.csv
      ranks/<rank>/meta.json        per-rank metadata (host, groups, versions, devices, DDP buckets)
      ranks/<rank>/steps.csv        wall time of every step: step,start_ns,end_ns,phase
      ranks/<rank>/clock.json       offset of this rank's clock against rank 0
      ranks/<rank>/trace.json.gz    torch.profiler (Kineto) trace of the profiled steps
      ranks/<rank>/errors.log       failures of dpro's hooks in this rank (the job went on)
      nccl/<host>.<pid>.log         NCCL_DEBUG=INFO output, when NCCL is used

Writers create files atomically (write to a temporary name, then rename) so that a reader never
sees half a JSON file, even when the job is killed.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from .errors import DproError

FORMAT_NAME = "dpro-run"
FORMAT_VERSION = "1.0"
MANIFEST = "run.json"
STEPS_COLUMNS = ("step", "start_ns", "end_ns", "phase")


class RunFormatError(DproError, ValueError):
    """A path that is not a run directory this version of dpro can read."""


def format_major(version: str) -> int:
    """The major number of a ``MAJOR.MINOR`` format version."""
    return int(str(version).split(".", 1)[0])


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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


@dataclass(frozen=True)
class Run:
    """A run directory opened for reading."""

    root: Path
    manifest: dict[str, Any]

    @property
    def ranks(self) -> list[int]:
        """Ranks that wrote something, in ascending order."""
        d = self.root / "ranks"
        if not d.is_dir():
            return []
        return sorted(int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit())

    def rank_dir(self, rank: int) -> Path:
        return self.root / "ranks" / str(rank)

    def rank_meta(self, rank: int) -> dict[str, Any]:
        """The rank's ``meta.json``, or ``{}`` when the rank wrote none."""
        path = self.rank_dir(rank) / "meta.json"
        return read_json(path) if path.exists() else {}

    def trace_path(self, rank: int) -> Path | None:
        """The rank's Kineto trace, when it was written."""
        path = self.rank_dir(rank) / "trace.json.gz"
        return path if path.exists() else None

    def steps(self, rank: int) -> pd.DataFrame:
        """Every step the rank timed: ``step`` (int64), ``start_ns``, ``end_ns`` (Int64, epoch ns;
        ``start_ns`` is missing for step 0, which begins somewhere in the script's setup),
        ``dur_ns`` (Int64) and ``phase`` ("", "warmup" or "profiled")."""
        path = self.rank_dir(rank) / "steps.csv"
        if not path.exists():
            return _empty_steps()
        try:
            df = pd.read_csv(path, dtype={"step": "int64", "start_ns": "Int64",
                                          "end_ns": "Int64", "phase": "string"},
                             keep_default_na=False, na_values={"start_ns": [""]})
        except (ValueError, pd.errors.ParserError) as e:
            raise RunFormatError(f"cannot read {path}: {e}") from None
        df["phase"] = df["phase"].fillna("")
        df["dur_ns"] = df["end_ns"] - df["start_ns"]
        return df[["step", "start_ns", "end_ns", "dur_ns", "phase"]]

    def nodes(self) -> list[dict[str, Any]]:
        """The ``node.json`` of every recording process."""
        d = self.root / "nodes"
        if not d.is_dir():
            return []
        return [read_json(p) for p in sorted(d.glob("*/node.json"))]


def _empty_steps() -> pd.DataFrame:
    return pd.DataFrame({"step": pd.Series(dtype="int64"), "start_ns": pd.Series(dtype="Int64"),
                         "end_ns": pd.Series(dtype="Int64"), "dur_ns": pd.Series(dtype="Int64"),
                         "phase": pd.Series(dtype="string")})


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
