"""What each rank records about itself: identity, process groups, versions, devices, DDP buckets."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from pathlib import Path
from typing import Any

from dpro.run_format import write_json_atomic

from dpro.collectors.environment import redact_environment
from dpro.collectors import parallel

ENV_NODE = "DPRO_NODE"  # the node's folder name (nodes/<host>-<pid>), set by dpro record: each rank names its node


def rank_and_world_size() -> tuple[int, int]:
    """This process's rank and the world size: from torch.distributed when initialised, else
    from the launcher's environment (``RANK``/``WORLD_SIZE``), else a single process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def process_groups() -> list[dict[str, Any]]:
    """Every process group of the job: name, description, backend, size and global ranks."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return []
    from torch.distributed import distributed_c10d as c10d

    if hasattr(c10d, "_get_all_pg_configs"):
        return [dict(cfg) for cfg in c10d._get_all_pg_configs()]
    world = c10d._world
    return [{"pg_name": world.pg_names[pg], "backend_config": str(world.pg_backend_config.get(pg, "")),
             "pg_size": len(ranks), "ranks": sorted(ranks)}
            for pg, ranks in world.pg_group_ranks.items()]


def versions() -> dict[str, Any]:
    """Versions of Python, torch, CUDA/HIP, cuDNN, NCCL and dpro."""
    import torch

    from dpro import __version__

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
                           "dpro": __version__, "nccl": None, "cudnn": None}
    if torch.cuda.is_available():
        try:
            nccl = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        except Exception:
            pass
        out["cudnn"] = torch.backends.cudnn.version()
    return out


def devices() -> dict[str, Any]:
    """The CPU and the accelerators this process sees, and the one it uses."""
    import torch

    cpu = {"model": _cpu_model(), "logical_cores": os.cpu_count(),
           "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"index": i, "name": p.name, "total_memory_bytes": p.total_memory,
                         "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count,
                         "uuid": str(getattr(p, "uuid", ""))})
    current = torch.cuda.current_device() if gpus else None
    return {"cpu": cpu, "gpus": gpus, "current_gpu": current}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def ddp_layout(ddp: Any) -> dict[str, Any]:
    """The gradient buckets of a DistributedDataParallel module, in the order DDP reduces them:
    for each bucket its size and its parameters (name, shape, elements)."""
    names = {id(p): name for name, p in ddp.module.named_parameters()}
    buckets = []
    for bucket in ddp.reducer._get_zeros_like_grad_buckets():
        buffer = bucket.buffer()
        buckets.append({
            "index": bucket.index(),
            "numel": buffer.numel(),
            "bytes": buffer.numel() * buffer.element_size(),
            "dtype": str(buffer.dtype).removeprefix("torch."),
            "params": [{"name": names.get(id(p), "?"), "shape": list(p.shape), "numel": p.numel()}
                       for p in bucket.parameters()],
        })
    logging = ddp._get_ddp_logging_data()
    per_bucket = per_bucket_caps(ddp)
    return {"module": type(ddp.module).__name__, "bucket_cap_bytes": per_bucket[-1] if per_bucket else ddp.bucket_bytes_cap,
            "first_bucket_bytes_cap": first_bucket_cap(ddp),
            "bucket_cap_bytes_list": per_bucket,
            "find_unused_parameters": ddp.find_unused_parameters,
            "gradient_as_bucket_view": ddp.gradient_as_bucket_view,
            "static_graph": getattr(ddp, "static_graph", False),
            "has_rebuilt_buckets": bool(logging.get("has_rebuilt_buckets", 0)),
            "comm_hook": logging.get("comm_hook") or None,
            "buckets": buckets}


def per_bucket_caps(ddp: Any) -> list[int]:
    """The bytes caps of ``bucket_cap_mb_list`` (the first bucket's, the others'); empty without it."""
    return list(getattr(getattr(ddp, "_bucket_config", None), "per_bucket_bytes_caps", ()))


def first_bucket_cap(ddp: Any) -> int:
    """The bytes cap of DDP's first bucket (recent torch keeps it in ``_bucket_config``; older
    releases always capped it at 1 MiB)."""
    per_bucket = per_bucket_caps(ddp)
    first = per_bucket[0] if per_bucket else getattr(getattr(ddp, "_bucket_config", None), "first_bucket_bytes_cap", None)
    return first if first is not None else 1024 * 1024


def memory(ddp_modules: list[Any], optimizers: list[Any]) -> dict[str, int]:
    """Bytes the step holds throughout: the parameters (the DDP modules', else the optimizers'),
    their gradients (those that require one) and the optimizers' state tensors; of a sharded
    tensor (FSDP2's DTensor), this rank's shard."""
    import torch

    if ddp_modules:
        params = {id(p): p for m in ddp_modules for p in m.module.parameters()}.values()
    else:
        params = {id(p): p for o in optimizers for g in o.param_groups for p in g["params"]}.values()
    state = {id(t): t for o in optimizers for s in o.state.values() for t in s.values() if torch.is_tensor(t)}.values()
    return {"parameters_bytes": sum(_local_bytes(p) for p in params),
            "gradients_bytes": sum(_local_bytes(p) for p in params if p.requires_grad),
            "optimizer_state_bytes": sum(_local_bytes(t) for t in state)}


def _local_bytes(tensor: Any) -> int:
    """Bytes of this rank's part of ``tensor`` (a DTensor's local shard)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def write_rank_metadata(path: Path, profiler_window: dict[str, int], ddp_modules: list[Any],
                        optimizers: list[Any], applied: dict[str, Any] | None = None) -> None:
    """Write this rank's ``meta.json``; ``optimizers``: those that stepped so far; ``applied``:
    what ``dpro record --apply`` did."""
    import torch.distributed as dist

    rank, world_size = rank_and_world_size()
    initialised = dist.is_available() and dist.is_initialized()
    meta: dict[str, Any] = {
        "rank": rank, "world_size": world_size,
        "local_rank": _env_int("LOCAL_RANK"), "local_world_size": _env_int("LOCAL_WORLD_SIZE"),
        "node_rank": _env_int("GROUP_RANK"),
        "host": socket.gethostname(), "node": os.environ.get(ENV_NODE), "pid": os.getpid(),
        "written_ns": time.time_ns(),
        "argv": sys.argv, "backend": dist.get_backend() if initialised else None,
        "process_groups": _section(process_groups), "versions": _section(versions),
        "devices": _section(devices), "profiler_window": profiler_window,
        "ddp": [_section(ddp_layout, m) for m in ddp_modules],
        "memory": _section(memory, ddp_modules, optimizers),
        "parallel": _section(parallel.describe),
        "environment": redact_environment(os.environ),
    }
    if applied is not None:
        meta["applied"] = applied
    write_json_atomic(path, meta, parents=False)


def _section(collect: Any, *args: Any) -> Any:
    """One section of the metadata, or a note of why it could not be collected."""
    try:
        return collect(*args)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value is not None and value.lstrip("-").isdigit() else None
