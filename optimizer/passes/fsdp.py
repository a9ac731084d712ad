"""FSDP2's ``reshard_after_forward``: memory against an all-gather per unit.

Resharded after forward, each unit frees its gathered parameters and gathers them again before
its backward pass; kept, it holds them from its forward to its backward. The pass proposes the
other setting than the recorded one: the search weighs the step time the cost model predicts
(:func:`dpro.analysis.whatif.predict`, ``reshard_after_forward``) against the memory
:mod:`dpro.optimizer.memory` estimates, so that ``--memory-budget`` picks resharding where
keeping does not fit.
"""

from __future__ import annotations

from dpro.analysis.run import RunAnalysis

from dpro.optimizer.passes.base import Proposals


def fsdp_reshard(analysis: RunAnalysis) -> Proposals:
    """The other ``reshard_after_forward`` than the units were recorded with."""
    units = analysis.parallelism.fsdp
    if not units:
        return Proposals(why="the job has no FSDP2 unit")
    recorded = analysis.parallelism.fsdp_reshard
    return Proposals([{"reshard_after_forward": not recorded}])
