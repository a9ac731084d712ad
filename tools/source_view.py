"""dpro's source laid out as an install lays it out: ``dpro/graph/...`` for the top-level
``graph/`` folder, and so on (``[tool.setuptools] package-dir``). Tools that find modules by
walking one package folder (``lint-imports``, the API docs' collector) read this view."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def installed_view(into: Path) -> Path:
    """``into/dpro/...``: every source file of the package, linked where an install puts it."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(mapping.items()):
        target = into.joinpath(*package.split("."))
        for source in (ROOT / folder).rglob("*.py"):
            link = target / source.relative_to(ROOT / folder)
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                link.symlink_to(source)
    return into
