"""The tables a trace is loaded into, and the loader's error."""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dpro.errors import DproError




class TraceFormatError(DproError, ValueError):
    """The file cannot be read as a Kineto trace; the message is one line naming the file."""


def whole_text(path: str | os.PathLike, what: str = "") -> bytes:
    """A trace's JSON text, whole (gunzipped for ``.gz``), for the decoders that read all of a small
    trace at once; :class:`TraceFormatError` (``cannot read <what><path>: ...``) when it cannot be read."""
    path = Path(path)
    try:
        return gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise TraceFormatError(f"cannot read {what}{path}: {str(e).splitlines()[0]}") from None


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
