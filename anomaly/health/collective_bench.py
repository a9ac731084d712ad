"""Collectives over the job's backend at several sizes, scored as nccl-tests does.

For a buffer of ``S`` bytes (nccl-tests' size: the whole buffer, so the output of an all-gather
and the input of a reduce-scatter) and a time ``t`` per operation (the slowest rank's mean over
the timed iterations), the algorithm bandwidth is ``S / t`` and the bus bandwidth, which can be
compared with the links' speed whatever the rank count ``n``, is that times a factor:
``2 (n - 1) / n`` for all-reduce, ``(n - 1) / n`` for all-gather, reduce-scatter and all-to-all,
``1`` for broadcast (nccl-tests, PERFORMANCE.md).

Each size is sized by time, not bytes: its warm-up call is timed, and the timed iterations stop
at ``seconds`` (fewer than ``iterations`` where calls are slow; none where the warm-up took that
long, and the warm-up's time is the finding). A size whose one call would take longer than
``seconds`` at the rate the size before it measured is cut and said so in the check's evidence:
a slow link makes the check no longer, and its rate shows in the smaller sizes. Every rank takes
the slowest rank's times, so all make the same calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from dpro.anomaly.health.budget import Budget, slowest
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
                    device: torch.device, seconds: float = 1.0, budget: Budget | None = None) -> list[Check]:
    """One check per op, its metrics the bus bandwidth (Gb/s) and time per size, each size
    within about ``seconds`` (see the module docstring); a check is skipped when the backend
    does not support its op, or when the check's ``budget`` ran out before it. Every rank must
    call it."""
    n = dist.get_world_size()
    checks = []
    for op in ops:
        check = Check(f"collective.{op}")
        if budget is not None and budget.spent(device):
            checks.append(Check(check.name, "skip", budget.cut(op)))
            continue
        per_byte = None  # the last size's seconds per byte (the slowest rank's)
        for size_mb in sorted(sizes_mb):
            nbytes = int(size_mb * 2**20)
            if per_byte is not None and per_byte * nbytes > seconds:
                check.evidence.setdefault("cut", []).append(
                    f"{size_mb:g} MB: one call would take about {per_byte * nbytes:.1f} s, over its {seconds:g} s")
                continue
            run = _operation(op, nbytes // 4, n, device)
            try:
                per_call, timed = _time(run, iterations, device, seconds)
            except (RuntimeError, NotImplementedError) as e:  # gloo has no reduce_scatter, for one
                reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                checks.append(Check(check.name, "skip", f"not supported by the {dist.get_backend()} backend: {reason}"))
                break
            per_byte = per_call / nbytes
            size = f"{size_mb:g}mb"
            check.evidence.setdefault("timed_calls", {})[size] = timed
            busbw = nbytes / per_call * bus_factor(op, n) * 8 / 1e9
            check.metrics += [Metric(f"busbw_gbps_{size}", busbw, "Gb/s", True),
                              Metric(f"time_ms_{size}", per_call * 1e3, "ms", False)]
        else:
            if check.evidence.get("cut"):
                check.message = "cut " + "; ".join(check.evidence["cut"])
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


def _time(run: Callable[[], None], iterations: int, device: torch.device, seconds: float) -> tuple[float, int]:
    """Seconds per call on the slowest rank and how many calls were timed: up to
    ``iterations`` after one warm-up call, as many as fit in ``seconds`` at the warm-up's
    pace; none where the warm-up took that long (its time is then the answer)."""
    start = time.perf_counter()
    run()
    _sync(device)
    warm = slowest(time.perf_counter() - start, device)
    count = min(iterations, int((seconds - warm) / warm)) if warm > 0 else iterations
    if count < 1:
        return warm, 0
    dist.barrier()
    start = time.perf_counter()
    for _ in range(count):
        run()
    _sync(device)
    return slowest((time.perf_counter() - start) / count, device), count


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
