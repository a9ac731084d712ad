"""Clock alignment between ranks: recorded offsets, refined with the collectives.

``dpro record`` measures each rank's clock offset against rank 0 (timestamp ping-pongs). A rank
cannot finish an all-reduce, all-gather, reduce-scatter or all-to-all before the last rank has
arrived, so each matched instance of those bounds each rank's offset against the first rank's:
``end_r - start_first`` from above, ``start_r - end_first`` from below. The bounds are only as
tight as the collectives are short, and a CPU-side range is not always where the work was (gloo's
worker threads, preempted on a loaded machine, open and close their ranges late): one instance's
bounds may miss the true offset and cross another's. :func:`refine_offsets` therefore takes the
offsets inside the most instances' bounds (Marzullo's algorithm; unlike NTP's intersection it
asks for no majority: the largest group of instances that agree stands, even a minority), keeps
a recorded offset inside them and moves one outside to the nearest. Where every instance agrees
this is their intersection. Rooted collectives (a broadcast's root may finish first) and
point-to-point transfers are not used.

    >>> refine_offsets(matched_instances, {0: 0, 1: 2_000_000})        # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpro.graph.matching import KEY
from dpro.graph.vocabulary import SYMMETRIC_FAMILIES, collective_family

__all__ = ["agreed_interval", "refine_offsets"]


def refine_offsets(instances: pd.DataFrame, offsets: dict[int, int]) -> dict[int, int]:
    """Offsets (rank -> ns) moved into the bounds that the most of the matched ``instances``
    (own clocks) agree on (:func:`agreed_interval`)."""
    out = dict(offsets)
    symmetric = instances[instances["coll_name"].map(collective_family).isin(SYMMETRIC_FAMILIES)]
    if symmetric.empty:
        return out
    spans = symmetric.assign(end_ns=symmetric["start_ns"] + symmetric["dur_ns"]).set_index(KEY)
    ref = int(spans["rank"].min())
    first = spans[spans["rank"] == ref][["start_ns", "end_ns"]].add_suffix("_ref")
    for rank, span in spans[spans["rank"] != ref].groupby("rank"):
        both = span[["start_ns", "end_ns"]].join(first, how="inner")
        if both.empty or rank not in out:
            continue
        # start(x) - offset(x) <= end(y) - offset(y) for x, y in {rank, ref}
        high = offsets[ref] + (both["end_ns"] - both["start_ns_ref"]).to_numpy(np.int64)
        low = offsets[ref] - (both["end_ns_ref"] - both["start_ns"]).to_numpy(np.int64)
        lo, hi = agreed_interval(low, high, offsets[rank])
        out[int(rank)] = int(min(max(offsets[rank], lo), hi))
    return out


def agreed_interval(low: np.ndarray, high: np.ndarray, near: int) -> tuple[int, int]:
    """The interval inside the most of the closed intervals ``[low_i, high_i]`` (Marzullo's
    algorithm; intervals that only touch agree at that point); of several such, the one nearest
    ``near`` (the lower at an equal distance). At least one interval, each with ``low <= high``."""
    points = np.concatenate([low, high])
    step = np.concatenate([np.ones(len(low), np.int64), -np.ones(len(high), np.int64)])
    order = np.lexsort((-step, points))  # at a tie an interval opens before another closes
    points, inside = points[order], np.cumsum(step[order])
    best = np.flatnonzero(inside == inside.max())  # each opens a best interval, closed by the next point
    starts, ends = points[best], points[best + 1]
    distance = np.maximum(starts - near, 0) + np.maximum(near - ends, 0)
    pick = int(np.argmin(distance))
    return int(starts[pick]), int(ends[pick])
