"""MkDocs hooks (``mkdocs.yml`` ``hooks:``): the API pages' source view and the pages generated
when the site is built.

- ``build/source-view/``: the package as installed (:mod:`tools.source_view`), where the API
  pages' collector finds ``dpro.graph`` and the other top-level folders;
- ``results.md``: the benchmarks' figures, from their JSON (:mod:`benchmarks.results_page`);
- ``changelog.md``: the repository's ``CHANGELOG.md``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results_page import render  # noqa: E402  (the repository root is on the path only now)
from tools.source_view import installed_view  # noqa: E402

SOURCE_VIEW = ROOT / "build" / "source-view"  # mkdocs.yml's mkdocstrings paths


def on_startup(command: str, dirty: bool) -> None:
    """Lay out the source view before the API pages' collector starts (it reads its paths then)."""
    shutil.rmtree(SOURCE_VIEW, ignore_errors=True)
    installed_view(SOURCE_VIEW)


def on_files(files: Files, config) -> Files:
    files.append(File.generated(config, "results.md", content=render()))
    files.append(File.generated(config, "changelog.md", content=(ROOT / "CHANGELOG.md").read_text()))
    return files
