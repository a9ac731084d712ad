"""The tables of a trace saved as Parquet (categoricals as codes) and read back."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd

from dpro.graph.kineto.schema import TraceTables
from dpro.graph.kineto.strings import categorical, make_frame
from dpro.graph.kineto.tables import groups_frame
from dpro.run_format import may_write, user_cache_dir, write_atomically


_PARQUET_TABLES = ("events", "flows")  # categoricals as codes; their categories, steps, groups and meta in meta.json


def default_folders(path: Path) -> list[Path]:
    """Where a trace outside a run is cached: ``<trace>.dpro/`` beside it, else the user's cache."""
    return [path.parent / f"{path.name}.dpro", user_cache_dir() / "traces" / hashlib.sha1(str(path).encode()).hexdigest()]


def read_cache(path: Path, key: dict, folders: list[Path]) -> TraceTables | None:
    """The tables cached in the first of ``folders`` whose key matches, else None."""
    for folder in folders:
        try:
            saved = json.loads((folder / "meta.json").read_bytes())
            if saved["key"] != key:
                continue
            events, flows = (_read_parquet(folder / f"{name}.parquet", saved["categories"][name])
                             for name in _PARQUET_TABLES)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        steps = np.array(saved["steps"], np.int64).reshape(-1, 3).T
        steps = make_frame(dict(zip(("step", "start_ns", "end_ns"), steps, strict=True)))
        return TraceTables(events, flows, steps, groups_frame(saved["process_groups"]),
                           {**saved["meta"], "source": str(path)})
    return None


def _read_parquet(file: Path, categories: dict[str, list[str]]) -> pd.DataFrame:
    return make_frame({name: categorical(column.to_numpy(), categories[name]) if name in categories else column.to_numpy()
                   for name, column in pd.read_parquet(file).items()})


def write_cache(path: Path, key: dict, tables: TraceTables, folders: list[Path]) -> None:
    """Save the tables in the first of ``folders`` that can be written (none: nothing saved)."""
    parquet, categories = {}, {}
    for name in _PARQUET_TABLES:
        frame = getattr(tables, name)
        categories[name] = {c: list(frame[c].cat.categories)
                            for c in frame if isinstance(frame[c].dtype, pd.CategoricalDtype)}
        parquet[name] = frame.assign(**{c: frame[c].cat.codes for c in categories[name]})
    saved = json.dumps({
        "key": key, "meta": tables.meta, "categories": categories, "steps": tables.steps.to_numpy().tolist(),
        "process_groups": {name: column.tolist() for name, column in tables.process_groups.items()},
    }).encode()
    for folder in folders:
        if not may_write(folder):
            continue
        try:
            for name, frame in parquet.items():
                write_atomically(folder / f"{name}.parquet", frame.to_parquet)
            write_atomically(folder / "meta.json", lambda file: file.write_bytes(saved))
            return
        except OSError:
            continue

