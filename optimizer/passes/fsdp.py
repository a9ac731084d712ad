"""FSDP2's ``reshard_after_forward`` (memory against an all-gather per unit) and forward prefetch.

Resharded after forward, each unit frees its gathered parameters and gathers them again before
its backward pass; kept, it holds them from its forward to its backward. The pass proposes the
other setting than the recorded one: the search weighs the step time the cost model predicts
(:func:`dpro.analysis.whatif.predict`, ``reshard_after_forward``) against the memory
:mod:`dpro.optimizer.memory_estimate` estimates, so that ``--memory-budget`` picks resharding where
keeping does not fit.

Forward prefetch issues each unit's all-gather while the units before it run: it pays where the
gather is asynchronous (a GPU's streams, FSDP2's async unshard), which the what-if does not
model yet (it refuses those jobs, and the search notes the strategies as not predicted); on
gloo, where FSDP2 waits for each gather where it issues it, the prediction stays near no
change. The pass proposes 1 and 2 units ahead on a job recorded without it. Larger units
(several blocks under one ``fully_shard``) make fewer, larger collectives: the pass proposes 2
and 4 units as one, a code change. The mesh pass proposes every other ``(replicate, shard)``
shape of the same ranks (HSDP: shards within a host, replicas across hosts; or sharded over
all), which the what-if re-times over the links each group then crosses.
"""

from __future__ import annotations

from dpro.analysis.fsdp import recorded_mesh
from dpro.analysis.run import RunAnalysis
from dpro.replayer.graph_edits import WhatIfError

from dpro.optimizer.passes.base import Proposals


def fsdp_reshard(analysis: RunAnalysis) -> Proposals:
    """The other ``reshard_after_forward`` than the units were recorded with."""
    units = analysis.parallelism.fsdp
    if not units:
        return Proposals(why="the job has no FSDP2 unit")
    recorded = analysis.parallelism.fsdp_reshard
    return Proposals([{"reshard_after_forward": not recorded}])


PREFETCH_DEPTHS = (1, 2)  # units ahead; FSDP2's docs suggest 1 and warn that more holds more memory


def fsdp_prefetch(analysis: RunAnalysis) -> Proposals:
    """Forward prefetch of the next 1 or 2 units, on a job recorded without it."""
    units = analysis.parallelism.fsdp
    if not units:
        return Proposals(why="the job has no FSDP2 unit")
    if len(units) < 2:
        return Proposals(why="the job has one FSDP2 unit: nothing to prefetch")
    if analysis.parallelism.fsdp_forward_prefetch:
        return Proposals(why="the job's units prefetch already (only FSDP2's default is modelled)")
    return Proposals([{"fsdp_forward_prefetch": k} for k in PREFETCH_DEPTHS if k < len(units)])


UNITS_MERGED = (2, 4)


def fsdp_units(analysis: RunAnalysis) -> Proposals:
    """Every 2 or 4 units but the root wrapped as one, where there are that many."""
    units = [u for u in analysis.parallelism.fsdp if u.get("parameters") and not u.get("root")]
    if len(units) < 2:
        return Proposals(why="the job has fewer than two FSDP2 units besides the root")
    return Proposals([{"fsdp_merge_units": g} for g in UNITS_MERGED if g <= len(units)])


def fsdp_mesh(analysis: RunAnalysis) -> Proposals:
    """Every other ``(replicate, shard)`` mesh of the ranks FSDP2 runs over (``R × S`` of them)."""
    if not analysis.parallelism.fsdp:
        return Proposals(why="the job has no FSDP2 unit")
    if analysis.parallelism.tensor_parallel or analysis.parallelism.pipeline is not None:
        return Proposals(why="the job's FSDP2 runs beside tensor or pipeline parallelism (not modelled)")
    try:
        replicate, shard = recorded_mesh(analysis)
    except WhatIfError as e:
        return Proposals(why=str(e))
    world = replicate * shard
    shapes = [(r, world // r) for r in range(1, world + 1) if world % r == 0 and r != replicate]
    return Proposals([{"fsdp_mesh": f"{r}x{s}"} for r, s in shapes])
