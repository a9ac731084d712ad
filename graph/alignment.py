"""Clock alignment between ranks: recorded offsets, refined with the collectives.

``dpro record`` measures each rank's clock offset against rank 0 (timestamp ping-pongs). A rank
cannot finish an all-reduce, all-gather, reduce-scatter or all-to-all before the last rank has
arrived, so each matched instance of those bounds each rank's offset against the first rank's:
``end_r - start_first`` from above, ``start_r - end_first`` from below. :func:`refine_offsets`
keeps a recorded offset inside every bound (the bounds are only as tight as the collectives are
short) and moves one outside to the nearest bound. Rooted collectives (a broadcast's root may
finish first) and point-to-point transfers are not used.

    >>> refine_offsets(matched_instances, {0: 0, 1: 2_000_000})        # doctest: +SKIP
"""

from __future__ import annotations

import pandas as pd

from dpro.graph.matching import KEY
from dpro.graph.vocabulary import SYMMETRIC_FAMILIES, collective_family

__all__ = ["refine_offsets"]


def refine_offsets(instances: pd.DataFrame, offsets: dict[int, int]) -> dict[int, int]:
    """Offsets (rank -> ns) moved into the bounds the matched ``instances`` set (own clocks)."""
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
        high = offsets[ref] + (both["end_ns"] - both["start_ns_ref"]).min()
        low = offsets[ref] - (both["end_ns_ref"] - both["start_ns"]).min()
        out[int(rank)] = int(min(max(offsets[rank], low), high)) if low <= high else offsets[rank]
    return out
