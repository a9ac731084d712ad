"""While the shapes step records memory, each collective's wait pauses briefly after it returns,
so that the communication thread lets go of the collective's tensors first.

gloo runs a collective on a worker thread, which drops its reference to the collective's tensors
(an all-gather's output, a reduce-scatter's copy of its input) just after it finishes, outside
the profiler's reach. Where that drop comes last (the job dropped its own while the worker
thread waited for a core), the tensor is freed unseen: on the CPU torch's total never drops for
it (:mod:`dpro.graph.kineto.allocator`), and the step's peak counts memory it did not hold. A
pause of :data:`SETTLE_S` after each ``Work.wait()`` gives the worker thread a core to finish
on before the job goes on, so the last reference is the job's, dropped where the profiler sees.

Only a job on gloo, and only its shapes step, pays: about 0.2 ms per wait made from Python (every
synchronous collective of ``torch.distributed``, FSDP2's all-gathers and reduce-scatters; DDP
waits in C++ and is untouched; a ``Work`` subclass with its own ``wait`` is not changed). The
shapes step is outside the profiled window and the unprofiled steps: its own row of
``steps.csv`` is the one time that grows.
"""

from __future__ import annotations

import time
from typing import Callable

from dpro.collectors.wrapping import wrap_after

__all__ = ["SETTLE_S", "settle_waits"]

SETTLE_S = 200e-6
"""The pause after a collective's wait returns. On 2 vCPUs running 2 ranks of FSDP2 on gloo, no
shapes step of 26 (13 runs) missed a free with it; without it 10 of 14 did (an address handed
out again with no free seen, or a collective's copy of its input never seen freed)."""


def settle_waits() -> Callable[[], None]:
    """Where the job's default process group runs gloo, make every ``torch.distributed`` work's
    ``wait()`` pause :data:`SETTLE_S` after it returns. The function returned puts ``wait`` back,
    unless something else replaced it since (then it raises, leaving theirs in place); a no-op
    where nothing was changed."""
    try:
        import torch.distributed as dist
        from torch._C._distributed_c10d import Work
    except ImportError:
        return lambda: None
    if not (dist.is_available() and dist.is_initialized() and "gloo" in str(dist.get_backend())):
        return lambda: None
    wait = Work.wait
    settled = wrap_after(Work, "wait", lambda *args: time.sleep(SETTLE_S))

    def unsettle() -> None:
        if Work.__dict__.get("wait") is not settled:
            raise RuntimeError("Work.wait was replaced during the shapes step; left as it is")
        Work.wait = wait

    return unsettle
