"""Gradient accumulation: each step's batch in micro-batches, one all-reduce a step.

The activations kept for the backward pass shrink with the micro-batch (:mod:`dpro.optimizer.memory_estimate`);
every op pays its fixed cost once per micro-batch, and only the last micro-batch's backward pass
overlaps the all-reduces (:func:`dpro.analysis.whatif.predict`, ``accumulate``). It costs time
and saves memory: it wins only under a memory budget, where it competes with checkpointing. A
change to the training loop: ``--apply`` cannot make it.
"""

from __future__ import annotations

from dpro.analysis.run import RunAnalysis

from dpro.optimizer.passes.base import Proposals

__all__ = ["MICRO_BATCHES", "gradient_accumulation"]

MICRO_BATCHES = (2, 4)


def gradient_accumulation(analysis: RunAnalysis) -> Proposals:
    """:data:`MICRO_BATCHES` micro-batches a step, for a job that all-reduces with DDP."""
    layout = analysis.ddp_layout
    if not layout or not layout.buckets:
        return Proposals(why="the job used no DistributedDataParallel (its no_sync is what accumulation needs)")
    return Proposals([{"gradient_accumulation": k} for k in MICRO_BATCHES])
