"""The package as users get it: a wheel built from this tree installs into a fresh virtual
environment and runs there (``dpro demo``, the README's first command, included), with its
package data (the recording bootstrap, the health history's migrations, the optimizer's
intervals) and a version from the git tags. The dependencies are this test environment's,
checked by pip against what the wheel declares (installing torch again would take the suite
half a minute more)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from dpro.run_format import open_run

from .conftest import ROOT


def run(*args: str | Path, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_the_wheel_installs_in_a_fresh_environment_and_runs_the_demo(tmp_path: Path) -> None:
    built = run(sys.executable, "-m", "build", "--wheel", "-o", tmp_path / "dist", ROOT, cwd=tmp_path)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheel, = (tmp_path / "dist").glob("*.whl")
    name = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    assert wheel.name.startswith(name.replace("-", "_") + "-")
    venv = tmp_path / "venv"
    assert run(sys.executable, "-m", "venv", venv, cwd=tmp_path).returncode == 0
    # the dependencies: this test environment's (torch alone is 1.7 GB to copy again); the wheel
    # goes in without them, and pip checks that they satisfy what the wheel declares
    here = run(sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path)
    there = run(venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path)
    (Path(there.stdout.strip()) / "dependencies.pth").write_text(here.stdout.strip() + "\n")
    run(venv / "bin" / "pip", "uninstall", "-q", "-y", "setuptools", cwd=tmp_path)  # the venv's own, older: torch's is there
    installed = run(venv / "bin" / "pip", "install", "-q", "--no-deps", wheel, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr[-3000:]
    checked = run(venv / "bin" / "pip", "check", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout
    version = run(venv / "bin" / "dpro", "--version", cwd=tmp_path)
    built_as = wheel.name.split("-")[1]
    assert version.returncode == 0 and version.stdout.split()[-1] == built_as, (version, wheel.name)
    tag = run("git", "describe", "--tags", "--abbrev=0", cwd=ROOT).stdout.strip().lstrip("v")
    if tag:  # the version counts from the last tag (a clone without tags gets setuptools-scm's 0.1.devN)
        assert built_as == tag or built_as.startswith(tag.rsplit(".", 1)[0] + "."), (built_as, tag)
    where = run(venv / "bin" / "python", "-c", "import dpro, dpro.graph; print(dpro.__file__, dpro.graph.__file__)",
                cwd=tmp_path).stdout
    assert all(str(venv) in path for path in where.split()), where  # the wheel's code, not this tree's
    demo_dir = tmp_path / "demo"  # the README's first command, from the installed wheel
    demo = run(venv / "bin" / "dpro", "demo", "-o", demo_dir, "--train-steps", "14", "--skip", "3",
               "--warmup", "1", "--steps", "2", cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "Recorded 2 ranks" in demo.stdout and f"$ dpro info {demo_dir}" in demo.stdout
    recorded = open_run(demo_dir)
    assert recorded.ranks == [0, 1] and all(recorded.trace_path(r) for r in recorded.ranks)
    info = json.loads(run(venv / "bin" / "dpro", "info", demo_dir, "--json", cwd=tmp_path).stdout)
    assert [r["steps"] for r in info["per_rank"]] == [14, 14] and all(r["events"] for r in info["per_rank"])
    history = run(venv / "bin" / "dpro", "health", "history", "--db", f"sqlite:///{tmp_path / 'h.db'}", cwd=tmp_path)
    assert history.returncode == 0, history.stderr  # the migrations are in the wheel
