"""Merge run directories recorded on separate nodes (local paths) into one run."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from dpro.run_format import RunFormatError, open_run, write_json_atomic


def merge_runs(sources: list[Path], output: Path) -> dict[str, Any]:
    """Copy the ranks, nodes and NCCL logs of ``sources`` into a new run at ``output``.

    Refuses a non-empty ``output`` and a rank that two sources both recorded, before copying
    anything. Returns ``{"ranks": [...], "sources": [...]}``.
    """
    runs = [open_run(s) for s in sources]
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise RunFormatError(f"{output} exists and is not empty; merge into a new directory")
    owner: dict[int, Path] = {}
    for run in runs:
        for rank in run.ranks:
            if rank in owner:
                raise RunFormatError(f"rank {rank} is in both {owner[rank]} and {run.root}")
            owner[rank] = run.root
    versions = {r.manifest["format_version"] for r in runs}
    if len(versions) > 1:
        raise RunFormatError(f"the runs have different format versions: {', '.join(sorted(versions))}")
    output.mkdir(parents=True, exist_ok=True)
    for run in runs:
        for part in ("ranks", "nodes", "nccl"):
            if (run.root / part).is_dir():
                shutil.copytree(run.root / part, output / part, dirs_exist_ok=True)
    manifest = dict(runs[0].manifest, merged_from=[str(r.root.resolve()) for r in runs])
    write_json_atomic(output / "run.json", manifest)
    return {"ranks": sorted(owner), "sources": [str(s) for s in sources]}
