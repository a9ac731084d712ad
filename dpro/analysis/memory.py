"""Each rank's memory in a step: what it holds throughout and what the step adds at its peak.

- **Held**: the parameters, their gradients, DDP's gradient buckets (a second copy of the
  gradients, unless ``gradient_as_bucket_view``) and the optimizer's state, measured on the
  tensors as the profiling window began (``meta.json`` ``memory``; the buckets from ``ddp``).
- **Added**: the most the step allocated on top of what it began with (activations kept for
  the backward pass, temporaries), from the allocator's events of the step profiled after the
  window (``trace-shapes.json.gz``, recorded with ``profile_memory``).

The estimate is their sum. On the CPU, a free made on a thread the profiler does not follow
is not seen: the shapes step lets gloo's worker thread finish first
(:mod:`dpro.collectors.settled_waits`), and the reader takes out those proven by the address's
reuse (:mod:`dpro.graph.kineto.allocator`). Nor is memory freed by the step that was allocated
before the profiler started, so a job that frees its gradients every step
(``zero_grad(set_to_none=True)``) has them counted twice: the estimate errs high.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dpro.graph.kineto.allocator import MemoryPeak
from dpro.run_format import BACKWARD_EVENT_PREFIX

from dpro.analysis.run import RunAnalysis
from dpro.analysis.stages import BACKWARD_RANGE, PIPELINE_STARTS

__all__ = ["RankMemory", "rank_memory"]


@dataclass(frozen=True)
class RankMemory:
    """One rank's memory, bytes; ``added_bytes`` None where the step's memory was not recorded;
    ``pipeline_activation_bytes``: for a pipeline stage, what the step held when its first
    backward pass began on top of what it held when the pipeline began (the activations of
    the micro-batches then in flight); ``peak_allocations``: the sizes of the step's
    allocations held at its peak, largest first (empty where the trace names no addresses);
    ``fsdp_stretches``: an FSDP job's step cut at its FSDP hooks, each stretch as ``(hook,
    module, added bytes)``, the hook that opens it (``("post_backward", "layers.3")``: that
    unit's reduce; the root's module is ``""``; ``("", "", ...)``: before the first hook) and
    the most the step added in it (empty without FSDP or the step's memory)."""

    parameters_bytes: int
    gradients_bytes: int
    buckets_bytes: int
    gradient_as_bucket_view: bool
    optimizer_state_bytes: int
    added_bytes: int | None
    device: str | None
    pipeline_activation_bytes: int | None = None
    peak_allocations: tuple[int, ...] = ()
    fsdp_stretches: tuple[tuple[str, str, int], ...] = ()

    @property
    def held_bytes(self) -> int:
        buckets = 0 if self.gradient_as_bucket_view else self.buckets_bytes
        return self.parameters_bytes + self.gradients_bytes + buckets + self.optimizer_state_bytes

    @property
    def peak_bytes(self) -> int:
        return self.held_bytes + (self.added_bytes or 0)


def rank_memory(analysis: RunAnalysis) -> dict[int, RankMemory]:
    """:class:`RankMemory` of every rank whose metadata measured its tensors (runs recorded
    before dpro measured memory have none)."""
    found = {}
    for rank, meta in analysis.metas.items():
        held = meta.memory
        if held is None:
            continue
        ddp = [d for d in meta.ddp if d.buckets]
        peak, activations, stretches = _step_memory(analysis, rank)
        found[rank] = RankMemory(
            held.parameters_bytes, held.gradients_bytes, sum(sum(d.bucket_bytes) for d in ddp),
            bool(ddp) and all(d.gradient_as_bucket_view for d in ddp), held.optimizer_state_bytes,
            peak.added_bytes if peak else None, peak.device if peak else None, activations,
            tuple(peak.allocations) if peak else (), stretches)
    return found


PIPELINE_MARKS = {"start": PIPELINE_STARTS,
                  "backward": re.compile(rf"{BACKWARD_RANGE.pattern}|^{re.escape(BACKWARD_EVENT_PREFIX)}")}
"""Where a pipeline stage's step begins its schedule (its split of the batch into micro-batches)
and its first backward pass (torch's ``Backward i`` range under GPipe, else autograd's first function)."""

FSDP_HOOK = re.compile(r"^FSDP::(?:root_)?(pre|post)_(forward|backward)\w*(?: \((.*)\))?$")
"""FSDP2's hooks, by pass and unit (``FSDP::post_backward_reduce (layers.3)``; the root's name no
unit, or ``()``); its collectives' ranges (``FSDP::all_gather (layers.2)``, issued ahead as
prefetches) are not where a pass is."""


def _step_memory(analysis: RunAnalysis, rank: int
                 ) -> tuple[MemoryPeak | None, int | None, tuple[tuple[str, str, int], ...]]:
    """From the rank's shapes step, read once: the peak of the device that holds the model (a
    GPU where the trace has one: the CPU's allocations of a GPU job are its data pipeline's);
    for a pipeline stage, what it held at its first backward pass over what it held at its
    schedule's start (None where either is not in the trace); for an FSDP job, the most it
    added between successive FSDP hooks (:attr:`RankMemory.fsdp_stretches`)."""
    trace = analysis.memory_trace(rank)
    if trace is None:
        return None, None, ()
    peaks = trace.peaks()
    if not peaks:
        return None, None, ()
    gpus = [p for p in peaks if p.device.startswith("cuda")]
    top = max(gpus or peaks, key=lambda p: p.added_bytes)
    activations = None
    if analysis.parallelism.pipeline:
        at = trace.added_before(top.device, PIPELINE_MARKS)
        if at["start"] is not None and at["backward"] is not None:
            activations = max(0, at["backward"] - at["start"])
    stretches: tuple[tuple[str, str, int], ...] = ()
    if analysis.parallelism.fsdp:
        matches = ((FSDP_HOOK.match(name or ""), added) for name, added in trace.stretch_peaks(top.device, FSDP_HOOK))
        stretches = tuple((f"{m.group(1)}_{m.group(2)}", m.group(3) or "", added) if m else ("", "", added)
                          for m, added in matches)
    return top, activations, stretches
