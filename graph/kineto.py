"""Load one rank's PyTorch profiler (Kineto) Chrome trace into columnar tables.

    >>> from dpro.graph.kineto import load_trace
    >>> tables = load_trace("traces/rank0.json.gz")
    >>> tables.events.groupby("cat", observed=True)["dur_ns"].sum()

:func:`load_trace` returns a :class:`TraceTables`: ``events`` (one row per complete event, the
same columns and dtypes every time, sorted by ``start_ns``), ``flows``, ``steps``,
``process_groups`` and a ``meta`` dict. See :class:`TraceTables` for the schema.

**How it stays fast and small.** The file is gunzipped into one buffer of the right size.
msgspec first splits ``traceEvents`` into raw slices of that buffer without building any
object, then decodes them a batch at a time into typed structs that declare only the fields
used here (every other key is skipped in C), and each batch is turned into numpy columns at
once. Peak memory is therefore about the size of the decompressed JSON, whatever the number of
events. Repeated strings become pandas categoricals.

**Timestamps.** A Chrome trace's ``ts`` and ``dur`` are microseconds whatever its
``displayTimeUnit`` says (that only sets the viewer's display unit). Kineto writes them as
integers of epoch µs (older traces), as decimals of epoch µs with nanosecond digits
(``"ts": 1712195495519689.047``, more significant digits than a float64 holds: those are
re-read from the JSON text so the nanoseconds survive), or as decimals relative to
``baseTimeNanoseconds`` (newer traces). ``start_ns`` is always epoch nanoseconds.

**Rank.** From ``distributedInfo.rank``; else the ``rank`` argument; else the file name
(``rank3``, ``rank-3``, ``rank_3``, ``worker3``); else 0. ``meta["rank_source"]`` says which.

**Cache.** Unless ``cache=False``, the tables are saved as Parquet (plus ``meta.json``) in
``<trace file name>.dpro/`` beside the trace, or, where that folder may not be written, in
``$XDG_CACHE_HOME/dpro/traces/<sha1 of the trace's absolute path>/`` (default ``~/.cache``);
failing both, nothing is cached. A folder counts as not writable when its permission bits deny
writing, even to root, so a read-only data folder is never written to. The next load reads the
cache when the trace's size and mtime, the ``rank`` argument and :data:`LOADER_VERSION` match.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import warnings
import zlib
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable

import msgspec
import numpy as np
import pandas as pd

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
    longer event first, so a parent precedes its children):

    ============== ======== ==============================================================
    rank           int32    the trace's rank (see ``meta["rank_source"]``)
    cat            category ``cpu_op``, ``user_annotation``, ``cuda_runtime``, ``kernel``,
                            ``gpu_memcpy``, ``gpu_memset``, ``gpu_user_annotation``, ...
                            (2021 names such as ``Operator`` or ``Kernel`` are renamed)
    name           category
    pid, tid       int64    process and thread; on the GPU, the device and the stream
    stream         int32    CUDA/HIP stream, -1 on the CPU
    device         int32    GPU index, -1 on the CPU
    start_ns       int64    epoch nanoseconds
    dur_ns         int64
    step           int32    ``N`` of the enclosing ``ProfilerStep#N``, -1 outside any; a GPU
                            event takes the step of its CPU launch (same ``correlation``)
    correlation    int64    CUDA/HIP correlation id, -1 if none
    external_id    int64    -1 if none
    coll_name      category collective (``all_reduce``, ``all_gather``, ``_all_gather_base``,
                            ``all_to_all``, ``broadcast``, ``send_recv``...), from the args or
                            the name (``nccl:*``, ``gloo:*``, ``c10d::*``, NCCL kernels); NaN
                            elsewhere
    pg_name        category process group name, NaN if not given
    pg_desc        category process group description, NaN if not given
    in_nelems      int64    elements in, -1 if not given
    out_nelems     int64    elements out, -1 if not given
    group_size     int32    -1 if not given
    dtype          category element type of the collective, NaN if not given
    seq            int64    collective sequence number, -1 if not given
    ============== ======== ==============================================================

    ``flows``: flow events (``ph`` ``s``/``f``/``t``: ``ac2g`` launch→kernel, ``fwdbwd``...)
    with columns ``cat`` (category), ``flow_id``, ``phase`` (category), ``pid``, ``tid`` and
    ``ts_ns`` (int64), sorted by ``ts_ns``. ``steps``: ``step``, ``start_ns``, ``end_ns``
    (int64) from the CPU ``ProfilerStep#N`` events, sorted; empty if there are none.
    ``process_groups``: ``pg_name``, ``pg_desc``, ``backend`` (str), ``size`` (int64) and
    ``ranks`` (list of int) from ``distributedInfo.pg_config``; empty if absent.
    ``meta``: ``source``, ``trace_name``, ``schema_version``, ``rank``, ``rank_source``,
    ``world_size``, ``backend``, ``nccl_version``, ``pg_count``, ``base_time_ns``,
    ``time_unit`` (the ``displayTimeUnit`` as written), ``span_start_ns``, ``span_end_ns``
    (the profiling window) and ``device_properties``.
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
    path = Path(path).absolute()
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise TraceFormatError(f"trace file not found: {path}") from None
    except OSError as e:
        raise TraceFormatError(f"cannot read {path}: {e.strerror}") from None
    key = {"loader_version": LOADER_VERSION, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
           "rank": rank}
    if cache:
        cached = _read_cache(path, key)
        if cached is not None:
            return cached
    tables = _parse(path, rank)
    if cache:
        _write_cache(path, key, tables)
    return tables


# --- reading and decoding ---------------------------------------------------------------

_Num = int | float | str | None  # numbers as written, tolerating strings ("stream": "0x0" on ROCm)
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


class _TsText(msgspec.Struct, gc=False):
    ts: msgspec.Raw = msgspec.Raw(b"0")


class _TraceFile(msgspec.Struct):
    traceEvents: list[msgspec.Raw] | None = None
    schemaVersion: Any = None
    traceName: Any = None
    displayTimeUnit: Any = None
    baseTimeNanoseconds: int | float | None = None
    deviceProperties: Any = None
    distributedInfo: Any = None
    nodes: msgspec.Raw = msgspec.Raw()  # PyTorch execution traces (Chakra) have nodes instead


_FILE_DECODER = msgspec.json.Decoder(_TraceFile)
_BATCH_DECODER = msgspec.json.Decoder(list[_Event])
_TS_TEXT_DECODER = msgspec.json.Decoder(list[_TsText])
_BATCH = 4096  # events decoded at a time


def _read_json_bytes(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise TraceFormatError(f"not a trace file but a folder: {path}") from None
    except OSError as e:
        raise TraceFormatError(f"cannot read {path}: {e.strerror}") from None
    if data[:2] == b"\x1f\x8b":
        return _gunzip(data, path)
    if path.suffix == ".gz":
        raise TraceFormatError(f"{path} is not gzip-compressed (it does not start with the gzip magic bytes)")
    return data


def _gunzip(data: bytes, path: Path) -> bytes:
    # Sized from the gzip trailer, zlib inflates into one buffer that becomes the result as is.
    size = int.from_bytes(data[-4:], "little")
    try:
        text = zlib.decompress(data, wbits=31, bufsize=max(1, min(size, 1100 * len(data))))
        if len(text) != size:  # several gzip members, or 4 GiB and more
            text = gzip.decompress(data)
    except (zlib.error, EOFError, gzip.BadGzipFile) as e:
        if "truncated" in str(e) or isinstance(e, EOFError):
            raise TraceFormatError(f"{path} is a truncated gzip file (compressed data ends early)") from None
        raise TraceFormatError(f"{path} is not a valid gzip file ({e})") from None
    return text


def _decode_file(buf: bytes, path: Path) -> _TraceFile:
    try:
        head = _FILE_DECODER.decode(buf)
    except msgspec.ValidationError as e:
        raise TraceFormatError(f"{path} is not a Kineto trace: {e}") from None
    except msgspec.DecodeError as e:
        raise TraceFormatError(f"{path} is not valid JSON: {e}") from None
    if head.traceEvents is None:
        if head.nodes:
            raise TraceFormatError(f"{path} is a PyTorch execution trace (Chakra: 'nodes', no "
                                   "'traceEvents'), not a Kineto trace; profile with torch.profiler")
        raise TraceFormatError(f"{path} is not a Kineto trace: it has no 'traceEvents'")
    return head


def _decode_batch(batch: bytes, path: Path, first: int) -> list[_Event]:
    try:
        return _BATCH_DECODER.decode(batch)
    except msgspec.ValidationError as e:
        raise TraceFormatError(f"{path}: unexpected event in traceEvents[{first}:{first + _BATCH}]: {e}") from None


# --- numbers ----------------------------------------------------------------------------

_INT_TEXT = re.compile(r"(-?)(0x[0-9a-f]+|\d+)\s*$", re.IGNORECASE)  # "7", "stream 7", "0x0"
_EXACT_BELOW_US = 2.0 ** 43  # a float64 below this holds a µs decimal to within 0.5 ns


def _to_int(value: Any) -> int:
    """One value as int64, -1 if it is none, not a number or beyond 64 bits."""
    if isinstance(value, str):
        m = _INT_TEXT.search(value)
        if m is None:
            return -1
        value = int(m[2], 16 if m[2][:2].lower() == "0x" else 10) * (-1 if m[1] else 1)
    if isinstance(value, float):
        value = int(value) if abs(value) < 2.0 ** 63 else -1
    return value if isinstance(value, int) and -2 ** 63 <= value < 2 ** 63 else -1


def _ints(items: list, get: Callable[[Any], Any]) -> np.ndarray:
    """``get(item)`` of each item as int64; -1 where that is none, not a number or beyond 64 bits."""
    try:
        return np.fromiter(map(get, items), np.int64, len(items))
    except (TypeError, ValueError, OverflowError):
        values = list(map(get, items))
        as_int = {value: _to_int(value) for value in set(values)}
        return np.fromiter(map(as_int.__getitem__, values), np.int64, len(values))


def _us_to_ns(us: np.ndarray) -> np.ndarray:
    """µs → int64 ns: exact for integers, and for decimals below 2**43 µs."""
    if us.dtype.kind == "i":
        return us * 1000
    us = us.astype(np.float64)
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)


def _ts_ns(events: list[_Event], batch: bytes) -> np.ndarray:
    """The events' ``ts`` in ns, re-read from the JSON text where a float64 would lose ns."""
    us = np.array(list(map(_get_ts, events)))
    if us.dtype.kind == "f" and np.abs(us).max(initial=0) >= _EXACT_BELOW_US:
        return _decimal_us_to_ns(list(map(_get_ts, _TS_TEXT_DECODER.decode(batch))), us)
    return _us_to_ns(us)


