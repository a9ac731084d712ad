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
``<trace file name>.dpro/`` beside the trace or, where that folder may not be written, in
``$XDG_CACHE_HOME/dpro/traces/<sha1 of the trace's absolute path>/`` (default ``~/.cache``);
failing both, nothing is cached. A folder whose permission bits deny writing counts as not
writable even for root, so a read-only data folder is never written to. A later load reads the
cache when the trace's size and mtime, the ``rank`` argument and :data:`LOADER_VERSION` match.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd
from isal import isal_zlib as zlib  # zlib's API, inflating 2-3 times faster

from dpro.errors import DproError

__all__ = ["LOADER_VERSION", "TraceFormatError", "TraceTables", "load_trace"]

LOADER_VERSION = 1
"""Version of the tables' layout; a cache written by another version is ignored."""


class TraceFormatError(DproError, ValueError):
    """The file cannot be read as a Kineto trace; the message is one line naming the file."""


@dataclass
class TraceTables:
    """One rank's trace as tables.

    ``events``, one row per complete event (``ph == "X"``), sorted by ``start_ns`` (ties: the
    longer event first, so that a parent precedes its children):

    ============== ======== ==============================================================
    rank           int32    the trace's rank (``meta["rank_source"]`` says where from)
    cat            category ``cpu_op``, ``user_annotation``, ``cuda_runtime``, ``kernel``,
                            ``gpu_memcpy``, ``gpu_memset``, ``gpu_user_annotation``, ...
                            (2021 names such as ``Operator`` or ``Kernel`` are renamed)
    name           category
    pid, tid       int64    process and thread; on the GPU, the device and the stream
    stream         int32    CUDA/HIP stream, -1 on the CPU
    device         int32    GPU index, -1 on the CPU
    start_ns       int64    epoch nanoseconds
    dur_ns         int64
    step           int32    ``N`` of the enclosing CPU ``ProfilerStep#N``, -1 outside any;
                            a GPU event takes the step of its launch (same ``correlation``)
    correlation    int64    CUDA/HIP correlation id, -1 if none
    external_id    int64    -1 if none
    coll_name      category collective (``all_reduce``, ``all_gather``, ``_all_gather_base``,
                            ``all_to_all``, ``broadcast``, ``send_recv``...) from the args or
                            the name (``nccl:*``, ``gloo:*``, ``c10d::*``, NCCL kernels);
                            NaN elsewhere
    pg_name        category process group, NaN if not given
    pg_desc        category process group description, NaN if not given
    in_nelems      int64    elements in, -1 if not given
    out_nelems     int64    elements out, -1 if not given
    group_size     int32    -1 if not given
    dtype          category element type of the collective, NaN if not given
    seq            int64    collective sequence number, -1 if not given
    ============== ======== ==============================================================

    Categories, like every text column here, are object-dtype strings. ``flows``: the flow
    events (``ph`` ``s``/``f``/``t``: ``ac2g`` launch → GPU, ``fwdbwd``...) with ``cat`` and
    ``phase`` (category), ``flow_id``, ``pid``, ``tid`` and ``ts_ns`` (int64), sorted by ``ts_ns``. ``steps``: ``step``,
    ``start_ns``, ``end_ns`` (int64) of the CPU ``ProfilerStep#N`` events, sorted; empty if
    none. ``process_groups``: ``pg_name``, ``pg_desc``, ``backend`` (text), ``size`` (int64)
    and ``ranks`` (list of int) from ``distributedInfo.pg_config``; empty if absent.
    ``meta``: ``source``, ``trace_name``, ``schema_version``, ``rank``, ``rank_source``,
    ``world_size``, ``backend``, ``nccl_version``, ``pg_count``, ``base_time_ns``,
    ``time_unit`` (``displayTimeUnit`` as written), ``span_start_ns`` and ``span_end_ns`` (the
    profiling window) and ``device_properties``.
    """

    events: pd.DataFrame
    flows: pd.DataFrame
    steps: pd.DataFrame
    process_groups: pd.DataFrame
    meta: dict[str, Any]


def load_trace(path: str | os.PathLike, rank: int | None = None, cache: bool = True) -> TraceTables:
    """Load a Kineto trace (``.json`` or ``.json.gz``) into :class:`TraceTables`.

    ``rank`` is used when the trace's ``distributedInfo`` has none. With ``cache=False`` no
    cache is read or written. Raises :class:`TraceFormatError` for unreadable or invalid input.
    """
    path, rank = Path(path).absolute(), None if rank is None else int(rank)
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise TraceFormatError(f"trace file not found: {path}") from None
    except OSError as e:
        raise TraceFormatError(f"cannot read {path}: {e.strerror}") from None
    key = {"loader_version": LOADER_VERSION, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "rank": rank}
    if cache:
        cached = _read_cache(path, key)
        if cached is not None:
            return cached
    tables = _parse(path, rank)
    if cache:
        _write_cache(path, key, tables)
    return tables


# --- decoding -------------------------------------------------------------------------------

_Num = int | float | str | None  # as written, strings tolerated ("stream": "0x0" on ROCm)
_Text = str | int | float | None


