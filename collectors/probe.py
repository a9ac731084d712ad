"""The probe steps: a pipeline's passes timed at a second micro-batch count in the same recording.

One recording cannot tell what a pass of a micro-batch costs whatever its size from what it
costs per sample (``dpro whatif --microbatches``). ``dpro record --probe`` runs a pipeline job's
training schedule at half its micro-batches for a few steps after the shapes step:

- its call ``switch`` (the first step after the shapes step): every rank's schedule takes
  ``M / 2`` micro-batches, and torch prepares its stage again (its buffers are sized by the
  micro-batch; in torch's dynamic mode it infers the shapes again with a forward pass, its
  random state forked);
- the next step is the profiler's warm-up, the :data:`PROBE_STEPS` after it are profiled into
  ``trace-probe.json.gz``;
- the call after them runs at ``M`` again (prepared again).

The ranks switch by the schedule's own count of training calls (``step()`` with a loss), which
every rank of a pipeline makes alike, not by their optimizer steps (a skipped step, a stage
without an optimizer). torch's schedules average the micro-batches' gradients (``scale_grads``),
so where the loss averages over a micro-batch's samples and no layer mixes them (batch norm),
the step computes what it would have, to the floating point's rounding; a script that keeps the
``losses`` list sees ``M / 2`` entries in those steps. A schedule is probed only where it is
torch's ``ScheduleGPipe`` or ``Schedule1F1B`` (a single stage a rank), scales its gradients,
infers its shapes at run time (torch's dynamic mode: the stage was given no ``input_args``), and
``M`` is even with ``M / 2`` a count it takes (1F1B: no fewer than the stages): what every rank of
the pipeline shares, so the ranks decide alike.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

PROBE_STEPS = 2
ENV_PROBE = "DPRO_PROBE"  # "1": probe steps (dpro record --probe)
SCHEDULES = ("ScheduleGPipe", "Schedule1F1B")
PRIVATE = ("_n_microbatches", "_stage", "_has_backward", "_stage_forward_initialized", "_stage_backward_initialized",
           "scale_grads")
"""What the probe reads and sets on a schedule (torch 2.13); a schedule without one is not probed."""

__all__ = ["ENV_PROBE", "PROBE_STEPS", "MicrobatchProbe", "count_training_calls"]


def count_training_calls(schedules: Any, on_call: Callable[[Any, int], None]) -> None:
    """Wrap ``step`` of torch's single-stage schedules (the module ``schedules``) so that before
    each training call ``on_call(schedule, n)`` runs, ``n`` that schedule's training calls
    before it; a failure in ``on_call`` is its own to handle."""
    for name in SCHEDULES:
        cls = getattr(schedules, name)
        if not getattr(cls.step, "_dpro_counted", False):
            cls.step = _counted(cls.step, on_call)


def _counted(original: Callable[..., Any], on_call: Callable[[Any, int], None]) -> Callable[..., Any]:
    @functools.wraps(original)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_has_backward", False):
            n = self.__dict__.get("_dpro_training_calls", 0)
            self.__dict__["_dpro_training_calls"] = n + 1
            on_call(self, n)
        return original(self, *args, **kwargs)

    step._dpro_counted = True  # type: ignore[attr-defined]
    return step


class MicrobatchProbe:
    """A pipeline schedule switched to ``count`` micro-batches and back."""

    def __init__(self, schedule: Any, count: int) -> None:
        self.schedule = schedule
        self.count = count
        self.recorded = int(schedule._n_microbatches)
        self.active = False  # whether the schedule runs at ``count`` now

    @classmethod
    def of(cls, schedule: Any) -> MicrobatchProbe | None:
        """The probe of ``schedule``; None where it is not one the probe can switch (see the module docstring)."""
        if type(schedule).__name__ not in SCHEDULES or type(schedule).__module__ != "torch.distributed.pipelining.schedules":
            return None
        if not all(hasattr(schedule, name) for name in PRIVATE) or not schedule.scale_grads:
            return None
        mode = getattr(schedule._stage, "_inference_mode", None)
        if mode is None or getattr(mode, "name", "") != "DYNAMIC":
            return None
        m = int(schedule._n_microbatches)
        least = int(schedule._stage.num_stages) if type(schedule).__name__ == "Schedule1F1B" else 1
        if m % 2 or m // 2 < least:
            return None
        return cls(schedule, m // 2)

    def switch(self) -> None:
        """Run the next calls at :attr:`count` micro-batches."""
        self._set(self.count)
        self.active = True

    def restore(self) -> None:
        """Run the next calls at the job's own count again."""
        self._set(self.recorded)
        self.active = False

    def _set(self, count: int) -> None:
        s = self.schedule
        s._n_microbatches = count
        s._stage_forward_initialized = False  # torch prepares the stage's buffers for the new size
        s._stage_backward_initialized = False

    def report(self, steps: list[int]) -> dict[str, Any]:
        """What ``probe.json`` says: the probe's steps, its count and the job's."""
        return {"steps": steps, "microbatches": self.count, "recorded_microbatches": self.recorded,
                "schedule": type(self.schedule).__name__}