def _decimal_us_to_ns(texts: list[msgspec.Raw], approx_us: np.ndarray) -> np.ndarray:
    """Exact ns from the texts of µs numbers: the decimals from the text, the rest from the float.

    The float is within 0.5 µs of the true value, so it pins down the whole µs once the
    text's fraction is known.
    """
    joined = b"\n".join(texts)
    if b"e" in joined or b"E" in joined:  # exponent notation: nothing better than the float
        return _us_to_ns(approx_us)
    buf = np.frombuffer(joined + b"\n\n\n\n", np.uint8).astype(np.int64)
    ends = np.flatnonzero(buf == 10)[:len(texts)]
    starts = np.concatenate(([0], ends[:-1] + 1))
    dots = np.append(np.flatnonzero(buf == 46), len(buf) - 1)
    dot = dots[np.searchsorted(dots, starts)]
    digits = dot < ends
    frac = np.zeros(len(texts), np.int64)
    for i in (1, 2, 3):
        digits &= dot + i < ends
        frac = frac * 10 + np.where(digits, buf[np.minimum(dot + i, len(buf) - 1)] - 48, 0)
    digits &= dot + 4 < ends
    frac += digits & (buf[np.minimum(dot + 4, len(buf) - 1)] >= 53)  # round half up on the 4th decimal
    frac = np.where(buf[starts] == 45, -frac, frac)
    return np.rint(approx_us - frac / 1000).astype(np.int64) * 1000 + frac


