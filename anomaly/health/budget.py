"""The check's time budget (``dpro health --time-budget``): where every rank agrees it has run out.

Each rank counts from the same point (after the ranks joined); asked, all take the longest
time any of them has run, so that they stop a test at the same place and make the same calls.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

__all__ = ["Budget", "slowest"]


class Budget:
    """``seconds`` of checking from now; :meth:`spent` is collective (every rank must call it)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._start = time.monotonic()

    def spent(self, device: torch.device) -> bool:
        """Whether the slowest rank has run ``seconds`` or more."""
        return slowest(time.monotonic() - self._start, device) >= self.seconds

    def cut(self, what: str) -> str:
        """The line a test cut by the budget says."""
        return f"cut: {what}: the check's time budget ({self.seconds:g} s) ran out"


def slowest(value: float, device: torch.device) -> float:
    """``value``'s largest over the ranks (every rank gets it; every rank must call it)."""
    out = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return float(out.item())
