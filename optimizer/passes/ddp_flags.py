"""DDP's flags: gradients as views into its buckets (memory), and its static graph.

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
    if layout.gradient_as_bucket_view:
        return Proposals(why="the job keeps its gradients as views into DDP's buckets already")
    return Proposals([{"gradient_as_bucket_view": True}])


def static_graph(analysis: RunAnalysis) -> Proposals:
    """``static_graph`` where the job did not set it (the cost model keeps its step as recorded:
    only a measured trial shows what it gains)."""
    layout = analysis.ddp_layout
    if not layout:
        return Proposals(why="the job used no DistributedDataParallel")
    if layout.static_graph:
        return Proposals(why="the job runs DDP with a static graph already")
    return Proposals([{"static_graph": True}])
