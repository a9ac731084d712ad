"""The frozen model: which code the fidelity benchmark's scoring seed may score.

``frozen.json`` beside this file names the model's code (a hash of the source of everything a
prediction runs through, the benchmark's harness included, :func:`model_version`), the commit it was frozen at and the scoring
seed drawn for it. A scoring run whose model is not that code is not held out: it says so
instead of calling itself held out. Freezing again (after a change) needs a scoring seed never
used before; every seed used stays listed.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FROZEN_FILE", "Frozen", "check", "freeze", "model_version"]

FROZEN_FILE = Path(__file__).with_name("frozen.json")
ROOT = Path(__file__).resolve().parents[2]
# Everything a scored prediction runs through: the recording (collectors, dpro record, the
# namespace hosts), the graph, the replayer, the what-if, the optimizer (its intervals
# included), and the benchmarks' own harnesses (the jobs they draw, how they measure and score
# them). A change to any of them is a new model.
MODEL_SOURCES = ("collectors", "graph", "replayer", "dpro/analysis/run.py", "dpro/analysis/fanout.py",
                 "dpro/analysis/cpu_ops.py", "dpro/analysis/fusion.py", "dpro/analysis/whatif.py",
                 "dpro/run_format.py", "dpro/stats.py", "dpro/cli/record.py", "tools/testing/netns.py",
                 "benchmarks/fidelity.py", "benchmarks/testbed",
                 # and what dpro optimize adds on top: the search, its intervals, its trials, its harness
                 "optimizer", "optimizer/intervals.json", "dpro/cli/optimize.py", "benchmarks/optimize.py",
                 "examples/train_lm.py",
                 # and the parallel forms: their description, their benchmark
                 "dpro/analysis/parallelism.py", "dpro/analysis/stages.py", "dpro/analysis/memory.py",
                 "dpro/analysis/fsdp.py", "dpro/analysis/tensor_parallel.py", "dpro/analysis/mesh_groups.py",
                 "examples/train_parallel.py", "benchmarks/parallel.py")


def model_version(root: Path = ROOT) -> str:
    """A hash of the model's source: every ``.py`` file under :data:`MODEL_SOURCES` in ``root``
    (by path, not by import as :func:`dpro.code_hash.code_hash` does, so that a copy of the
    tree can be checked)."""
    import hashlib

    digest = hashlib.sha1()
    for source in MODEL_SOURCES:
        path = root / source
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(str(file.relative_to(root)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Frozen:
    """What a scoring run may call itself."""

    held_out: bool
    seed: int | None
    commit: str | None
    why: str  # one line, printed with the results


def check(path: Path = FROZEN_FILE, root: Path = ROOT) -> Frozen:
    """Whether the model in ``root`` is the one frozen in ``path``."""
    if not path.exists():
        return Frozen(False, None, None, f"no frozen model ({path.name} is missing): not held out")
    frozen = json.loads(path.read_text())
    now = model_version(root)
    if now != frozen["model"]:
        return Frozen(False, frozen["scoring_seed"], frozen["commit"],
                      f"NOT held out: the model changed after it was frozen at commit {frozen['commit'][:12]} "
                      f"(model {frozen['model']}, now {now}); freeze it again with a fresh scoring seed")
    return Frozen(True, frozen["scoring_seed"], frozen["commit"],
                  f"held out: the model frozen at commit {frozen['commit'][:12]} (model {now}) before scoring seed "
                  f"{frozen['scoring_seed']} first ran")


def freeze(seed: int | None = None, path: Path = FROZEN_FILE, root: Path = ROOT) -> Frozen:
    """Freeze the model as committed now with the scoring seed ``seed`` (never used before;
    default: drawn now); refused while the model's source has uncommitted changes."""
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *MODEL_SOURCES], cwd=root, capture_output=True,
                           text=True, check=True).stdout.strip()
    if dirty:
        raise SystemExit(f"commit the model first; uncommitted: {' '.join(dirty.split())}")
    old = json.loads(path.read_text()) if path.exists() else {}
    used = old.get("used_seeds", [])
    if seed is None:
        seed = next(s for s in iter(lambda: 1000 + secrets.randbelow(9000), None) if s not in used)
    if seed in used:
        raise SystemExit(f"scoring seed {seed} was used before ({used}): draw a fresh one")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                            check=True).stdout.strip()
    path.write_text(json.dumps({"model": model_version(root), "commit": commit, "scoring_seed": seed,
                                "used_seeds": [*used, seed]}, indent=1) + "\n")
    return check(path, root)
