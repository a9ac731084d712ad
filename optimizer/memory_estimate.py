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
- FSDP2's units (a change of ``reshard_after_forward``, of ``fsdp_merge_units`` ``G``: every
  ``G`` units one, or of ``fsdp_mesh``): the rank's step, cut at FSDP's hooks
  (:attr:`~dpro.analysis.memory.RankMemory.fsdp_stretches`), each stretch moved by what the
  units hold there under the change less as recorded; the new peak is the highest stretch.
  What the units hold (measured with gloo on the CPU, torch 2.13; the root is gathered
  throughout either way): in a unit's forward, the unit (kept gathered: every unit so far;
  after the root's forward, all); as the backward pass begins, the last unit, prefetched (kept
  gathered: all); in a unit's backward, it and the unit before it, prefetched (kept gathered:
  every unit so far); at a unit's reduce, of ``u`` unsharded bytes, its unsharded gradient,
  FSDP's copy of it into the reduce-scatter's input and gloo's own copy of that (``3 u``;
  ``2 u`` on another backend), the reduced shard ``u / S`` (``S`` ranks a shard) and the unit
  before it, prefetched (kept gathered: every unit before it); under HSDP, in a unit's backward
  pass the reduced shards of the units after it, held until the pass ends. Without the
  stretches (a trace of no FSDP hooks), the units' reduces alone, as if the rest of the step
  held the same at each. (A unit's gathered buffer that seemed to stay allocated on some ranks
  after FSDP resharded it was frees the CPU profiler missed: :mod:`dpro.collectors.settled_waits`.)
- ``fsdp_forward_prefetch`` of ``K`` units: where units reshard after forward, the forward pass
  holds ``1 + K`` units gathered at once, against the two the backward pass holds already: the
  peak grows by ``K - 1`` times the largest unit's (group's) unsharded bytes. Kept gathered, the
  units are all gathered by the forward's end anyway: no change.
- ``fsdp_mesh`` of ``R×S``: each rank holds a ``1/S`` shard of the parameters, their gradients
  and the optimizer's state, against the recorded ``1/S0``: those grow by ``S0 / S`` (and the
  backward pass's shards, above). The gathered units and the activations stay.
- ``tp_mesh`` of ``DP×TP``: the parameters sharded over the tensor-parallel dimension, their
  gradients and the optimizer's state for them, ``1/TP`` on each rank against the recorded
  ``1/TP0``: that share of the rank's state grows by ``TP0 / TP``, and so do the step's
  temporaries of a sharded parameter's size held at its peak (a gradient before it is added to
  the parameter's, the buffer of its all-reduce: an allocation of a sharded parameter's local
  bytes, matched one to one). The activations stay (those of the split layers, the attention
  heads and the MLP's hidden units, grow too: an error toward less memory for a smaller ``TP``).
- ``pipeline_microbatches`` and ``pipeline_schedule``: a stage holds the activations of the
  micro-batches it has run forward and not yet backward: all ``M`` under GPipe, at most
  ``stages - stage`` under 1F1B (its warm-up). The activations the stage held when its first
  backward pass began (:class:`~dpro.analysis.memory.RankMemory`, from the shapes step; without
  it, all the step adds) are divided over the micro-batches then in flight and multiplied by
  the new count's, each micro-batch ``recorded M / M`` the size; the rest of the peak (one
  micro-batch's working memory, the loss, the optimizer's temporaries) stays.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from dpro.analysis.fsdp import parse_mesh
from dpro.comm_hooks import CAST_HOOKS, POWERSGD
from dpro.analysis.tensor_parallel import parameter_ratio, parse_tp_mesh
from dpro.analysis.memory import RankMemory
from dpro.analysis.parallelism import Parallelism
from dpro.run_records import DdpLayout
from dpro.replayer.pipeline import in_flight, schedule_name

from dpro.optimizer.passes.checkpointing import job_block_lists

__all__ = ["strategy_memory_bytes"]

FLOAT_BYTES = 4


def strategy_memory_bytes(settings: dict[str, Any], memory: dict[int, RankMemory],
                          layout: DdpLayout | None, parallelism: Parallelism | None = None) -> int | None:
    """The most any rank needs under ``settings``, bytes; None where memory was not measured.
    ``parallelism``: the job's FSDP units and pipeline, if any."""
    if not memory:
        return None
    blocks = job_block_lists(layout, parallelism.fsdp if parallelism else []) or {}
    return max(_rank_bytes(settings, m, layout, blocks) + _fsdp_bytes(settings, m, parallelism)
               + _prefetch_bytes(settings, parallelism)
               + _pipeline_bytes(settings, m, parallelism, rank) + _mesh_bytes(settings, m, parallelism)
               + _tp_bytes(settings, m, parallelism, rank)
               for rank, m in memory.items())


