"""Load one rank's PyTorch profiler (Kineto) Chrome trace into columnar tables.

    >>> from dpro.graph.kineto import load_trace
    >>> tables = load_trace("traces/rank0.json.gz")
    >>> tables.events.groupby("cat", observed=True)["dur_ns"].sum()

:func:`load_trace` returns a :class:`TraceTables`: ``events`` (one row per complete event, the
same columns and dtypes every time, sorted by ``start_ns``), ``flows``, ``steps``,
``process_groups`` and a ``meta`` dict; :class:`TraceTables` gives the schema.

**How it stays fast and small.** The file is gunzipped a slice at a time (with ISA-L), and the
JSON text is cut between two events of ``traceEvents`` into pieces of 64 to 512 KiB that are
each valid JSON on their own (a piece that fails to decode means the cut was wrong, and the
file is then decoded whole). msgspec decodes each piece into typed structs that declare only
the fields used here, so every other key is skipped in C, and the piece becomes numpy columns
before the next is read: memory stays small whatever the size of the trace. Repeated strings
become categoricals; no pyarrow string is made (its first use alone costs some 4 MiB).

**Timestamps.** A Chrome trace's ``ts`` and ``dur`` are microseconds whatever its
``displayTimeUnit`` says (that only sets the viewer's unit). Kineto writes them as integers of
epoch µs (older traces), as decimals of epoch µs with nanosecond digits
(``1712195495519689.047``: more digits than a float64 holds, so those are re-read from the
JSON text to keep the nanoseconds), or as decimals relative to ``baseTimeNanoseconds`` (newer
traces). ``start_ns`` is always epoch nanoseconds.

**Rank.** From ``distributedInfo.rank``; else the ``rank`` argument; else the file name
(``rank3``, ``rank-3``, ``rank_3``, ``worker3``); else 0. ``meta["rank_source"]`` says which.

**Cache.** Unless ``cache=False``, the tables are saved as Parquet (with ``meta.json``) in
``cache_dir`` when given (a run's traces are cached in its ``derived/`` folder, see
:meth:`dpro.run_format.Run.derived_dir`); else in ``<trace file name>.dpro/`` beside the trace or, where that folder may not be written, in
``$XDG_CACHE_HOME/dpro/traces/<sha1 of the trace's absolute path>/`` (default ``~/.cache``);
failing both, nothing is cached. A folder whose permission bits deny writing counts as not
writable even for root, so a read-only data folder is never written to. A later load reads the
cache when the trace's size and mtime, the ``rank`` argument and the loader's code (this
package and every dpro module it imports, :func:`dpro.code_hash.code_hash`) match.
"""

from __future__ import annotations

import os
from pathlib import Path

from dpro.graph.kineto.cache import default_folders, read_cache, write_cache
from dpro.code_hash import code_hash
from dpro.graph.kineto.schema import TraceFormatError, TraceTables
from dpro.graph.kineto.tables import parse

__all__ = ["TraceFormatError", "TraceTables", "load_trace"]


def load_trace(path: str | os.PathLike, rank: int | None = None, cache: bool = True,
               cache_dir: str | os.PathLike | None = None) -> TraceTables:
    """Load a Kineto trace (``.json`` or ``.json.gz``) into :class:`TraceTables`.

    ``rank`` is used when the trace's ``distributedInfo`` has none. ``cache_dir``: where to
    cache the tables (the run model passes its ``derived/`` folder); by default beside the
    trace or in the user's cache. With ``cache=False`` no cache is read or written. Raises
    :class:`TraceFormatError` for unreadable or invalid input.
    """
    path, rank = Path(path).absolute(), None if rank is None else int(rank)
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise TraceFormatError(f"trace file not found: {path}") from None
    except OSError as e:
        raise TraceFormatError(f"cannot read {path}: {e.strerror}") from None
    key = {"code": code_hash("dpro.graph.kineto"), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "rank": rank}
    folders = [Path(cache_dir)] if cache_dir is not None else default_folders(path)
    if cache:
        cached = read_cache(path, key, folders)
        if cached is not None:
            return cached
    tables = parse(path, rank)
    if cache:
        write_cache(path, key, tables, folders)
    return tables
