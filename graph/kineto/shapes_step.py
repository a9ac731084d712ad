"""A rank's shapes step (``trace-shapes.json.gz``, recorded with ``record_shapes`` and
``profile_memory``): its ops' input shapes and its allocator's events, decoded once (one read of
the file for both) and cached as msgpack beside the rank's trace tables, so that a second command
on the run decodes nothing.

    >>> step = load_shapes_step(Path("ranks/0/trace-shapes.json.gz"), Path("derived/traces/0"))  # doctest: +SKIP
    >>> step.memory.peaks(), step.input_shapes()[(1234, "aten::mm", 0)]                           # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from dpro.code_hash import code_hash
from dpro.graph.kineto.allocator import MemoryTrace
from dpro.graph.kineto.schema import TraceFormatError, whole_text
from dpro.graph.kineto.shapes import decode_input_shapes
from dpro.run_format import may_write, write_atomically

__all__ = ["ShapesStep", "load_shapes_step"]

CACHE_FILE = "shapes-step.msgpack"


class ShapesStep(msgspec.Struct, frozen=True):
    """What the analyses read from a shapes step: ``shapes``, one ``(thread, name, k, input
    dims as JSON)`` per op (the k-th op of its name on its thread), and ``memory``."""

    shapes: list[tuple[int, str, int, str]]
    memory: MemoryTrace

    def input_shapes(self) -> dict[tuple[int, str, int], str]:
        """``(thread, name, k) -> input dims`` (:func:`dpro.graph.kineto.shapes.input_shapes`)."""
        return {(tid, name, k): dims for tid, name, k, dims in self.shapes}


class _Cached(msgspec.Struct):
    key: dict[str, Any]
    step: ShapesStep


def load_shapes_step(path: Path, cache_dir: Path | None) -> ShapesStep:
    """The shapes step at ``path``, read from ``cache_dir`` where it was cached from this file by
    this code, else decoded (and cached there, where it can be written). ``cache_dir`` None:
    neither read nor written. Raises :class:`TraceFormatError` for an unreadable trace."""
    try:
        stat = path.stat()
    except OSError as e:
        raise TraceFormatError(f"cannot read {path}: {e.strerror}") from None
    key = {"code": code_hash(__name__), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    file = cache_dir / CACHE_FILE if cache_dir is not None else None
    if file is not None:
        try:
            cached = msgspec.msgpack.decode(file.read_bytes(), type=_Cached)
            if cached.key == key:
                return cached.step
        except (OSError, msgspec.DecodeError):
            pass
    step = _decode(path)
    if file is not None and may_write(file.parent):
        encoded = msgspec.msgpack.encode(_Cached(key, step))
        try:
            write_atomically(file, lambda tmp: tmp.write_bytes(encoded))
        except OSError:
            pass  # a cache that cannot be written is only a slower second command
    return step


def _decode(path: Path) -> ShapesStep:
    raw = whole_text(path)
    shapes = decode_input_shapes(raw, path)
    return ShapesStep([(tid, name, k, dims) for (tid, name, k), dims in shapes.items()], MemoryTrace.decode(raw, path))

