"""Numbers as Kineto writes them: integers that may be text, and µs timestamps read to the ns."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import numpy as np

from dpro.graph.kineto.structs import FLOATS_DECODER, Event


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


def to_ints(values: list) -> np.ndarray:
    """Values as int64; -1 where one is none, not a number or beyond 64 bits."""
    try:
        return np.fromiter(values, np.int64, len(values))
    except (TypeError, ValueError, OverflowError):
        as_int = {value: _to_int(value) for value in set(values)}
        return np.fromiter(map(as_int.__getitem__, values), np.int64, len(values))


def us_to_ns(us: np.ndarray) -> np.ndarray:
    """µs as float64 → int64 ns; exact for whole µs and for decimals below 2**43 µs."""
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)


def ts_ns(events: list[Event]) -> np.ndarray | None:
    """The events' ``ts`` in ns; None if decimals were read into floats too coarse for them."""
    if events and isinstance(events[0].ts, msgspec.Raw):
        return _text_us_to_ns([e.ts for e in events])
    values = [e.ts for e in events]
    us = np.fromiter(values, np.float64, len(values))
    if not len(us) or np.abs(us).max() < _EXACT_BELOW_US:
        return us_to_ns(us)
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
    us = np.fromiter(FLOATS_DECODER.decode(text), np.float64, len(texts))
    if b"e" in text or b"E" in text:  # exponent notation: nothing better than the float
        return us_to_ns(us)
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