def _tp_bytes(settings: dict[str, Any], m: RankMemory, parallelism: Parallelism | None, rank: int) -> int:
    """What another tensor-parallel degree adds to a rank's sharded state (negative: saves)."""
    shape = settings.get("tp_mesh")
    if not shape or not parallelism or not parallelism.tensor_parallel or not m.parameters_bytes:
        return 0
    sharded = parallelism.sharded_parameters.get(rank, [])
    recorded_tp, tp = int(parallelism.mesh["shape"][-1]), parse_tp_mesh(str(shape))[1]
    ratio = parameter_ratio(m.parameters_bytes, sum(sharded), recorded_tp, tp)
    state = (m.parameters_bytes + m.gradients_bytes + m.optimizer_state_bytes) * (ratio - 1)
    temporaries = min(_sized_like(m.peak_allocations, sharded), m.added_bytes or 0)  # no more than the step added
    return round(state + temporaries * (recorded_tp / tp - 1))


def _sized_like(allocations: tuple[int, ...], sizes: list[int]) -> int:
    """The bytes of ``allocations`` of one of ``sizes``, each size matched at most as often as it is listed."""
    return sum((Counter(allocations) & Counter(sizes)).elements())


def _mesh_bytes(settings: dict[str, Any], m: RankMemory, parallelism: Parallelism | None) -> int:
    """What sharding over another number of ranks adds to a rank's sharded state (negative: saves)."""
    shape = settings.get("fsdp_mesh")
    recorded = parallelism.fsdp_mesh_shape if parallelism else None
    if not shape or not recorded:
        return 0
    shard = parse_mesh(str(shape))[1]
    sharded = m.parameters_bytes + m.gradients_bytes + m.optimizer_state_bytes
    return round(sharded * (recorded[-1] / shard - 1))


def _pipeline_bytes(settings: dict[str, Any], m: RankMemory, parallelism: Parallelism | None, rank: int) -> int:
    """What another micro-batch count or schedule adds to a pipeline stage's peak (negative: saves)."""
    count, schedule = settings.get("pipeline_microbatches"), settings.get("pipeline_schedule")
    pipeline = parallelism.pipeline if parallelism else None
    if (count is None and schedule is None) or not pipeline or rank not in parallelism.stages or not m.added_bytes:
        return 0
    try:
        recorded_schedule = schedule_name(str(pipeline["schedule"]))
    except ValueError:
        return 0
    stage, stages, recorded = parallelism.stages[rank], int(pipeline["num_stages"]), int(pipeline["microbatches"])
    new_count = count or recorded
    held = m.added_bytes if m.pipeline_activation_bytes is None else m.pipeline_activation_bytes
    per_micro_batch = held / in_flight(recorded_schedule, recorded, stage, stages)
    new = per_micro_batch * recorded / new_count * in_flight(schedule or recorded_schedule, new_count, stage, stages)
    return round(new - held)


def _fsdp_bytes(settings: dict[str, Any], m: RankMemory, parallelism: Parallelism | None) -> int:
    """What the settings' FSDP changes add to a rank's peak (negative: saves), against the units
    as recorded (see the module docstring)."""
    reshard, size, shape = (settings.get(k) for k in ("reshard_after_forward", "fsdp_merge_units", "fsdp_mesh"))
    recorded_reshard = parallelism.fsdp_reshard if parallelism else None
    if recorded_reshard is None or (reshard is None and not size and not shape):
        return 0
    recorded_shape = parallelism.fsdp_mesh_shape
    mesh = (1, recorded_shape[0]) if len(recorded_shape) == 1 else tuple(recorded_shape[-2:])
    recorded = _Units([u for u in parallelism.fsdp if u.get("parameters") and not u.get("root")],
                      recorded_reshard, mesh, 1, 3 if _reduces_with_gloo(parallelism, m.device) else 2)
    changed = _Units(recorded.units, recorded_reshard if reshard is None else bool(reshard),
                     parse_mesh(str(shape)) if shape else mesh, size or 1, recorded.copies)
    if not m.fsdp_stretches:  # where the step's memory was not cut at its hooks: at the units' reduces
        reduces = [u["module"] for u in recorded.units]
        return round(max(changed.held("post_backward", u) for u in reduces)
                     - max(recorded.held("post_backward", u) for u in reduces)) if reduces else 0
    top = max(added for *_, added in m.fsdp_stretches)
    return round(max(added - recorded.held(hook, module) + changed.held(hook, module)
                     for hook, module, added in m.fsdp_stretches) - top)


