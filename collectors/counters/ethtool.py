"""NIC statistics from ``ethtool -S``: parsed from its text, run live or read from a recorded file.

The format is a header line (``NIC statistics:``) then one ``     name: value`` line per counter;
names may hold dots (``rx_bytes.nic``) and the value is a decimal integer. Lines that are not
``name: integer`` (headers, group titles) are skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

_LINE = re.compile(r"^\s*(\S.*?):\s+(\d+)\s*$")


def parse_ethtool_stats(text: str) -> dict[str, int]:
    """``{counter: value}`` from ``ethtool -S`` output; a repeated name keeps its first value."""
    stats: dict[str, int] = {}
    for line in text.splitlines():
        if m := _LINE.match(line):
            stats.setdefault(m.group(1), int(m.group(2)))
    return stats


def run_ethtool_stats(interface: str, timeout_s: float = 10.0) -> tuple[dict[str, int], str | None]:
    """Run ``ethtool -S interface``: its counters, and a note when there are none (and why)."""
    exe = shutil.which("ethtool")
    if exe is None:
        return {}, f"ethtool -S {interface}: ethtool is not installed"
    try:
        proc = subprocess.run([exe, "-S", interface], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {}, f"ethtool -S {interface}: no answer within {timeout_s:g} s"
    if proc.returncode != 0:
        why = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        return {}, f"ethtool -S {interface}: {why[-1] if why else f'exit code {proc.returncode}'}"
    return _with_note(parse_ethtool_stats(proc.stdout), f"ethtool -S {interface}")


def read_ethtool_file(path: str | os.PathLike) -> tuple[dict[str, int], str | None]:
    """The counters of a recorded ``ethtool -S`` output file, and a note when there are none."""
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError as e:
        return {}, f"recorded ethtool output {path}: {e.strerror or e}"
    return _with_note(parse_ethtool_stats(text), f"recorded ethtool output {path}")


def _with_note(stats: dict[str, int], what: str) -> tuple[dict[str, int], str | None]:
    return stats, None if stats else f"{what}: no 'name: value' counter lines"
