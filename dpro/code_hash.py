"""The code a stored result was made by: a hash of the source of some modules and of every dpro
module they import, found by reading their import statements (at any depth of the module, so a
function's lazy import counts too). A change to any file that feeds a stored analysis or a
trace cache changes its key; nobody lists those files or bumps a version by hand.

    >>> code_hash("dpro.analysis.run")   # doctest: +SKIP
    '3f0c9a4d2b17e8c1'
"""

from __future__ import annotations

import ast
import hashlib
import sys
from collections.abc import Iterator
from functools import lru_cache
from importlib.machinery import ModuleSpec
from pathlib import Path

__all__ = ["code_hash", "feeding_modules"]

PACKAGE = "dpro"
NOT_CODE = frozenset({"dpro._version"})  # written at install from the git tags: no behaviour in it


@lru_cache(maxsize=None)
def code_hash(*roots: str) -> str:
    """A hash of the source files of ``roots`` (dotted module names) and of every dpro module
    they import, transitively (:func:`feeding_modules`); computed once per process."""
    digest = hashlib.sha1()
    for name, path in sorted(feeding_modules(*roots).items()):
        digest.update(name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def feeding_modules(*roots: str) -> dict[str, Path]:
    """``roots`` and every dpro module their import statements reach, with the packages above
    each (their ``__init__`` runs first): module name -> source file."""
    found: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in found or name in NOT_CODE or not (name == PACKAGE or name.startswith(PACKAGE + ".")):
            continue
        path = _source(name)
        if path is None:  # ``from dpro.x import some_function``: not a module
            continue
        found[name] = path
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += _imports(name, path)
    return found


def _source(name: str) -> Path | None:
    spec = _spec(name)
    origin = spec.origin if spec is not None else None
    return Path(origin) if origin and origin.endswith(".py") else None


@lru_cache(maxsize=None)
def _spec(name: str) -> ModuleSpec | None:
    """Where module ``name`` is, found as the import system finds it but without running any
    package's ``__init__`` (importlib's own ``find_spec`` imports the parents: numba and all)."""
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__spec__", None) is not None:
        return module.__spec__
    parent, _, _ = name.rpartition(".")
    locations = None
    if parent:
        above = _spec(parent)
        if above is None or above.submodule_search_locations is None:
            return None
        locations = list(above.submodule_search_locations)
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(name, locations) if find is not None else None
        if spec is not None:
            return spec
    return None


def _imports(name: str, path: Path) -> list[str]:
    """Every module name ``path``'s import statements name (``from a import b`` names ``a`` and
    ``a.b``, which may be a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in _statements(ast.parse(path.read_bytes(), str(path)).body):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return out


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of ``body`` and of the blocks in it (functions, classes, ifs, trys...),
    never their expressions: where imports are, at a fraction of ``ast.walk``'s cost."""
    for node in body:
        yield node
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, block, None)
            if isinstance(inner, list):
                yield from _statements(inner)
