"""Derived tables saved as versioned Parquet and read back: the run model's cache.

An *entry* of a folder (``RUN/derived/analysis-<options>/``, see ``docs/run-format.md``) is a
key file and its tables::

    <entry>.json              the key the entry was built for, the store's format version,
                              the names of its tables and small JSON facts (``info``)
    <entry>.<table>.parquet   one file per table

An entry is read back only when its key equals the one asked for: the store's
:data:`FORMAT_VERSION`, the code that builds it (:func:`dpro.code_hash.code_hash`), the
options, and the size and modification time of every input (:func:`file_stamps`). The key
file is removed first and written last, so an entry whose writing was cut short is rebuilt.
A :class:`~dpro.graph.dataflow.DataflowGraph` is stored by :func:`save_graph` as the entry
``graph`` (tables ``nodes``, ``edges``, ``wraps``, ``collectives`` and any others given).

    >>> save_graph(folder, key, graph, {"instances": frame})             # doctest: +SKIP
    >>> graph, tables = load_graph(folder, key)                          # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from dpro.graph.dataflow import DataflowGraph, text_as_categories
from dpro.run_format import write_atomically

__all__ = ["FORMAT_VERSION", "file_stamps", "load", "load_graph", "save", "save_graph"]

FORMAT_VERSION = 1
"""Version of the stored layout; an entry written by another version is rebuilt."""
_GRAPH = "graph"
_LIST_COLUMNS = ("ranks", "wait_ns", "sends", "done")  # of the collectives table


def file_stamps(root: Path, files: list[Path]) -> list[list[Any]]:
    """``[relative path, size, mtime_ns]`` of each file: what a key says of its inputs."""
    return [[str(f.relative_to(root)), (st := f.stat()).st_size, st.st_mtime_ns] for f in files]


def save(folder: Path, entry: str, key: dict[str, Any], tables: dict[str, pd.DataFrame], info: dict[str, Any]) -> None:
    """Write ``tables`` and JSON-ready ``info`` as ``entry`` of ``folder``, under ``key``."""
    key_file = folder / f"{entry}.json"
    key_file.unlink(missing_ok=True)
    for name, frame in tables.items():
        write_atomically(folder / f"{entry}.{name}.parquet", lambda tmp, f=frame: f.to_parquet(tmp, index=False))
    text = json.dumps({"format_version": FORMAT_VERSION, "key": key, "tables": sorted(tables), "info": info}, indent=1)
    write_atomically(key_file, lambda tmp: tmp.write_text(text))


def load(folder: Path, entry: str, key: dict[str, Any]) -> tuple[dict[str, pd.DataFrame], dict[str, Any]] | None:
    """The tables and info of ``entry`` when it was stored under ``key``; None when absent or stale."""
    try:
        saved = json.loads((folder / f"{entry}.json").read_text())
        if saved.get("format_version") != FORMAT_VERSION or saved.get("key") != _plain(key):
            return None
        tables = {name: pd.read_parquet(folder / f"{entry}.{name}.parquet") for name in saved["tables"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return tables, saved["info"]


def save_graph(folder: Path, key: dict[str, Any], graph: DataflowGraph, tables: dict[str, pd.DataFrame]) -> None:
    """Store ``graph`` with further ``tables`` as the entry ``graph``."""
    save(folder, _GRAPH, key, {"nodes": graph.nodes, "edges": graph.edges, "wraps": graph.wraps,
                               "collectives": graph.collectives, **tables},
         {"step_ns": _by_rank(graph.step_ns), "start_ns": _by_rank(graph.start_ns), "steps": graph.steps,
          "clock_offsets_ns": _by_rank(graph.clock_offsets_ns), "hosts": _by_rank(graph.hosts)})


def load_graph(folder: Path, key: dict[str, Any]) -> tuple[DataflowGraph, dict[str, pd.DataFrame]] | None:
    """The graph and further tables stored by :func:`save_graph` under ``key``, or None."""
    found = load(folder, _GRAPH, key)
    if found is None:
        return None
    tables, g = found
    collectives = tables.pop("collectives")
    for column in _LIST_COLUMNS:
        if column in collectives:
            collectives[column] = collectives[column].map(lambda values: values.tolist())
    nodes, edges = (text_as_categories(tables.pop(name)) for name in ("nodes", "edges"))
    graph = DataflowGraph(nodes, edges, step_ns=_ranks(g["step_ns"], float),
                          start_ns=_ranks(g["start_ns"], float), steps=list(g["steps"]), collectives=collectives,
                          clock_offsets_ns=_ranks(g["clock_offsets_ns"], int), hosts=_ranks(g["hosts"], str),
                          wraps=tables.pop("wraps"))
    return graph, tables


def _by_rank(values: dict[int, Any]) -> dict[str, Any]:
    return {str(r): v for r, v in values.items()}


def _ranks(values: dict[str, Any], kind: type) -> dict[int, Any]:
    return {int(r): kind(v) for r, v in values.items()}


def _plain(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(value))