# --- strings ----------------------------------------------------------------------------


class _Factorizer:
    """Integer codes for repeated values, consistent across batches; None is -1."""

    def __init__(self) -> None:
        self._codes: dict[Any, int] = {None: -1}
        self.labels: dict[str, int] = {}

    def __call__(self, values: list) -> np.ndarray:
        codes, labels = self._codes, self.labels
        for value in dict.fromkeys(values):
            if value not in codes:
                codes[value] = labels.setdefault(value if isinstance(value, str) else str(value), len(labels))
        return np.fromiter(map(codes.__getitem__, values), np.int32, len(values))


def _derive(codes: np.ndarray, labels: list[str], fn: Callable[[str], str | None]) -> tuple[np.ndarray, list[str]]:
    """Codes and labels of ``fn(label)`` per row (``None`` is missing), from codes of labels."""
    out: dict[str, int] = {}
    remap = [-1 if (d := fn(label)) is None else out.setdefault(d, len(out)) for label in labels]
    return np.array(remap + [-1], np.int32)[codes], list(out)


def _prefer(a: tuple[np.ndarray, list[str]], b: tuple[np.ndarray, list[str]]) -> tuple[np.ndarray, list[str]]:
    """Codes of ``a`` where present, else of ``b``, over the union of their labels."""
    (a_codes, a_labels), (b_codes, b_labels) = a, b
    index = {label: i for i, label in enumerate(a_labels)}
    remap = np.array([index.setdefault(label, len(index)) for label in b_labels] + [-1], np.int32)
    return np.where(a_codes >= 0, a_codes, remap[b_codes]), list(index)


