"""The import-linter contracts in pyproject.toml hold, and they catch an import that breaks them.

``lint-imports`` finds modules by walking one package folder, but dpro's subpackages live in
top-level folders mapped by ``[tool.setuptools] package-dir``; the test checks the view an
installed package has (:func:`tools.source_view.installed_view`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tools.source_view import installed_view

from .conftest import ROOT

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint(view: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{view}{os.pathsep}{ROOT}"}  # ROOT: the contract type tools.contracts
    return subprocess.run([LINT_IMPORTS, "--config", ROOT / "pyproject.toml"], cwd=view, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_layers_hold(tmp_path: Path) -> None:
    result = lint(installed_view(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_module_below_the_cli_that_names_a_run_file_breaks_them(tmp_path: Path) -> None:
    view = installed_view(tmp_path)
    (view / "dpro" / "anomaly" / "peek.py").write_text("from dpro.run_format import Run, STEPS_FILE, read_json\n")
    result = lint(view)
    assert result.returncode != 0, result.stdout
    assert "dpro.anomaly.peek imports STEPS_FILE" in result.stdout and "dpro.anomaly.peek imports read_json" in result.stdout
    assert "imports Run " not in result.stdout


def test_an_upward_import_breaks_them(tmp_path: Path) -> None:
    view = installed_view(tmp_path)
    (view / "dpro" / "graph" / "upward.py").write_text("import dpro.anomaly.diagnose\n")
    result = lint(view)
    assert result.returncode != 0 and "dpro.graph.upward -> dpro.anomaly.diagnose" in result.stdout, result.stdout
