"""DDP's gradient buckets, rebuilt for another bucket cap exactly as DDP builds them.

DistributedDataParallel groups parameters into buckets and all-reduces a bucket once all its
gradients are ready (``torch/csrc/distributed/c10d/reducer.cpp``,
``compute_bucket_assignment_by_size``): it walks the parameters in a given order, adds each
to the open bucket of its dtype (and device), and closes that bucket once its bytes reach the
current limit; the first bucket of a dtype closes at ``first_bucket_bytes``, the following ones
at ``bucket_cap_bytes``; buckets still open at the end are closed as they are.

After its first iteration DDP *rebuilds* its buckets this way, walking the parameters in the
order their gradients became ready in that iteration, and keeps the buckets in that order
(:func:`rebuilt_buckets`); these are the buckets of every later step. ``dpro record`` writes the
rebuilt buckets, each with its parameters in that order, so their concatenation is the order
of readiness (:func:`ready_order`). The first bucket's cap is 1 MiB when DDP is left at its
default cap, and the cap itself when ``bucket_cap_mb`` is given (torch 2.13; older releases
always used 1 MiB): :func:`first_bucket_bytes` tells which from a recorded layout.

    >>> p = [Param("a", 300_000, 4), Param("b", 300_000, 4), Param("c", 300_000, 4)]
    >>> [[x.name for x in b] for b in rebuilt_buckets(p, bucket_cap_bytes=2 * 2**20, first_bucket_bytes=2**20)]
    [['a'], ['b', 'c']]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dpro.run_records import DDP_FIRST_BUCKET_BYTES as FIRST_BUCKET_BYTES, DdpLayout

__all__ = ["FIRST_BUCKET_BYTES", "Param", "first_bucket_bytes", "ready_order", "rebuilt_buckets"]


@dataclass(frozen=True)
class Param:
    """A parameter as DDP buckets it: its ``name``, elements and bytes per element; ``dtype``
    and ``device`` keep buckets apart."""

    name: str
    numel: int
    itemsize: int
    dtype: str = "float32"
    device: str = "cpu"
    shape: tuple[int, ...] = ()

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


def _assign(params: Iterable[Param], limits: Sequence[int]) -> list[list[Param]]:
    """Buckets in the order they closed (see the module docstring); ``limits``: the first
    bucket's cap, then every other's."""
    open_: dict[tuple[str, str], tuple[list[Param], int, int]] = {}  # key -> (params, bytes, limit index)
    closed: list[list[Param]] = []
    for p in params:
        key = (p.dtype, p.device)
        members, size, which = open_.get(key, ([], 0, 0))
        members, size = members + [p], size + p.nbytes
        if size >= limits[min(which, len(limits) - 1)]:
            closed.append(members)
            open_[key] = ([], 0, which + 1)
        else:
            open_[key] = (members, size, which)
    closed += [members for members, _, _ in open_.values() if members]
    return closed


def rebuilt_buckets(ready: Sequence[Param], bucket_cap_bytes: int,
                    first_bucket_bytes: int = FIRST_BUCKET_BYTES) -> list[list[Param]]:
    """The buckets DDP rebuilds after its first iteration, walking the parameters in the order
    their gradients became ready (``ready``), in that order."""
    return _assign(ready, [first_bucket_bytes, bucket_cap_bytes])


def first_bucket_bytes(layout: DdpLayout, bucket_cap_bytes: int) -> int:
    """The first bucket's cap DDP would use with ``bucket_cap_bytes``, judged by how the recorded
    layout relates its own first cap to its own cap: equal (an explicit ``bucket_cap_mb``), the
    new cap; else the recorded first cap."""
    recorded_first = layout.first_bucket_bytes_cap
    return bucket_cap_bytes if recorded_first == layout.bucket_cap_bytes else recorded_first


def ready_order(layout: DdpLayout) -> list[Param]:
    """The parameters of a recorded DDP layout in the order their gradients became ready: its
    buckets' parameters, bucket after bucket."""
    params = []
    for bucket in layout.buckets:
        itemsize = bucket.nbytes // max(bucket.numel, 1)
        params += [Param(p.name, p.numel, int(itemsize), bucket.dtype, shape=p.shape) for p in bucket.params]
    return params