class _Args(msgspec.Struct, frozen=True, gc=False):
    external_id: _Num = msgspec.field(name="External id", default=-1)
    old_external_id: _Num = msgspec.field(name="external id", default=-1)  # 2021 schema
    correlation: _Num = -1
    stream: _Num = -1
    device: _Num = -1
    coll_name: _Text = msgspec.field(name="Collective name", default=None)
    in_nelems: _Num = msgspec.field(name="In msg nelems", default=-1)
    out_nelems: _Num = msgspec.field(name="Out msg nelems", default=-1)
    group_size: _Num = msgspec.field(name="Group size", default=-1)
    dtype: _Text = None
    pg_name: _Text = msgspec.field(name="Process Group Name", default=None)
    pg_id: _Num = msgspec.field(name="Process Group ID", default=-1)  # older name of pg_name
    pg_desc: _Text = msgspec.field(name="Process Group Description", default=None)
    seq: _Num = msgspec.field(name="Seq", default=-1)
    seq_lower: _Num = msgspec.field(name="seq", default=-1)


_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: _Text = ""
    name: _Text = ""
    pid: _Num = -1
    tid: _Num = -1
    ts: int | float = 0
    dur: int | float = 0
    id: _Num = -1
    args: _Args = _NO_ARGS


class _Header(msgspec.Struct):
    schemaVersion: Any = None
    traceName: Any = None
    displayTimeUnit: Any = None
    baseTimeNanoseconds: int | float | None = None
    deviceProperties: Any = None
    distributedInfo: Any = None


class _File(_Header):
    traceEvents: list[_Event] | None = None
    nodes: msgspec.Raw = msgspec.Raw()  # PyTorch execution traces (Chakra) have nodes instead


class _ExactEvent(_Event, gc=False):
    """An event whose ``ts`` is kept as written, for traces whose floats would lose nanoseconds."""

    ts: msgspec.Raw = msgspec.Raw(b"0")


class _ExactFile(_File):
    traceEvents: list[_ExactEvent] | None = None


_EVENTS = {False: msgspec.json.Decoder(list[_Event]), True: msgspec.json.Decoder(list[_ExactEvent])}
_FILE = {False: msgspec.json.Decoder(_File), True: msgspec.json.Decoder(_ExactFile)}
_FLOATS = msgspec.json.Decoder(list[float])

_READ = 1 << 20  # file bytes read at a time
_GZIP_MAGIC = b"\x1f\x8b"
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BETWEEN_EVENTS = re.compile(rb"\}\s*(,)\s*\{")
_NANOSECOND_TS = re.compile(rb'"ts"\s*:\s*-?\d{14,}\.')  # epoch µs with decimals, beyond a float64's ns


class _BadCut(Exception):
    """A piece of the text did not decode on its own: the file must be decoded whole."""


