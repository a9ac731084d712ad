"""The trace's JSON text, gunzipped a slice at a time and cut between two events into pieces that
each decode on their own (see :mod:`dpro.graph.kineto`)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec
from isal import isal_zlib as zlib  # zlib's API, inflating 2-3 times faster

from dpro.graph.kineto.collect import Collector
from dpro.graph.kineto.schema import TraceFormatError
from dpro.graph.kineto.structs import EVENTS_DECODER, FILE_DECODER, Event, Header


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


def decode_events(path: Path) -> tuple[dict[str, Any], Collector]:
    """Header fields and the collected events; cut into pieces, or whole if a cut was wrong."""
    try:
        return _decode_pieces(path, cut=True)
    except _BadCut:
        return _decode_pieces(path, cut=False)


def _decode_pieces(path: Path, cut: bool) -> tuple[dict[str, Any], Collector]:
    header: dict[str, Any] = {}
    collector, exact = Collector(), False
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
                  exact: bool) -> list[Event]:
    """The events of one piece (``ts`` as text if ``exact``); its header fields go into ``header``."""
    try:
        if kind == "middle":
            events = EVENTS_DECODER[exact].decode(piece)
        else:
            file = FILE_DECODER[exact].decode(piece)
            header.update((f, getattr(file, f)) for f in Header.__struct_fields__ if getattr(file, f) is not None)
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