def _int_codes(values: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Codes and labels of non-negative integers as text (-1 is missing)."""
    labels = np.unique(values[values >= 0])
    return np.where(values >= 0, np.searchsorted(labels, values), -1).astype(np.int32), [str(v) for v in labels]


def _categorical(codes: np.ndarray, labels: list[str]) -> pd.Categorical:
    return pd.Categorical.from_codes(codes, categories=pd.Index(labels, dtype="str"), validate=False)


_OLD_CATEGORIES = {"Operator": "cpu_op", "Runtime": "cuda_runtime", "Kernel": "kernel",
                   "Memcpy": "gpu_memcpy", "Memset": "gpu_memset"}
_GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync")
_SPAN_CATEGORY = "trace"  # the "PyTorch Profiler (0)" event spanning the profiling window


def _modern_category(cat: str) -> str:
    return _OLD_CATEGORIES.get(cat) or cat.lower()


# letters-only spelling → the name torch.distributed uses in its nccl:/gloo: annotations
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
    r"^(?:(?:nccl|gloo|ucc|mpi|xccl):(?P<annotation>\w+)"  # nccl:all_reduce, gloo:all_reduce
    r"|c10d::(?P<op>\w+)"  # c10d::allreduce_
    r"|nccl(?:Dev)?Kernel_(?P<kernel>[A-Za-z]+))")  # ncclKernel_AllReduce_..., ncclDevKernel_SendRecv
_STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")


def _canonical_collective(name: str) -> str:
    """``allreduce``, ``AllReduce``, ``all_reduce`` → ``all_reduce``; unknown names lowercased."""
    name = name.strip("_") if name.endswith("_") else name
    return _COLLECTIVES.get(re.sub(r"[^a-z]", "", name.lower()), name.lower())


def _collective_in_name(name: str) -> str | None:
    m = _COLLECTIVE_IN_NAME.match(name)
    if m is None or m["kernel"] == "Generic":  # ncclDevKernel_Generic runs any collective
        return None
    return _canonical_collective(m["annotation"] or m["kernel"] or m["op"].rstrip("_"))


def _step_number(name: str) -> int:
    m = _STEP_NAME.match(name)
    return int(m[1]) if m else -1


# --- batches to columns -----------------------------------------------------------------

_get_ph, _get_cat, _get_name = attrgetter("ph"), attrgetter("cat"), attrgetter("name")
_get_pid, _get_tid, _get_id = attrgetter("pid"), attrgetter("tid"), attrgetter("id")
_get_ts, _get_dur, _get_args = attrgetter("ts"), attrgetter("dur"), attrgetter("args")
_get_external_id, _get_correlation = attrgetter("external_id"), attrgetter("correlation")
# Args of collectives, present on few events: read only where "Collective name" or a group is.
_COMM_INT_ARGS = ("in_nelems", "out_nelems", "group_size", "pg_id", "seq", "seq_lower")
_COMM_TEXT_ARGS = ("coll_name", "dtype", "pg_name", "pg_desc")
_FLOW_PHASES = frozenset("sft")


def _filled(n: int, rows: list[int] | np.ndarray, values: np.ndarray) -> np.ndarray:
    """Length-n column of -1 with ``values`` at ``rows``."""
    column = np.full(n, -1, values.dtype)
    column[rows] = values
    return column


class _Columns:
    """numpy columns of one table, appended a batch at a time."""

    def __init__(self) -> None:
        self._parts: dict[str, list[np.ndarray]] = {}

    def append(self, **columns: np.ndarray) -> None:
        for name, values in columns.items():
            self._parts.setdefault(name, []).append(values)

    def __getitem__(self, name: str) -> np.ndarray:
        parts = self._parts.get(name)
        return np.concatenate(parts) if parts else np.empty(0, np.int64)


class _Collector:
    """Turns decoded batches of events into columns of complete events, flows and instants."""

    def __init__(self) -> None:
        self.events, self.flows, self.instants = _Columns(), _Columns(), _Columns()
        self.text = {name: _Factorizer() for name in ("cat", "name", "flow_cat", "phase") + _COMM_TEXT_ARGS}

    def add(self, events: list[_Event], batch: bytes) -> None:
        ts = _ts_ns(events, batch)
        phases = list(map(_get_ph, events))
        complete = [i for i, ph in enumerate(phases) if ph == "X"]
        flows = [i for i, ph in enumerate(phases) if ph in _FLOW_PHASES]
        self.instants.append(ts_ns=ts[[i for i, ph in enumerate(phases) if ph in ("i", "I")]])
        if complete:
            self._add_complete([events[i] for i in complete], ts[complete])
        if flows:
            fl = [events[i] for i in flows]
            self.flows.append(cat=self.text["flow_cat"](list(map(_get_cat, fl))), flow_id=_ints(fl, _get_id),
                              phase=self.text["phase"]([phases[i] for i in flows]),
                              pid=_ints(fl, _get_pid), tid=_ints(fl, _get_tid), ts_ns=ts[flows])

    def _add_complete(self, events: list[_Event], ts_ns: np.ndarray) -> None:
        n, args = len(events), list(map(_get_args, events))
        cat = self.text["cat"](list(map(_get_cat, events)))
        external_id = _ints(args, _get_external_id)
        old = np.flatnonzero(external_id < 0)  # the 2021 schema spells it "external id" on runtime and GPU events
        external_id[old] = _ints([args[i] for i in old], attrgetter("old_external_id"))
        gpu = np.flatnonzero(self._gpu_categories()[cat])
        gpu_args = [args[i] for i in gpu]
        comm_rows = [i for i, a in enumerate(args) if a.coll_name is not None or a.pg_name is not None
                     or a.pg_id != -1]
        comm = [args[i] for i in comm_rows]
        self.events.append(
            cat=cat, name=self.text["name"](list(map(_get_name, events))),
            pid=_ints(events, _get_pid), tid=_ints(events, _get_tid),
            start_ns=ts_ns, dur_ns=_us_to_ns(np.array(list(map(_get_dur, events)))),
            external_id=external_id, correlation=_ints(args, _get_correlation),
            stream=_filled(n, gpu, _ints(gpu_args, attrgetter("stream"))),
            device=_filled(n, gpu, _ints(gpu_args, attrgetter("device"))),
            **{f: _filled(n, comm_rows, _ints(comm, attrgetter(f))) for f in _COMM_INT_ARGS},
            **{f: _filled(n, comm_rows, self.text[f](list(map(attrgetter(f), comm)))) for f in _COMM_TEXT_ARGS},
        )

    def _gpu_categories(self) -> np.ndarray:
        """Whether each category code so far is a GPU category, with False for code -1."""
        return np.array([_modern_category(c) in _GPU_CATEGORIES for c in self.text["cat"].labels] + [False])


# --- columns to tables ------------------------------------------------------------------


def _parse(path: Path, rank: int | None) -> TraceTables:
    buf = _read_json_bytes(path)
    head = _decode_file(buf, path)
    raw_events, head.traceEvents = head.traceEvents, None
    collector = _Collector()
    for first in range(0, len(raw_events), _BATCH):
        batch = b"[" + b",".join(raw_events[first:first + _BATCH]) + b"]"
        collector.add(_decode_batch(batch, path, first), batch)
    del raw_events, buf

    base_ns = None if head.baseTimeNanoseconds is None else int(head.baseTimeNanoseconds)
    dist = head.distributedInfo if isinstance(head.distributedInfo, dict) else {}
    rank, rank_source = _resolve_rank(dist, rank, path)
    events, steps, span = _events_frame(collector, rank, base_ns or 0)
    meta = {
        "source": str(path), "trace_name": head.traceName, "schema_version": head.schemaVersion,
        "rank": rank, "rank_source": rank_source, "world_size": dist.get("world_size"),
        "backend": dist.get("backend"), "nccl_version": dist.get("nccl_version"),
        "pg_count": dist.get("pg_count"), "base_time_ns": base_ns, "time_unit": head.displayTimeUnit,
        "span_start_ns": span[0], "span_end_ns": span[1],
        "device_properties": head.deviceProperties if isinstance(head.deviceProperties, list) else [],
    }
    return TraceTables(events, _flows_frame(collector, base_ns or 0), steps, _process_groups(dist), meta)


def _events_frame(c: _Collector, rank: int, base_ns: int) -> tuple[pd.DataFrame, pd.DataFrame, tuple]:
    ev, text = c.events, c.text
    cat, cat_labels = _derive(ev["cat"], list(text["cat"].labels), _modern_category)
    start, dur = ev["start_ns"] + base_ns, ev["dur_ns"]
    span = cat == (cat_labels.index(_SPAN_CATEGORY) if _SPAN_CATEGORY in cat_labels else -2)
    instants = c.instants["ts_ns"] + base_ns
    bounds = np.concatenate((start[span], start[span] + dur[span], instants))
    if not len(bounds):
        bounds = np.concatenate((start, start + dur))
    window = (int(bounds.min()), int(bounds.max())) if len(bounds) else (None, None)

    keep = ~span
    order = np.flatnonzero(keep)[np.lexsort((-dur[keep], start[keep]))]
    cat, start, dur = cat[order], start[order], dur[order]
    name_labels = list(text["name"].labels)
    name = ev["name"][order]
    col = {f: ev[f][order] for f in _COMM_INT_ARGS + _COMM_TEXT_ARGS
           + ("pid", "tid", "stream", "device", "correlation", "external_id")}

    gpu = np.isin(cat, [i for i, label in enumerate(cat_labels) if label in _GPU_CATEGORIES])
    stream = np.where(gpu, np.where(col["stream"] >= 0, col["stream"], col["tid"]), -1)
    device = np.where(gpu, np.where(col["device"] >= 0, col["device"], col["pid"]), -1)
    correlation = col["correlation"]
    step_of_name = np.array([_step_number(n) for n in name_labels] + [-1], np.int64)[name]
    is_step = (step_of_name >= 0) & ~gpu
    steps = (pd.DataFrame({"step": step_of_name[is_step], "start_ns": start[is_step],
                           "end_ns": start[is_step] + dur[is_step]})
             .drop_duplicates("step").sort_values("start_ns", kind="stable").reset_index(drop=True))
    step = _step_of(start, gpu, correlation, steps)

    pg = _prefer((col["pg_name"], list(text["pg_name"].labels)), _int_codes(col["pg_id"]))
    coll = _prefer(_derive(col["coll_name"], list(text["coll_name"].labels), _canonical_collective),
                   _derive(name, name_labels, _collective_in_name))

    frame = pd.DataFrame({
        "rank": np.full(len(order), rank, np.int32),
        "cat": _categorical(cat, cat_labels),
        "name": _categorical(name, name_labels),
        "pid": col["pid"], "tid": col["tid"],
        "stream": stream.astype(np.int32), "device": device.astype(np.int32),
        "start_ns": start, "dur_ns": dur, "step": step.astype(np.int32),
        "correlation": correlation,
        "external_id": col["external_id"],
        "coll_name": _categorical(*coll),
        "pg_name": _categorical(*pg),
        "pg_desc": _categorical(col["pg_desc"], list(text["pg_desc"].labels)),
        "in_nelems": col["in_nelems"], "out_nelems": col["out_nelems"],
        "group_size": col["group_size"].astype(np.int32),
        "dtype": _categorical(col["dtype"], list(text["dtype"].labels)),
        "seq": np.where(col["seq"] >= 0, col["seq"], col["seq_lower"]),
    }, copy=False)
    return frame, steps, window


def _step_of(start: np.ndarray, gpu: np.ndarray, correlation: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """Step of each event: the ProfilerStep enclosing its start; on the GPU, its launch's step."""
    step_start, step_end = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    i = np.searchsorted(step_start, start, side="right") - 1
    inside = (i >= 0) & (start < step_end[np.maximum(i, 0)]) if len(steps) else np.zeros(len(start), bool)
    step = np.where(inside, steps["step"].to_numpy()[np.maximum(i, 0)] if len(steps) else -1, -1)
    launches = ~gpu & (correlation >= 0)
    by_corr = np.argsort(correlation[launches], kind="stable")
    launch_corr, launch_step = correlation[launches][by_corr], step[launches][by_corr]
    j = np.minimum(np.searchsorted(launch_corr, correlation), max(len(launch_corr) - 1, 0))
    launched = gpu & (correlation >= 0) & (launch_corr[j] == correlation if len(launch_corr) else False)
    return np.where(launched, launch_step[j] if len(launch_corr) else -1, step)


def _flows_frame(c: _Collector, base_ns: int) -> pd.DataFrame:
    fl = c.flows
    ts = fl["ts_ns"] + base_ns
    order = np.argsort(ts, kind="stable")
    cat, cat_labels = _derive(fl["cat"][order], list(c.text["flow_cat"].labels), _modern_category)
    return pd.DataFrame({
        "cat": _categorical(cat, cat_labels),
        "flow_id": fl["flow_id"][order],
        "phase": _categorical(fl["phase"][order], list(c.text["phase"].labels)),
        "pid": fl["pid"][order], "tid": fl["tid"][order], "ts_ns": ts[order],
    }, copy=False)


def _process_groups(dist: dict) -> pd.DataFrame:
    configs = [c for c in dist.get("pg_config") or [] if isinstance(c, dict)]
    ranks = [[int(r) for r in c.get("ranks") or []] for c in configs]
    return pd.DataFrame({
        "pg_name": pd.Series([str(c.get("pg_name", "")) for c in configs], dtype="str"),
        "pg_desc": pd.Series([str(c.get("pg_desc", "")) for c in configs], dtype="str"),
        "backend": pd.Series([_backend(c.get("backend_config"), dist.get("backend")) for c in configs], dtype="str"),
        "size": np.array([int(c.get("pg_size", len(r))) for c, r in zip(configs, ranks)], np.int64),
        "ranks": pd.Series(ranks, dtype=object),
    })


def _backend(config: Any, default: Any) -> str:
    """``"cuda:nccl"`` → ``nccl``; ``"cpu:gloo,cuda:gloo"`` → ``gloo``; ``"cpu:gloo,cuda:nccl"`` → ``gloo,nccl``."""
    if not isinstance(config, str) or not config:
        return str(default or "")
    return ",".join(dict.fromkeys(part.rpartition(":")[2] for part in config.split(",")))


_RANK_IN_FILE_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)