def _piece_size(path: Path) -> int:
    """Bytes of JSON text to decode at a time: 1/32 of the text, within 64 KiB and 512 KiB.

    Small traces keep little in memory, large ones spread the per-piece work over more events.
    """
    try:
        with path.open("rb") as file:
            size = file.seek(0, os.SEEK_END)
            file.seek(0)
            if file.read(2) == _GZIP_MAGIC and size >= 4:
                file.seek(-4, os.SEEK_END)
                size = int.from_bytes(file.read(4), "little")  # the text's size, from the gzip trailer
    except OSError:
        size = 0  # _read_text says what is wrong
    return min(max(size // 32, 1 << 16), 1 << 19)


def _read_text(path: Path, piece: int) -> Iterator[bytes]:
    """The trace's JSON text a slice at a time (about ``piece`` bytes), gunzipped on the fly."""
    try:
        with path.open("rb") as file:
            data = file.read(_READ)
            if data[:2] != _GZIP_MAGIC:
                if path.suffix == ".gz":
                    raise TraceFormatError(f"{path} is not gzip-compressed (no gzip magic bytes)")
                while data:
                    yield data
                    data = file.read(_READ)
                return
            inflater, step = zlib.decompressobj(wbits=31), max(piece // 16, 1)  # text is 10 to 30 times larger
            while data:
                view = memoryview(data)
                for i in range(0, len(data), step):
                    yield inflater.decompress(view[i:i + step])
                    while inflater.eof and inflater.unused_data:  # another gzip member follows
                        rest, inflater = inflater.unused_data, zlib.decompressobj(wbits=31)
                        yield inflater.decompress(rest)
                data = file.read(_READ)
            if not inflater.eof:
                raise TraceFormatError(f"{path} is a truncated gzip file (the compressed data ends early)")
    except zlib.error as e:
        raise TraceFormatError(f"{path} is not a valid gzip file ({e})") from None
    except IsADirectoryError:
        raise TraceFormatError(f"not a trace file but a folder: {path}") from None
    except OSError as e:
        raise TraceFormatError(f"cannot read {path}: {e.strerror}") from None


def _pieces(chunks: Iterable[bytes], piece: int) -> Iterator[tuple[str, bytes | bytearray | memoryview]]:
    """The text as pieces of about ``piece`` bytes (0: uncut) that each decode on their own,
    cut between two trace events.

    Kinds: ``whole`` (the file, uncut), ``first`` (the file up to a cut, closed with ``]}``),
    ``middle`` (an array of events: the commas at both cuts become ``[`` and ``]`` in place)
    and ``last`` (``{"traceEvents": [`` and the rest of the file).
    """
    text, parts, pending, events_start, first = bytearray(), [], 0, -1, True
    for chunk in chunks:
        parts.append(chunk)
        pending += len(chunk)
        if not piece or pending < piece:
            continue
        text, parts, pending = bytearray().join([text, *parts]), [], 0
        if events_start < 0:
            m = _EVENTS_KEY.search(text)
            if m is None:
                continue
            events_start = m.end()
        gap = _last_gap(text, events_start, piece)
        if gap is None:
            continue
        if first:
            yield "first", b"".join((memoryview(text)[:gap], b"]}"))
            first = False
        else:
            text[0], text[gap] = ord("["), ord("]")
            yield "middle", memoryview(text)[:gap + 1]
        text, events_start = text[gap:], 1
    text = bytearray().join([text, *parts])
    if first:
        yield "whole", text
    else:
        yield "last", b"".join((b'{"traceEvents": [', memoryview(text)[1:]))


def _last_gap(text: bytearray, start: int, piece: int) -> int | None:
    """Position of the last comma between two events near the end of text, if any."""
    gap = None
    for gap_match in _BETWEEN_EVENTS.finditer(text, max(start, len(text) - piece // 16)):
        gap = gap_match.start(1)
    return gap


def _decode_events(path: Path) -> tuple[dict[str, Any], _Collector]:
    """Header fields and the collected events; cut into pieces, or whole if a cut was wrong."""
    try:
        return _decode_pieces(path, cut=True)
    except _BadCut:
        return _decode_pieces(path, cut=False)


def _decode_pieces(path: Path, cut: bool) -> tuple[dict[str, Any], _Collector]:
    header: dict[str, Any] = {}
    collector, exact = _Collector(), False
    size = _piece_size(path)
    for kind, piece in _pieces(_read_text(path, size), size if cut else 0):
        exact = exact or (kind in ("first", "whole") and _NANOSECOND_TS.search(piece) is not None)
        events = _decode_piece(kind, piece, header, path, exact)
        try:
            if not collector.add(events):  # timestamps that floats cannot hold: read them as text from now on
                exact = True
                collector.add(_decode_piece(kind, piece, header, path, exact))
        except msgspec.ValidationError as e:  # a ts read as text is not a number
            raise TraceFormatError(f"{path} is not a Kineto trace: a 'ts' is not a number ({e})") from None
        del events, piece  # before the next piece is made, to keep one in memory at a time
    return header, collector


def _decode_piece(kind: str, piece: bytes | bytearray | memoryview, header: dict[str, Any], path: Path,
                  exact: bool) -> list[_Event]:
    """The events of one piece (``ts`` as text if ``exact``); its header fields go into ``header``."""
    try:
        if kind == "middle":
            events = _EVENTS[exact].decode(piece)
        else:
            file = _FILE[exact].decode(piece)
            header.update((f, getattr(file, f)) for f in _Header.__struct_fields__ if getattr(file, f) is not None)
            events = file.traceEvents
    except msgspec.DecodeError as e:
        if kind != "whole":
            raise _BadCut from None
        problem = "is not a Kineto trace" if isinstance(e, msgspec.ValidationError) else "is not valid JSON"
        raise TraceFormatError(f"{path} {problem}: {e}") from None
    if events is None:
        if file.nodes:
            raise TraceFormatError(f"{path} is a PyTorch execution trace (Chakra: 'nodes', no 'traceEvents'), "
                                   "not a Kineto trace; record it with torch.profiler")
        raise TraceFormatError(f"{path} is not a Kineto trace: it has no 'traceEvents'")
    if kind in ("middle", "last") and events and not events[0].ph:
        raise _BadCut  # cut outside traceEvents, in a later list of objects
    return events


# --- numbers -------------------------------------------------------------------------------

_INT_TEXT = re.compile(r"(-?)(0x[0-9a-f]+|\d+)\s*$", re.IGNORECASE)  # "7", "stream 7", "0x0"
_EXACT_BELOW_US = 2.0 ** 43  # below this, a float64 holds a µs decimal to within 0.5 ns


def _to_int(value: Any) -> int:
    """A value as int64; -1 if it is none, not a number or beyond 64 bits."""
    if isinstance(value, str):
        m = _INT_TEXT.search(value)
        if m is None:
            return -1
        value = int(m[2], 16 if m[2][:2].lower() == "0x" else 10) * (-1 if m[1] else 1)
    if isinstance(value, float):
        value = int(value) if abs(value) < 2.0 ** 63 else -1
    return value if isinstance(value, int) and -2 ** 63 <= value < 2 ** 63 else -1


def _ints(values: list) -> np.ndarray:
    """Values as int64; -1 where one is none, not a number or beyond 64 bits."""
    try:
        return np.fromiter(values, np.int64, len(values))
    except (TypeError, ValueError, OverflowError):
        as_int = {value: _to_int(value) for value in set(values)}
        return np.fromiter(map(as_int.__getitem__, values), np.int64, len(values))


def _us_to_ns(us: np.ndarray) -> np.ndarray:
    """µs as float64 → int64 ns; exact for whole µs and for decimals below 2**43 µs."""
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)


def _ts_ns(events: list[_Event]) -> np.ndarray | None:
    """The events' ``ts`` in ns; None if decimals were read into floats too coarse for them."""
    if events and isinstance(events[0].ts, msgspec.Raw):
        return _text_us_to_ns([e.ts for e in events])
    values = [e.ts for e in events]
    us = np.fromiter(values, np.float64, len(values))
    if not len(us) or np.abs(us).max() < _EXACT_BELOW_US:
        return _us_to_ns(us)
    if all(type(v) is int for v in values):  # whole µs, which int64 holds exactly
        return np.array(values, np.int64) * 1000
    return None


def _text_us_to_ns(texts: list[msgspec.Raw]) -> np.ndarray:
    """Exact ns of µs numbers written in JSON. Numbers all written alike are read digit by digit;
    others take their decimals from the text and their whole µs from the float, which is within
    0.25 µs of the true value once the decimals are known."""
    same_width = _same_width_us_to_ns(texts)
    if same_width is not None:
        return same_width
    text = b"".join((b"[", b",".join(texts), b"]"))
    us = np.fromiter(_FLOATS.decode(text), np.float64, len(texts))
    if b"e" in text or b"E" in text:  # exponent notation: nothing better than the float
        return _us_to_ns(us)
    chars = np.frombuffer(text, np.uint8)
    bounds = np.flatnonzero((chars == 44) | (chars == 91) | (chars == 93))  # , [ ]: before and after each number
    dots = np.append(np.flatnonzero(chars == 46), len(text) - 1)
    dot = dots[np.searchsorted(dots, bounds[:-1])]  # in this number if before the next bound, else in a later one
    decimals = chars[np.minimum(dot[:, None] + np.arange(1, 5), len(text) - 1)]  # up to 4, the 4th to round on
    digits = np.logical_and.accumulate((decimals >= 48) & (decimals <= 57), axis=1) & (dot < bounds[1:])[:, None]
    d = np.where(digits, decimals.astype(np.int64) - 48, 0)
    frac = d[:, 0] * 100 + d[:, 1] * 10 + d[:, 2] + (d[:, 3] >= 5)
    frac = np.where(chars[bounds[:-1] + 1] == 45, -frac, frac)
    return np.rint(us - frac / 1000).astype(np.int64) * 1000 + frac


def _same_width_us_to_ns(texts: list[msgspec.Raw]) -> np.ndarray | None:
    """Exact ns of µs numbers all written alike (``1712195495519689.047``, as Kineto does),
    read digit by digit as a matrix; None for any other text."""
    joined, width = b"".join(texts), len(texts[0]) if texts else 0
    if not width or len(joined) != width * len(texts):
        return None
    chars = np.frombuffer(joined, np.uint8).reshape(len(texts), width)
    dots = np.flatnonzero(chars[0] == 46)
    point = int(dots[0]) if len(dots) else width
    digits = np.delete(chars, point, axis=1) if point < width else chars
    if point > 18 or (point < width and not (chars[:, point] == 46).all()) or not (
            (digits >= 48) & (digits <= 57)).all():
        return None
    digits = digits.astype(np.int64) - 48
    whole = digits[:, :point] @ 10 ** np.arange(point - 1, -1, -1, dtype=np.int64)
    decimals = digits[:, point:point + 3]
    frac = decimals @ 10 ** np.arange(2, 2 - decimals.shape[1], -1, dtype=np.int64)
    if digits.shape[1] > point + 3:
        frac += digits[:, point + 3] >= 5  # round half up on the 4th decimal
    return whole * 1000 + frac


# --- strings ---------------------------------------------------------------------------------


class _Factorizer:
    """Integer codes for repeated values, the same across pieces; None is -1."""

    def __init__(self) -> None:
        self._codes: dict[Any, int] = {None: -1}
        self.labels: dict[str, int] = {}

    def __call__(self, values: list) -> np.ndarray:
        codes = np.fromiter(map(self._codes.get, values, repeat(-2)), np.int32, len(values))
        new = np.flatnonzero(codes == -2).tolist()
        if new:  # values not seen before
            known, labels = self._codes, self.labels
            for i in new:
                value = values[i]
                if value not in known:
                    known[value] = labels.setdefault(value if isinstance(value, str) else str(value), len(labels))
                codes[i] = known[value]
        return codes


def _derive(codes: np.ndarray, labels: Iterable[str], fn: Callable[[str], str | None]) -> tuple[np.ndarray, list[str]]:
    """Codes and labels of ``fn(label)`` (None: missing), from codes of labels."""
    out: dict[str, int] = {}
    remap = [-1 if (d := fn(label)) is None else out.setdefault(d, len(out)) for label in labels]
    return np.array(remap + [-1], np.int32)[codes], list(out)


def _prefer(a: tuple[np.ndarray, list[str]], b: tuple[np.ndarray, list[str]]) -> tuple[np.ndarray, list[str]]:
    """Codes of ``a`` where present, else of ``b``, over the union of their labels."""
    (a_codes, a_labels), (b_codes, b_labels) = a, b
    index = {label: i for i, label in enumerate(a_labels)}
    remap = np.array([index.setdefault(label, len(index)) for label in b_labels] + [-1], np.int32)
    return np.where(a_codes >= 0, a_codes, remap[b_codes]), list(index)


def _int_labels(values: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Codes and labels of non-negative integers written as text (-1: missing)."""
    labels = np.unique(values[values >= 0])
    return np.where(values >= 0, np.searchsorted(labels, values), -1).astype(np.int32), [str(v) for v in labels]


def _frame(columns: dict[str, Any]) -> pd.DataFrame:
    """A DataFrame of these columns, built without pyarrow strings (their first use costs ~4 MiB)."""
    frame = pd.DataFrame(dict(enumerate(columns.values())), copy=False)
    frame.columns = pd.Index(list(columns), dtype=object)
    return frame


def _categories(labels: list[str]) -> pd.CategoricalDtype:
    return pd.CategoricalDtype(pd.Index(labels, dtype=object))


_NO_CATEGORIES = _categories([])  # the usual dtype of the collective columns, made once


def _categorical(codes: np.ndarray, labels: list[str]) -> pd.Categorical:
    dtype = _categories(labels) if labels else _NO_CATEGORIES
    return pd.Categorical.from_codes(codes, dtype=dtype, validate=False)


_OLD_CATEGORIES = {"Operator": "cpu_op", "Runtime": "cuda_runtime", "Kernel": "kernel",
                   "Memcpy": "gpu_memcpy", "Memset": "gpu_memset"}
_GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"})
_WINDOW_CATEGORY = "trace"  # the "PyTorch Profiler (0)" event that spans the profiling window


def _modern_category(cat: str) -> str:
    return _OLD_CATEGORIES.get(cat) or cat.lower()


# letters-only spelling → the name that torch.distributed uses in its nccl:/gloo: annotations
_COLLECTIVES = {
    "allreduce": "all_reduce", "allreducecoalesced": "all_reduce_coalesced",
    "allgather": "all_gather", "allgatherbase": "_all_gather_base",
    "allgathercoalesced": "all_gather_coalesced",
    "allgatherintotensorcoalesced": "all_gather_into_tensor_coalesced",
    "reducescatter": "reduce_scatter", "reducescatterbase": "_reduce_scatter_base",
    "reducescattertensorcoalesced": "reduce_scatter_tensor_coalesced",
    "alltoall": "all_to_all", "alltoallbase": "all_to_all", "alltoallv": "all_to_all",
    "sendrecv": "send_recv", "recvanysource": "recv_any_source", "monitoredbarrier": "barrier",
}
_COLLECTIVE_IN_NAME = re.compile(
    r"(?:nccl|gloo|ucc|mpi|xccl):(?P<annotation>\w+)"  # nccl:all_reduce, gloo:all_reduce
    r"|c10d::(?P<op>\w+)"  # c10d::allreduce_
    r"|nccl(?:Dev)?Kernel_(?P<kernel>[A-Za-z]+)")  # ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_SendRecv
_STEP_NAME = re.compile(r"ProfilerStep#(\d+)")


def _canonical_collective(name: str) -> str:
    """``allreduce``, ``AllReduce``, ``all_reduce`` → ``all_reduce``; unknown names lowercased."""
    return _COLLECTIVES.get(re.sub(r"[^a-z]", "", name.lower()), name.lower())


def _collective_in_name(name: str) -> str | None:
    m = _COLLECTIVE_IN_NAME.match(name)
    if m is None or m["kernel"] == "Generic":  # ncclDevKernel_Generic runs any collective
        return None
    return _canonical_collective(m["annotation"] or m["kernel"] or m["op"].rstrip("_"))


def _step_number(name: str) -> int:
    m = _STEP_NAME.fullmatch(name)
    return int(m[1]) if m else -1


# --- pieces to columns -----------------------------------------------------------------------

_PHASE_LABELS = ["s", "t", "f"]  # flow start, step, finish
_PHASE_CODE = np.full(256, -1, np.int32)
_PHASE_CODE[[ord(p) for p in _PHASE_LABELS]] = range(len(_PHASE_LABELS))


class _Columns:
    """numpy columns of one table, appended a piece at a time."""

    def __init__(self) -> None:
        self._parts: dict[str, list[np.ndarray]] = {}

    def append(self, **columns: np.ndarray) -> None:
        for name, values in columns.items():
            self._parts.setdefault(name, []).append(values)

    def __getitem__(self, name: str) -> np.ndarray:
        parts = self._parts.get(name)
        return np.concatenate(parts) if parts else np.empty(0, np.int64)


class _Collector:
    """Turns decoded pieces of the trace into columns of complete events, flows and instants.

    Columns that few events have are kept sparse, as rows and values: ``gpu`` (stream, device)
    and ``comm`` (the args of collectives, read where the args name one).
    """

    def __init__(self) -> None:
        self.events, self.gpu, self.comm = _Columns(), _Columns(), _Columns()
        self.flows, self.instants = _Columns(), _Columns()
        self.n_events = 0
        self.text = {name: _Factorizer()
                     for name in ("cat", "name", "flow_cat", "coll_name", "dtype", "pg_name", "pg_desc")}
        self._is_gpu = np.zeros(1, bool)  # by category code, and False for -1 last

    def add(self, events: list[_Event]) -> bool:
        """Add a piece's events; False, adding nothing, if their float ``ts`` lost nanoseconds."""
        ts = _ts_ns(events)
        if ts is None:
            return False
        phases = _phases(events)
        complete = np.flatnonzero(phases == ord("X"))
        if len(complete):
            self._add_complete([events[i] for i in complete.tolist()], ts[complete])
        flows = np.flatnonzero(_PHASE_CODE[phases] >= 0)
        if len(flows):
            f = [events[i] for i in flows.tolist()]
            self.flows.append(cat=self.text["flow_cat"]([e.cat for e in f]), flow_id=_ints([e.id for e in f]),
                              phase=_PHASE_CODE[phases[flows]], pid=_ints([e.pid for e in f]),
                              tid=_ints([e.tid for e in f]), ts_ns=ts[flows])
        self.instants.append(ts_ns=ts[(phases == ord("i")) | (phases == ord("I"))])
        return True

    def _add_complete(self, events: list[_Event], ts_ns: np.ndarray) -> None:
        n, text, args = len(events), self.text, [e.args for e in events]
        cat = text["cat"]([e.cat for e in events])
        external_id = _ints([a.external_id for a in args])
        old = np.flatnonzero(external_id < 0).tolist()  # the 2021 schema's "external id"
        external_id[old] = _ints([args[i].old_external_id for i in old])
        coll_name = text["coll_name"]([a.coll_name for a in args])
        self.events.append(
            cat=cat, name=text["name"]([e.name for e in events]),
            pid=_ints([e.pid for e in events]), tid=_ints([e.tid for e in events]),
            start_ns=ts_ns, dur_ns=_us_to_ns(np.fromiter([e.dur for e in events], np.float64, n)),
            external_id=external_id, correlation=_ints([a.correlation for a in args]))
        gpu = np.flatnonzero(self._gpu_flags()[cat]).tolist()
        if gpu:
            self.gpu.append(row=np.array(gpu) + self.n_events, stream=_ints([args[i].stream for i in gpu]),
                            device=_ints([args[i].device for i in gpu]))
        comm = np.flatnonzero(coll_name >= 0).tolist()
        if comm:
            a = [args[i] for i in comm]
            self.comm.append(
                row=np.array(comm) + self.n_events, coll_name=coll_name[comm],
                in_nelems=_ints([x.in_nelems for x in a]), out_nelems=_ints([x.out_nelems for x in a]),
                group_size=_ints([x.group_size for x in a]), pg_id=_ints([x.pg_id for x in a]),
                seq=_ints([x.seq if x.seq != -1 else x.seq_lower for x in a]),
                dtype=text["dtype"]([x.dtype for x in a]), pg_name=text["pg_name"]([x.pg_name for x in a]),
                pg_desc=text["pg_desc"]([x.pg_desc for x in a]))
        self.n_events += n

    def _gpu_flags(self) -> np.ndarray:
        """Whether each category code is a GPU one, with False for code -1 last."""
        labels = self.text["cat"].labels
        if len(self._is_gpu) != len(labels) + 1:
            self._is_gpu = np.array([_modern_category(c) in _GPU_CATEGORIES for c in labels] + [False])
        return self._is_gpu


def _phases(events: list[_Event]) -> np.ndarray:
    """The events' one-letter ``ph`` as bytes (``?`` for anything else), without hashing strings."""
    phases = "".join([e.ph for e in events])
    if len(phases) != len(events):
        phases = "".join([e.ph if len(e.ph) == 1 else "?" for e in events])
    return np.frombuffer(phases.encode("latin-1", "replace"), np.uint8)


def _dense(n: int, sparse: _Columns, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Sparse columns in full, -1 where they have no value."""
    rows, columns = sparse["row"], {}
    for name in names:
        values = sparse[name]
        columns[name] = np.full(n, -1, values.dtype)
        columns[name][rows] = values
    return columns


# --- columns to tables -----------------------------------------------------------------------


def _parse(path: Path, rank: int | None) -> TraceTables:
    header, collector = _decode_events(path)
    base = header.get("baseTimeNanoseconds")
    base_ns = 0 if base is None else int(base)
    dist = header.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else {}
    rank, rank_source = _resolve_rank(dist, rank, path)
    events, steps, window = _events_frame(collector, rank, base_ns)
    devices = header.get("deviceProperties")
    meta = {
        "source": str(path), "trace_name": header.get("traceName"), "schema_version": header.get("schemaVersion"),
        "rank": rank, "rank_source": rank_source, "world_size": dist.get("world_size"),
        "backend": dist.get("backend"), "nccl_version": dist.get("nccl_version"), "pg_count": dist.get("pg_count"),
        "base_time_ns": None if base is None else base_ns, "time_unit": header.get("displayTimeUnit"),
        "span_start_ns": window[0], "span_end_ns": window[1],
        "device_properties": devices if isinstance(devices, list) else [],
    }
    return TraceTables(events, _flows_frame(collector, base_ns), steps, _process_groups(dist), meta)


def _events_frame(c: _Collector, rank: int, base_ns: int) -> tuple[pd.DataFrame, pd.DataFrame, tuple]:
    """The events table, the steps table and the profiling window (start, end) in ns."""
    col, text, n = c.events, c.text, c.n_events
    cat, cat_labels = _derive(col["cat"], text["cat"].labels, _modern_category)
    start, dur = col["start_ns"] + base_ns, col["dur_ns"]
    window_code = cat_labels.index(_WINDOW_CATEGORY) if _WINDOW_CATEGORY in cat_labels else -2
    is_window = cat == window_code
    window = _window(start[is_window], (start + dur)[is_window], c.instants["ts_ns"] + base_ns, start, dur)

    order = _start_order(start, dur, np.flatnonzero(~is_window))
    cat, start, dur = cat[order], start[order], dur[order]
    if window_code >= 0:  # its events are gone: drop the label
        cat, cat_labels = cat - (cat > window_code), cat_labels[:window_code] + cat_labels[window_code + 1:]
    name, name_labels = col["name"][order], list(text["name"].labels)
    pid, tid, correlation = col["pid"][order], col["tid"][order], col["correlation"][order]
    gpu = np.isin(cat, [i for i, label in enumerate(cat_labels) if label in _GPU_CATEGORIES])
    stream, device = (column[order] for column in _dense(n, c.gpu, ("stream", "device")).values())
    comm = {f: column[order] for f, column in _dense(n, c.comm, (
        "coll_name", "in_nelems", "out_nelems", "group_size", "pg_id", "seq", "dtype", "pg_name", "pg_desc")).items()}
    steps = _steps(name, name_labels, start, dur, gpu)
    coll = _prefer(_derive(comm["coll_name"], text["coll_name"].labels, _canonical_collective),
                   _derive(name, name_labels, _collective_in_name))
    pg = _prefer((comm["pg_name"], list(text["pg_name"].labels)), _int_labels(comm["pg_id"]))
    frame = _frame({
        "rank": np.full(len(order), rank, np.int32),
        "cat": _categorical(cat, cat_labels),
        "name": _categorical(name, name_labels),
        "pid": pid, "tid": tid,
        "stream": np.where(gpu, np.where(stream >= 0, stream, tid), -1).astype(np.int32),
        "device": np.where(gpu, np.where(device >= 0, device, pid), -1).astype(np.int32),
        "start_ns": start, "dur_ns": dur,
        "step": _step_of(start, gpu, correlation, steps).astype(np.int32),
        "correlation": correlation,
        "external_id": col["external_id"][order],
        "coll_name": _categorical(*coll),
        "pg_name": _categorical(*pg),
        "pg_desc": _categorical(comm["pg_desc"], list(text["pg_desc"].labels)),
        "in_nelems": comm["in_nelems"], "out_nelems": comm["out_nelems"],
        "group_size": comm["group_size"].astype(np.int32),
        "dtype": _categorical(comm["dtype"], list(text["dtype"].labels)),
        "seq": comm["seq"],
    })
    return frame, _frame(steps), window


def _start_order(start: np.ndarray, dur: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``rows`` sorted by start, the longer first among equal starts (a parent before its children)."""
    rows = rows[np.argsort(start[rows], kind="stable")]
    s = start[rows]
    tied = np.flatnonzero(s[1:] == s[:-1])
    if len(tied):  # re-sort the runs of equal starts only, which is much quicker than a full lexsort
        runs = np.unique(np.concatenate((tied, tied + 1)))
        rows[runs] = rows[runs][np.lexsort((-dur[rows[runs]], s[runs]))]
    return rows


def _window(starts: np.ndarray, ends: np.ndarray, instants: np.ndarray, start: np.ndarray,
            dur: np.ndarray) -> tuple[int | None, int | None]:
    """The profiling window: the span event and the instants around it, else all events."""
    bounds = np.concatenate((starts, ends, instants))
    if not len(bounds):
        bounds = np.concatenate((start, start + dur))
    return (int(bounds.min()), int(bounds.max())) if len(bounds) else (None, None)


def _steps(name: np.ndarray, name_labels: list[str], start: np.ndarray, dur: np.ndarray,
           gpu: np.ndarray) -> dict[str, np.ndarray]:
    """Columns of the CPU ``ProfilerStep#N`` events (the first of each N), sorted by start."""
    number = np.array([_step_number(label) for label in name_labels] + [-1], np.int64)[name]
    rows = np.flatnonzero((number >= 0) & ~gpu)
    rows = rows[np.unique(number[rows], return_index=True)[1]]
    rows = rows[np.argsort(start[rows], kind="stable")]
    return {"step": number[rows], "start_ns": start[rows], "end_ns": start[rows] + dur[rows]}


def _step_of(start: np.ndarray, gpu: np.ndarray, correlation: np.ndarray, steps: dict[str, np.ndarray]) -> np.ndarray:
    """Step of each event: the step enclosing its start; on the GPU, the step of its launch."""
    i = np.searchsorted(steps["start_ns"], start, side="right") - 1
    inside = (i >= 0) & (start < np.append(steps["end_ns"], 0)[i])
    step = np.append(steps["step"], -1)[np.where(inside, i, -1)]
    launch = np.flatnonzero(~gpu & (correlation >= 0))
    launch = launch[np.argsort(correlation[launch], kind="stable")]
    launch_correlation = np.append(correlation[launch], -1)
    j = np.minimum(np.searchsorted(launch_correlation[:-1], correlation), len(launch))
    launched = gpu & (correlation >= 0) & (launch_correlation[j] == correlation)
    return np.where(launched, np.append(step[launch], -1)[j], step)


def _flows_frame(c: _Collector, base_ns: int) -> pd.DataFrame:
    col = c.flows
    ts = col["ts_ns"] + base_ns
    order = np.argsort(ts, kind="stable")
    return _frame({
        "cat": _categorical(*_derive(col["cat"][order], c.text["flow_cat"].labels, _modern_category)),
        "flow_id": col["flow_id"][order],
        "phase": _categorical(col["phase"][order], _PHASE_LABELS),
        "pid": col["pid"][order], "tid": col["tid"][order], "ts_ns": ts[order],
    })


def _process_groups(dist: dict) -> pd.DataFrame:
    configs = [c for c in dist.get("pg_config") or [] if isinstance(c, dict)]
    ranks = [[int(r) for r in c.get("ranks") or []] for c in configs]
    return _groups_frame({
        "pg_name": [str(c.get("pg_name", "")) for c in configs],
        "pg_desc": [str(c.get("pg_desc", "")) for c in configs],
        "backend": [_backend(c.get("backend_config"), dist.get("backend")) for c in configs],
        "size": [int(c.get("pg_size", len(r))) for c, r in zip(configs, ranks, strict=True)],
        "ranks": ranks,
    })


def _groups_frame(columns: dict[str, list]) -> pd.DataFrame:
    return _frame({name: np.array(values, np.int64) if name == "size" else pd.Series(values, dtype=object)
                   for name, values in columns.items()})


def _backend(config: Any, default: Any) -> str:
    """``cuda:nccl`` → ``nccl``; ``cpu:gloo,cuda:gloo`` → ``gloo``; ``cpu:gloo,cuda:nccl`` → ``gloo,nccl``."""
    if not isinstance(config, str) or not config:
        return str(default or "")
    return ",".join(dict.fromkeys(part.rpartition(":")[2] for part in config.split(",")))


_RANK_IN_FILE_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)


def _resolve_rank(dist: dict, rank: int | None, path: Path) -> tuple[int, str]:
    recorded = dist.get("rank")
    if isinstance(recorded, int):
        if rank is not None and rank != recorded:
            warnings.warn(f"{path.name}: distributedInfo says rank {recorded}, not {rank}; using {recorded}",
                          stacklevel=4)
        return recorded, "distributedInfo"
    if rank is not None:
        return int(rank), "argument"
    in_name = _RANK_IN_FILE_NAME.findall(path.name)
    if in_name:
        return int(in_name[-1]), "file name"
    return 0, "default"


# --- cache -----------------------------------------------------------------------------------

_PARQUET_TABLES = ("events", "flows")  # categoricals as codes; their categories, steps, groups and meta in meta.json


def _cache_dirs(path: Path) -> tuple[Path, Path]:
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return path.parent / f"{path.name}.dpro", user / "dpro" / "traces" / hashlib.sha1(str(path).encode()).hexdigest()


def _read_cache(path: Path, key: dict) -> TraceTables | None:
    for folder in _cache_dirs(path):
        try:
            saved = json.loads((folder / "meta.json").read_bytes())
            if saved["key"] != key:
                continue
            events, flows = (_read_parquet(folder / f"{name}.parquet", saved["categories"][name])
                             for name in _PARQUET_TABLES)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        steps = np.array(saved["steps"], np.int64).reshape(-1, 3).T
        steps = _frame(dict(zip(("step", "start_ns", "end_ns"), steps, strict=True)))
        return TraceTables(events, flows, steps, _groups_frame(saved["process_groups"]),
                           {**saved["meta"], "source": str(path)})
    return None


def _read_parquet(file: Path, categories: dict[str, list[str]]) -> pd.DataFrame:
    return _frame({name: _categorical(column.to_numpy(), categories[name]) if name in categories else column.to_numpy()
                   for name, column in pd.read_parquet(file).items()})


def _write_cache(path: Path, key: dict, tables: TraceTables) -> None:
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
    for folder in _cache_dirs(path):
        if folder.parent == path.parent and not _may_write(folder if folder.exists() else path.parent):
            continue
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for name, frame in parquet.items():
                _write_atomically(folder / f"{name}.parquet", frame.to_parquet)
            _write_atomically(folder / "meta.json", lambda file: Path(file).write_bytes(saved))
            return
        except OSError:
            continue


def _write_atomically(target: Path, write: Callable[[Path], Any]) -> None:
    """Write through a temporary file, so that a reader never sees half a file."""
    temporary = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        write(temporary)
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def _may_write(folder: Path) -> bool:
    """Writable, and not marked read-only by its permission bits (which root would ignore)."""
    try:
        return os.access(folder, os.W_OK) and bool(folder.stat().st_mode & 0o222)
    except OSError:
        return False
