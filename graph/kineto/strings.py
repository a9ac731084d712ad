"""Repeated strings as integer codes, and tables built from codes without pyarrow strings."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import repeat
from typing import Any

import numpy as np
import pandas as pd



class Factorizer:
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


def derive(codes: np.ndarray, labels: Iterable[str], fn: Callable[[str], str | None]) -> tuple[np.ndarray, list[str]]:
    """Codes and labels of ``fn(label)`` (None: missing), from codes of labels."""
    out: dict[str, int] = {}
    remap = [-1 if (d := fn(label)) is None else out.setdefault(d, len(out)) for label in labels]
    return np.array(remap + [-1], np.int32)[codes], list(out)


def prefer(a: tuple[np.ndarray, list[str]], b: tuple[np.ndarray, list[str]]) -> tuple[np.ndarray, list[str]]:
    """Codes of ``a`` where present, else of ``b``, over the union of their labels."""
    (a_codes, a_labels), (b_codes, b_labels) = a, b
    index = {label: i for i, label in enumerate(a_labels)}
    remap = np.array([index.setdefault(label, len(index)) for label in b_labels] + [-1], np.int32)
    return np.where(a_codes >= 0, a_codes, remap[b_codes]), list(index)


def int_labels(values: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Codes and labels of non-negative integers written as text (-1: missing)."""
    labels = np.unique(values[values >= 0])
    return np.where(values >= 0, np.searchsorted(labels, values), -1).astype(np.int32), [str(v) for v in labels]


def make_frame(columns: dict[str, Any]) -> pd.DataFrame:
    """A DataFrame of these columns, built without pyarrow strings (their first use costs ~4 MiB)."""
    frame = pd.DataFrame(dict(enumerate(columns.values())), copy=False)
    frame.columns = pd.Index(list(columns), dtype=object)
    return frame


def _categories(labels: list[str]) -> pd.CategoricalDtype:
    return pd.CategoricalDtype(pd.Index(labels, dtype=object))


_NO_CATEGORIES = _categories([])  # the usual dtype of the collective columns, made once


def categorical(codes: np.ndarray, labels: list[str]) -> pd.Categorical:
    dtype = _categories(labels) if labels else _NO_CATEGORIES
    return pd.Categorical.from_codes(codes, dtype=dtype, validate=False)
