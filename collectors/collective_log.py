"""Each collective's process group and each send's peer, for the traces that do not say.

NCCL's events in a trace name their process group; gloo's (every CPU job) name none, and a job
with several groups (FSDP on a 2-D mesh, tensor with data parallel) cannot be matched without
them. Two sources fill the gap, written as the rank's ``collectives.json`` when its profiling
window ends (:func:`dump`):

- ``collectives``: torch's flight recorder, which records every collective the process issues
  (its group, sequence number, profiling name, sizes and the time it was created, on the clock
  the trace uses). ``dpro record`` sizes its ring buffer (:data:`ENV_BUFFER`, unless the job
  set it) so that it holds the window's collectives.
- ``p2p``: the flight recorder leaves out gloo's sends and receives; ``ProcessGroup.send`` and
  ``ProcessGroup.recv`` are wrapped (:func:`install`) to log each one's time, peer (global
  rank), group and bytes in a bounded ring.

A failure here costs the log, never the job.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import time
from pathlib import Path
from typing import Any, Callable

ENV_BUFFER = "TORCH_FR_BUFFER_SIZE"
BUFFER_ENTRIES = 20000
"""Flight recorder entries kept (each a few hundred bytes); torch's default holds 2,000."""
P2P_ENTRIES = 20000

__all__ = ["BUFFER_ENTRIES", "ENV_BUFFER", "dump", "install", "prepare_environment"]

_p2p: collections.deque[tuple[int, str, int, str, int]] = collections.deque(maxlen=P2P_ENTRIES)


def prepare_environment() -> None:
    """Size the flight recorder's ring before any process group exists (the job's own setting wins)."""
    if ENV_BUFFER not in os.environ and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ:
        os.environ[ENV_BUFFER] = str(BUFFER_ENTRIES)


def install(process_group_class: Any) -> None:
    """Log every ``send`` and ``recv`` through ``process_group_class`` (torch's ``ProcessGroup``)."""
    for op in ("send", "recv"):
        original = getattr(process_group_class, op)
        setattr(process_group_class, op, _logged(op, original))


def _logged(op: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def call(group: Any, tensors: Any, peer: int, *args: Any, **kwargs: Any) -> Any:
        try:
            _p2p.append((time.time_ns(), op, _global_rank(group, peer), str(group.group_name),
                         sum(t.numel() * t.element_size() for t in tensors)))
        except Exception:
            pass
        return original(group, tensors, peer, *args, **kwargs)

    call.__name__ = call.__qualname__ = op
    call.__doc__ = original.__doc__
    return call


def _global_rank(group: Any, peer: int) -> int:
    import torch.distributed as dist

    try:
        return int(dist.get_global_rank(group, peer))
    except Exception:  # the default group, or a group this process does not know by name
        return int(peer)


def dump(path: Path, since_ns: int) -> int:
    """Write the collectives and sends created since ``since_ns`` to ``path``; how many."""
    collectives = [c for c in _flight_recorder() if c["created_ns"] >= since_ns]
    p2p = [{"created_ns": t, "op": op, "peer": peer, "pg_name": pg, "nbytes": nbytes}
           for t, op, peer, pg, nbytes in list(_p2p) if t >= since_ns]
    tmp = path.with_name(f".{os.getpid()}.{path.name}")
    tmp.write_text(json.dumps({"collectives": collectives, "p2p": p2p}))
    os.replace(tmp, path)
    return len(collectives) + len(p2p)


def _flight_recorder() -> list[dict[str, Any]]:
    """The flight recorder's entries, oldest first; empty on a torch without one."""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace
    except ImportError:
        return []
    entries = pickle.loads(_dump_fr_trace(True, False, False)).get("entries", [])
    out = []
    for e in entries:
        if e.get("is_p2p"):
            continue
        pg_name, pg_desc = (list(e.get("process_group") or ("", "")) + ["", ""])[:2]
        out.append({"created_ns": int(e["time_created_ns"]), "pg_name": str(pg_name), "pg_desc": str(pg_desc),
                    "seq": int(e.get("collective_seq_id", -1)), "name": str(e.get("profiling_name", "")),
                    "input_sizes": e.get("input_sizes"), "input_dtypes": e.get("input_dtypes")})
    return out
