"""The probe steps: a pipeline's passes timed at a second micro-batch count in the same recording.

One recording cannot tell what a pass of a micro-batch costs whatever its size from what it
costs per sample (``dpro whatif --microbatches``). After the shapes step, ``dpro record`` runs
:data:`PROBE_STEPS` more profiled steps of a pipeline job with half its micro-batches:

- step ``switch`` (unprofiled): every rank's schedule takes ``M / 2`` micro-batches, and
  torch prepares its stage again (its buffers are sized by the micro-batch);
- the next :data:`PROBE_STEPS` steps are profiled into ``trace-probe.json.gz``;
- the step after them runs at ``M`` again (prepared again).

The batch, the loss and the gradients are the job's: torch's schedules average the
micro-batches' gradients (``scale_grads``, the default), so the step computes what it would
have, to the floating point's rounding; a script that keeps the ``losses`` list sees ``M / 2``
entries in those steps. Only a job whose every rank has one ``ScheduleGPipe`` or
``Schedule1F1B`` (a single stage) is probed, where ``M`` is even and ``M / 2`` is a count the
schedule takes (1F1B: no fewer than the stages). Every rank decides from what all ranks share
(the schedule and ``M``), so the ranks switch together. ``dpro record --no-probe`` turns it off.
"""

from __future__ import annotations

import gc
import sys
from typing import Any

PROBE_STEPS = 2
ENV_PROBE = "DPRO_PROBE"  # "0": no probe steps (dpro record --no-probe)
SCHEDULES = ("ScheduleGPipe", "Schedule1F1B")

__all__ = ["ENV_PROBE", "PROBE_STEPS", "MicrobatchProbe"]


class MicrobatchProbe:
    """The job's one pipeline schedule, switched to ``count`` micro-batches and back."""

    def __init__(self, schedule: Any, count: int) -> None:
        self.schedule = schedule
        self.count = count
        self.recorded = int(schedule._n_microbatches)

    @classmethod
    def find(cls) -> MicrobatchProbe | None:
        """The probe of the process's pipeline schedule; None where there is no single one of
        torch's single-stage schedules, or its count cannot be halved."""
        module = sys.modules.get("torch.distributed.pipelining.schedules")
        if module is None:
            return None
        classes = tuple(getattr(module, name) for name in SCHEDULES)
        found = [obj for obj in gc.get_objects() if type(obj) in classes]
        if len(found) != 1:
            return None
        schedule = found[0]
        m = int(schedule._n_microbatches)
        least = int(schedule._stage.num_stages) if type(schedule).__name__ == "Schedule1F1B" else 1
        if m % 2 or m // 2 < least:
            return None
        return cls(schedule, m // 2)

    def switch(self) -> None:
        """Run the next steps at :attr:`count` micro-batches."""
        self._set(self.count)

    def restore(self) -> None:
        """Run the next steps at the job's own count again."""
        self._set(self.recorded)

    def _set(self, count: int) -> None:
        s = self.schedule
        s._n_microbatches = count
        s._stage_forward_initialized = False  # torch prepares the stage's buffers for the new size
        s._stage_backward_initialized = False

    def report(self, steps: list[int]) -> dict[str, Any]:
        """What ``probe.json`` says: the probe's steps, its count and the job's."""
        return {"steps": steps, "microbatches": self.count, "recorded_microbatches": self.recorded,
                "schedule": type(self.schedule).__name__}