@dataclass(frozen=True)
class _Units:
    """FSDP's units (the root apart, in the recorded order: the modules'), grouped ``group`` at a
    time, and what their gathered parameters and reduces hold at each hook (the module docstring)."""

    units: list[dict[str, Any]]
    reshard: bool
    mesh: tuple[int, int]  # (replicate, shard)
    group: int
    copies: int  # of a unit's unsharded gradient while it is reduced

    @functools.cached_property
    def sizes(self) -> list[int]:
        """The groups' unsharded bytes, in order."""
        each = [int(u.get("unsharded_bytes") or 0) for u in self.units]
        return [sum(each[i:i + self.group]) for i in range(0, len(each), self.group)]

    @functools.cached_property
    def index(self) -> dict[str, int]:
        """Each unit's place among the units, by module."""
        return {u["module"]: i for i, u in reversed(list(enumerate(self.units)))}

    def held(self, hook: str, module: str) -> float:
        """What the units hold in the stretch that ``hook`` of ``module`` opens, bytes."""
        sizes, index = self.sizes, self.index.get(module)
        replicate, shard = self.mesh
        if index is None:  # the root's: before its forward, after it (all units gathered if kept), its backward
            kept = {"post_forward": sum(sizes), "pre_backward": sum(sizes)}.get(hook, 0)
            first = sizes[-1] if hook == "pre_backward" and sizes else 0  # prefetched as the backward begins
            reduced = sum(sizes) / shard if hook == "post_backward" and replicate > 1 else 0
            return (kept if not self.reshard else first) + reduced
        k = index // self.group
        if hook in ("pre_forward", "post_forward"):
            return sum(sizes[:k + 1]) if not self.reshard else sizes[k] if hook == "pre_forward" else 0
        later = sum(sizes[k + 1:]) / shard if replicate > 1 else 0  # HSDP: reduced shards held to the pass's end
        if hook == "pre_backward":  # its gradients being computed; the unit before it prefetched
            return (sum(sizes[:k + 1]) if not self.reshard else sizes[k] + (sizes[k - 1] if k else 0)) + later
        gathered = sum(sizes[:k]) if not self.reshard else (sizes[k - 1] if k else 0)
        return self.copies * sizes[k] + sizes[k] / shard + gathered + later


def _reduces_with_gloo(parallelism: Parallelism, device: str | None) -> bool:
    """Whether the FSDP units' shard group reduces with gloo on the device that holds the model
    (gloo's reduce-scatter copies its input)."""
    kind = (device or "cpu").split(":")[0]
    for unit in parallelism.fsdp:
        backends = parallelism.groups.get(str(unit.get("shard_group")), {}).get("backend") or ""
        for pair in backends.split(","):
            on, _, name = pair.partition(":")
            if on == kind:
                return name == "gloo"
    return kind == "cpu"  # gloo is the CPU's backend where none was recorded


def _prefetch_bytes(settings: dict[str, Any], parallelism: Parallelism | None) -> int:
    """What a forward prefetch of ``K`` units adds to a rank's peak, against none."""
    depth = settings.get("fsdp_forward_prefetch")
    if not depth or not _reshards(settings, parallelism):
        return 0
    largest = sum(_gathered_bytes(parallelism, root=True)[:settings.get("fsdp_merge_units") or 1])  # a group's
    return max(0, depth - 1) * largest


def _reshards(settings: dict[str, Any], parallelism: Parallelism | None) -> bool:
    """Whether the FSDP units reshard after forward under ``settings`` (else as recorded)."""
    reshard = settings.get("reshard_after_forward")
    return parallelism is not None and bool(parallelism.fsdp_reshard if reshard is None else reshard)


def _gathered_bytes(parallelism: Parallelism, root: bool) -> list[int]:
    """The unsharded bytes of the units that hold parameters (the root's too if ``root``), largest first."""
    return sorted((int(u.get("unsharded_bytes") or 0) for u in parallelism.fsdp
                   if u.get("parameters") and (root or not u.get("root"))), reverse=True)


def _rank_bytes(settings: dict[str, Any], m: RankMemory, layout: DdpLayout | None,
                block_lists: dict[str, tuple[int, int]]) -> int:
    added = m.added_bytes or 0
    blocks = settings.get("activation_checkpointing")
    if blocks:
        count = block_lists.get(blocks, (1, 0))[0]
        added -= round(added * (1 - min(1.0, 2 / count)))
    micro_batches = settings.get("gradient_accumulation")
    if micro_batches:
        added -= round(added * (1 - 1 / micro_batches))
    total = m.held_bytes + added
    if settings.get("gradient_as_bucket_view") and not m.gradient_as_bucket_view:
        total -= m.buckets_bytes
    buckets = layout.bucket_bytes if layout else []
    hook = settings.get("comm_hook")
    if hook in CAST_HOOKS and buckets:
        total += max(buckets) // 2
    elif hook == POWERSGD:
        total += m.buckets_bytes
        rank = int(settings["powersgd_rank"])
        for bucket in layout.buckets if layout else ():
            for p in bucket.params:
                shape = p.shape
                if len(shape) > 1:
                    rows, columns = shape[0], math.prod(shape[1:])
                    total += (rows + columns) * min(rank, rows, columns) * FLOAT_BYTES
    return total
