"""The docs site builds with MkDocs in strict mode (every link, anchor and API reference
resolves), its results page is generated from the benchmarks' JSON, and a broken link fails it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from .conftest import ROOT

MKDOCS = Path(sys.executable).parent / "mkdocs"


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([MKDOCS, "build", "--strict", "-f", config, "-d", site], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_docs_build_strict_with_the_results_from_the_benchmarks_json(tmp_path: Path) -> None:
    result = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr[-4000:]
    results = (tmp_path / "site" / "results" / "index.html").read_text()
    newest = sorted((ROOT / "docs" / "results").glob("*/probe-schedule.json"))[-1]
    rows = json.loads(newest.read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert all(r["case"] in results for r in rows), "every row of a results file is on the page"
    assert "RunAnalysis" in (tmp_path / "site" / "api" / "index.html").read_text()
    assert (tmp_path / "site" / "changelog" / "index.html").exists()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    (docs / "record.md").write_text((docs / "record.md").read_text() + "\nSee [the missing page](missing.md).\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text((ROOT / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}")
                      .replace("- tools/docs_hooks.py", f"- {ROOT / 'tools' / 'docs_hooks.py'}")
                      .replace("paths: [build/source-view]", f"paths: [{ROOT / 'build' / 'source-view'}]"))
    result = build(config, tmp_path / "site")
    assert result.returncode != 0 and "missing.md" in result.stderr, result.stderr[-4000:]


def test_the_architecture_page_names_every_layer_and_package() -> None:
    """docs/architecture.md checked against the code: every layer of the import-linter contract
    is in its picture, every package of the distribution in its folder table."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    picture = page.split("```")[1]
    layers = next(c for c in project["tool"]["importlinter"]["contracts"] if c["type"] == "layers")["layers"]
    missing = [m for layer in layers for m in layer.split(" | ") if m not in picture]
    assert not missing, f"layers missing from the picture: {missing}"
    table = page.split("## The folders", 1)[1]
    folders = project["tool"]["setuptools"]["package-dir"]
    for package in project["tool"]["setuptools"]["packages"]:
        top = ".".join(package.split(".")[:2])
        folder = folders.get(top, top.replace(".", "/"))
        inner = package[len(top):].lstrip(".").split(".")[0]
        assert f"`{folder}/`" in table or f"`{top}`" in table, f"{package}: no row for {folder}/"
        if inner:
            assert f"{inner}/" in table or f"`{inner}`" in table, f"{package}: {inner} not named in its row"
