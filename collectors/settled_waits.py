"""While the shapes step records memory, each collective's wait pauses briefly after it returns,
so that the communication thread lets go of the collective's tensors first.

gloo runs a collective on a worker thread, which drops its reference to the collective's tensors
(an all-gather's output, a reduce-scatter's copy of its input) just after it finishes, outside
the profiler's reach. Where that drop comes last (the job dropped its own while the worker
thread waited for a core), the tensor is freed unseen: on the CPU torch's total never drops for
it (:mod:`dpro.graph.kineto.allocator`), and the step's peak counts memory it did not hold. A
pause of :data:`SETTLE_S` after each ``Work.wait()`` gives the worker thread a core to finish
on before the job goes on, so the last reference is the job's, dropped where the profiler sees.

Only the shapes step pays, about 0.2 ms per wait the job makes from Python (FSDP2's all-gathers
and reduce-scatters; DDP waits in C++ and is untouched); the job's numbers do not change.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["SETTLE_S", "settle_waits"]

SETTLE_S = 200e-6
"""The pause after a collective's wait returns. On 2 vCPUs running 2 ranks of FSDP2 on gloo, no
shapes step of 26 (13 runs) missed a free with it; without it 10 of 14 did (an address handed
out again with no free seen, or a collective's copy of its input never seen freed)."""


def settle_waits() -> Callable[[], None]:
    """Make every ``torch.distributed`` work's ``wait()`` pause :data:`SETTLE_S` after it returns;
    the function returned puts ``wait`` back (a no-op where torch has no distributed package)."""
    try:
        from torch._C._distributed_c10d import Work
    except ImportError:
        return lambda: None
    wait = Work.wait

    def settled(work, *args, **kwargs):
        done = wait(work, *args, **kwargs)
        time.sleep(SETTLE_S)
        return done

    Work.wait = settled
    return lambda: setattr(Work, "wait", wait)
