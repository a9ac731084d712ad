"""The input shapes of the ops of a trace recorded with ``record_shapes`` (``dpro record``'s
shapes step): only the op names, threads and input dims are decoded.

    >>> input_shapes(Path("trace-shapes.json.gz"))[(1234, "aten::mm", 0)]   # doctest: +SKIP
    '[[32, 64], [64, 64]]'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from dpro.graph.kineto.schema import TraceFormatError, whole_text

__all__ = ["decode_input_shapes", "input_shapes"]


class _Args(msgspec.Struct):
    dims: Any = msgspec.field(name="Input Dims", default=None)


class _Op(msgspec.Struct):
    ph: str = ""
    name: str = ""
    tid: int | str = -1
    ts: float = 0.0
    args: _Args | None = None


class _ShapesTrace(msgspec.Struct):
    traceEvents: list[_Op] = []


def input_shapes(path: Path) -> dict[tuple[int, str, int], str]:
    """``(thread, name, k) -> input dims`` (JSON) of the k-th op of each name on each thread."""
    return decode_input_shapes(whole_text(path), path)


def decode_input_shapes(raw: bytes, path: Path) -> dict[tuple[int, str, int], str]:
    """:func:`input_shapes` of the trace whose decompressed JSON is ``raw`` (read from ``path``)."""
    try:
        ops = msgspec.json.decode(raw, type=_ShapesTrace).traceEvents
    except msgspec.DecodeError as e:
        raise TraceFormatError(f"cannot read {path}: {e}") from None
    seen: dict[tuple[int, str], int] = {}
    out = {}
    for op in sorted((o for o in ops if o.ph == "X" and o.args is not None and o.args.dims is not None),
                     key=lambda o: o.ts):
        try:
            key = (int(op.tid), op.name)
        except ValueError:
            continue
        k = seen.get(key, 0)
        seen[key] = k + 1
        out[(*key, k)] = json.dumps(op.args.dims)
    return out
