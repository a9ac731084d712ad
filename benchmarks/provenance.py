"""Where a benchmark's figures were measured: date, commit and machine, written beside its rows
(``python -m benchmarks --json``) so that the docs' results page can say so."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def provenance() -> dict[str, Any]:
    """``date`` (UTC), ``commit`` (with ``uncommitted`` changes or not) and ``machine``: cores,
    memory, CPU model and, where ``nvidia-smi`` answers, the GPUs."""
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": git("rev-parse", "--short", "HEAD"),
            "uncommitted": bool(git("status", "--porcelain", "--untracked-files=no")), "machine": machine()}


def machine() -> dict[str, Any]:
    """This machine as the results page names it."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    try:
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.split("\n")
    except (OSError, subprocess.TimeoutExpired):
        gpus = []
    return {"cores": os.cpu_count(), "memory_gib": round(memory, 1), "cpu": model,
            "gpus": [g.strip() for g in gpus if g.strip()]}


def git(*args: str) -> str:
    """``git ARGS`` in the repository, its output stripped; "" where git is missing or fails."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""
