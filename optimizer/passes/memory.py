"""Memory: DDP's gradients as views into its buckets.

DDP keeps each gradient twice, in the parameter's ``.grad`` and in its bucket, and copies one
into the other every step; views keep one copy (the gradients' bytes saved on every rank) and
drop the copy. The numerics do not change. The cost model
keeps the step time as recorded (the copy saved is not counted, so the gain errs low). See
:mod:`dpro.optimizer.passes.checkpointing` for activation checkpointing.
"""

from __future__ import annotations

from dpro.analysis.run import RunAnalysis

from dpro.optimizer.passes.base import Proposals


def memory(analysis: RunAnalysis) -> Proposals:
    """``gradient_as_bucket_view`` where the job did not set it."""
    layout = analysis.ddp_layout
    if not layout:
        return Proposals(why="the job used no DistributedDataParallel")
    if layout.get("gradient_as_bucket_view"):
        return Proposals(why="the job keeps its gradients as views into DDP's buckets already")
    return Proposals([{"gradient_as_bucket_view": True}])
