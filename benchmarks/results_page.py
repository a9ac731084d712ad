"""The docs' results page, generated from the benchmarks' own JSON in ``docs/results/<date>/``
(never typed by hand): each file's rows as a table, with the date, commit and machine it was
measured on. ``tools/docs_hooks.py`` renders it when MkDocs builds the site;
``python -m benchmarks.results_page`` prints it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.provenance import git

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
COLUMNS = ("benchmark", "case", "metric", "dpro", "baseline", "ratio", "goal", "met")


def render(results: Path = RESULTS) -> str:
    """The page: every results file, newest date first, its rows as a Markdown table."""
    lines = ["# Results", "",
             "Every figure below is read from a benchmark's `--json` output kept under `docs/results/<date>/` "
             "(the `.txt` beside each file is its printed table). Each file says where it was measured: its date, "
             "the commit, and the machine where the file records one. A figure that missed its goal says `NO`. "
             "Newer files replace older ones as the current figures; the older ones stay, with the changes "
             "between them in the [changelog](changelog.md).", ""]
    for day in sorted((d for d in results.iterdir() if d.is_dir()), reverse=True):
        lines += [f"## {day.name}", ""]
        for path in sorted(day.glob("*.json")):
            lines += _file_section(path, results)
    return "\n".join(lines) + "\n"


def _file_section(path: Path, results: Path) -> list[str]:
    data = json.loads(path.read_text())
    rows = data if isinstance(data, list) else data.get("rows") or []
    rows = [r for r in rows if isinstance(r, dict) and set(COLUMNS) <= r.keys()]
    if not rows:
        return []
    where = data.get("provenance", {}) if isinstance(data, dict) else {}
    result = data.get("result", {}) if isinstance(data, dict) else {}
    commit = where.get("commit") or result.get("commit") or _added_in(path)
    machine = where.get("machine")
    said = [f"file `{path.relative_to(results.parent.parent)}`", f"commit `{commit or 'unknown'}`"
            + (" with uncommitted changes" if where.get("uncommitted") or result.get("uncommitted") else ""),
            f"measured {where['date']}" if where.get("date") else f"dated {path.parent.name} (by its folder)",
            _machine(machine) if machine else "machine not recorded in the file"]
    if result.get("seed") is not None:
        said.append(f"seed {result['seed']}" + (f" ({result['label']})" if result.get("label") else ""))
    missed = sum(not r["met"] for r in rows)
    table = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    table += ["| " + " | ".join(_cell(r[c]) for c in COLUMNS) + " |" for r in rows]
    return [f"### {path.stem}", "", "; ".join(said) + f". {len(rows) - missed} of {len(rows)} goals met.", "",
            *table, ""]


def _machine(m: dict[str, Any]) -> str:
    gpus = ", ".join(m.get("gpus") or []) or "no GPU"
    return f"machine: {m.get('cores')} cores ({m.get('cpu') or 'CPU'}), {m.get('memory_gib')} GiB, {gpus}"


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "**NO**"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def _added_in(path: Path) -> str:
    """The commit that added ``path`` (its results were committed with the code they measured)."""
    commits = git("log", "--diff-filter=A", "--format=%h", "--", str(path)).split()
    return commits[-1] if commits else ""


if __name__ == "__main__":
    print(render(), end="")
