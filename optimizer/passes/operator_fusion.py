"""Operator fusion: the DDP module compiled with ``torch.compile``.

TorchInductor fuses the ops between the matrix products into single kernels and runs the graph
without the interpreter between ops; the cost model takes each rank's recorded ops and what
fusion would leave of them (:mod:`dpro.analysis.fusion`). A code change: ``--apply`` cannot
make it.
"""

from __future__ import annotations

from dpro.analysis.fusion import compiled_events, fused_shares
from dpro.analysis.run import RunAnalysis

from dpro.optimizer.passes.base import Proposals

__all__ = ["operator_fusion"]


def operator_fusion(analysis: RunAnalysis) -> Proposals:
    """``torch_compile`` for a DDP job not compiled already whose ops fusion would shorten."""
    layout = analysis.ddp_layout
    if not layout:
        return Proposals(why="the job used no DistributedDataParallel")
    ranks = analysis.analysed_ranks
    compiled = compiled_events(analysis, ranks[0])
    if compiled:
        return Proposals(why=f"the job runs compiled already ({compiled} in its trace)")
    if all(fused_shares(analysis, r).chains == 0 for r in ranks):
        return Proposals(why="the recorded forward and backward passes hold no ops fusion would merge")
    return Proposals([{"torch_compile": True}])
