"""The memory a strategy needs: each rank's recorded estimate (:mod:`dpro.analysis.memory`)
with what the strategy's settings change.

- ``gradient_as_bucket_view``: the buckets' copy of the gradients is gone.
- ``fp16``/``bf16``: a bucket's compressed copy while it is reduced (half the largest bucket).
- ``powersgd``: the error feedback, a tensor the size of each bucket, kept from step to step,
  and each compressed matrix's factors P and Q (``(rows + columns) × rank`` each, kept for the
  warm start).
- ``activation_checkpointing`` of a list of ``L`` blocks: of what the step adds on top of what
  it holds (taken as activations), ``2 / L`` stays: the blocks' inputs, kept, and one block's
  activations while the backward pass recomputes it. Approximate: a model's activations are
  not all inside its blocks, nor spread evenly over them.
- ``gradient_accumulation`` over ``K`` micro-batches: what the step adds (taken as
  activations) divided by ``K`` (after checkpointing's share, with both). Optimistic: what the
  step adds also holds temporaries and the optimizer's, which do not shrink with ``K``.
- the bucket cap: the buckets hold the same gradients, cut differently; no change.
- ``reshard_after_forward`` (FSDP2) other than recorded: kept after forward, the units' gathered
  parameters stay from their forward to their backward, where resharded at most two are
  gathered at once (the unit at work and the one prefetched): the step's peak grows (or
  shrinks) by the units' unsharded bytes less twice the largest unit's.
"""

from __future__ import annotations

import math
from typing import Any

from dpro.analysis.memory import RankMemory

from dpro.optimizer.passes.checkpointing import block_lists

__all__ = ["strategy_memory_bytes"]

FLOAT_BYTES = 4


def strategy_memory_bytes(settings: dict[str, Any], memory: dict[int, RankMemory],
                          layout: dict[str, Any] | None, units: list[dict[str, Any]] | None = None) -> int | None:
    """The most any rank needs under ``settings``, bytes; None where memory was not measured.
    ``units``: the job's FSDP units (:class:`dpro.analysis.parallelism.Parallelism`), if any."""
    if not memory:
        return None
    return max(_rank_bytes(settings, m, layout or {}) + _reshard_bytes(settings, units or [])
               for m in memory.values())


def _reshard_bytes(settings: dict[str, Any], units: list[dict[str, Any]]) -> int:
    """What ``reshard_after_forward`` adds to a rank's peak (negative: saves), against the units as recorded."""
    reshard = settings.get("reshard_after_forward")
    if reshard is None or not units:
        return 0
    units = [u for u in units if u.get("parameters")]  # a unit of no parameters of its own gathers nothing
    if not units:
        return 0
    inner = [u for u in units if not u.get("root")] or units  # as dpro.analysis.parallelism decides it
    recorded = all(u.get("reshard_after_forward") for u in inner)
    if reshard == recorded:
        return 0
    gathered = [int(u.get("unsharded_bytes") or 0) for u in units]
    kept = max(0, sum(gathered) - 2 * max(gathered))
    return -kept if reshard else kept


def _rank_bytes(settings: dict[str, Any], m: RankMemory, layout: dict[str, Any]) -> int:
    added = m.added_bytes or 0
    blocks = settings.get("activation_checkpointing")
    if blocks:
        count = block_lists(layout).get(blocks, (1, 0))[0]
        added -= round(added * (1 - min(1.0, 2 / count)))
    micro_batches = settings.get("gradient_accumulation")
    if micro_batches:
        added -= round(added * (1 - 1 / micro_batches))
    total = m.held_bytes + added
    if settings.get("gradient_as_bucket_view") and not m.gradient_as_bucket_view:
        total -= m.buckets_bytes
    buckets = [int(b["bytes"]) for b in layout.get("buckets", [])]
    hook = settings.get("comm_hook")
    if hook in ("fp16", "bf16") and buckets:
        total += max(buckets) // 2
    elif hook == "powersgd":
        total += m.buckets_bytes
        rank = int(settings["powersgd_rank"])
        for bucket in layout.get("buckets", []):
            for p in bucket["params"]:
                shape = p["shape"]
                if len(shape) > 1:
                    rows, columns = shape[0], math.prod(shape[1:])
                    total += (rows + columns) * min(rank, rows, columns) * FLOAT_BYTES
    return total
