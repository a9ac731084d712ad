"""Collectives over the job's backend at several sizes, scored as nccl-tests does.

For a buffer of ``S`` bytes (nccl-tests' size: the whole buffer, so the output of an all-gather
and the input of a reduce-scatter) and a time ``t`` per operation (the slowest rank's mean over
the timed iterations), the algorithm bandwidth is ``S / t`` and the bus bandwidth, which can be
compared with the links' speed whatever the rank count ``n``, is that times a factor:
``2 (n - 1) / n`` for all-reduce, ``(n - 1) / n`` for all-gather, reduce-scatter and all-to-all,
``1`` for broadcast (nccl-tests, PERFORMANCE.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from dpro.anomaly.health.model import Check, Metric

__all__ = ["bus_factor", "run_collectives"]


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' factor from algorithm to bus bandwidth for ``op`` on ``n`` ranks."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"no bus bandwidth factor for {op!r}")


def run_collectives(ops: tuple[str, ...], sizes_mb: tuple[float, ...], iterations: int,
                    device: torch.device) -> list[Check]:
    """One check per op, its metrics the bus bandwidth (Gb/s) and time per size; a check is
    skipped when the backend does not support its op. Every rank must call it."""
    n = dist.get_world_size()
    checks = []
    for op in ops:
        check = Check(f"collective.{op}")
        for size_mb in sizes_mb:
            run = _operation(op, int(size_mb * 2**20) // 4, n, device)
            try:
                seconds = _time(run, iterations, device)
            except (RuntimeError, NotImplementedError) as e:  # gloo has no reduce_scatter, for one
                reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                checks.append(Check(check.name, "skip", f"not supported by the {dist.get_backend()} backend: {reason}"))
                break
            size = f"{size_mb:g}mb"
            busbw = int(size_mb * 2**20) / seconds * bus_factor(op, n) * 8 / 1e9
            check.metrics += [Metric(f"busbw_gbps_{size}", busbw, "Gb/s", True),
                              Metric(f"time_ms_{size}", seconds * 1e3, "ms", False)]
        else:
            checks.append(check)
    return checks


def _operation(op: str, elements: int, n: int, device: torch.device) -> Callable[[], None]:
    """A closure running ``op`` once on a buffer of ``elements`` float32 (rounded to ``n``)."""
    elements = max(n, elements - elements % n)
    whole = torch.ones(elements, device=device)
    part = torch.ones(elements // n, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(whole)
    if op == "all_gather":  # all_gather_single: the newer name of all_gather_into_tensor
        gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
        return lambda: gather(whole, part)
    if op == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        return lambda: scatter(part, whole)
    if op == "broadcast":
        return lambda: dist.broadcast(whole, src=0)
    if op == "all_to_all":
        out = torch.empty_like(whole)
        return lambda: dist.all_to_all_single(out, whole)
    raise ValueError(f"unknown collective {op!r}")


def _time(run: Callable[[], None], iterations: int, device: torch.device) -> float:
    """Seconds per call on the slowest rank, after one warm-up call."""
    run()
    _sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        run()
    _sync(device)
    elapsed = torch.tensor([(time.perf_counter() - start) / iterations], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