def _resolve_rank(dist: dict, rank: int | None, path: Path) -> tuple[int, str]:
    recorded = dist.get("rank")
    if isinstance(recorded, int):
        if rank is not None and rank != recorded:
            warnings.warn(f"{path.name}: distributedInfo says rank {recorded}, not {rank}; using {recorded}",
                          stacklevel=3)
        return recorded, "distributedInfo"
    if rank is not None:
        return int(rank), "argument"
    in_name = _RANK_IN_FILE_NAME.findall(path.name)
    if in_name:
        return int(in_name[-1]), "file name"
    return 0, "default"


# --- cache ------------------------------------------------------------------------------

_TABLE_FILES = ("events", "flows")  # as Parquet; steps, process groups and meta go in meta.json


def _cache_dirs(path: Path) -> tuple[Path, Path]:
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return path.parent / f"{path.name}.dpro", user / "dpro" / "traces" / hashlib.sha1(str(path).encode()).hexdigest()


def _read_cache(path: Path, key: dict) -> TraceTables | None:
    for folder in _cache_dirs(path):
        try:
            saved = json.loads((folder / "meta.json").read_bytes())
            if saved["key"] != key:
                continue
            events, flows = (pd.read_parquet(folder / f"{name}.parquet") for name in _TABLE_FILES)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        steps = pd.DataFrame(saved["steps"], columns=["step", "start_ns", "end_ns"]).astype(np.int64)
        groups = saved["process_groups"]
        process_groups = pd.DataFrame({
            "pg_name": pd.Series(groups["pg_name"], dtype="str"), "pg_desc": pd.Series(groups["pg_desc"], dtype="str"),
            "backend": pd.Series(groups["backend"], dtype="str"), "size": np.array(groups["size"], np.int64),
            "ranks": pd.Series(groups["ranks"], dtype=object)})
        return TraceTables(events, flows, steps, process_groups, {**saved["meta"], "source": str(path)})
    return None


def _write_cache(path: Path, key: dict, tables: TraceTables) -> None:
    saved = json.dumps({
        "key": key, "meta": tables.meta, "steps": tables.steps.to_numpy().tolist(),
        "process_groups": {c: tables.process_groups[c].tolist() for c in tables.process_groups},
    }).encode()
    for folder in _cache_dirs(path):
        if not _may_write(folder if folder.exists() else folder.parent) and folder.parent == path.parent:
            continue
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for name, frame in zip(_TABLE_FILES, (tables.events, tables.flows)):
                _replace(folder / f"{name}.parquet", lambda tmp: frame.to_parquet(tmp, index=False))
            _replace(folder / "meta.json", lambda tmp: tmp.write_bytes(saved))
            return
        except OSError:
            continue


def _replace(target: Path, write: Callable[[Path], Any]) -> None:
    """Write through a temporary file so that readers never see half a file."""
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _may_write(folder: Path) -> bool:
    """Writable, and not marked read-only by its permission bits (which root would ignore)."""
    try:
        return os.access(folder, os.W_OK) and bool(folder.stat().st_mode & 0o222)
    except OSError:
        return False
