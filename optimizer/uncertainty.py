"""How sure a prediction is: the held-out error of its change's family.

``intervals.json`` beside this file holds, per family of change (bucket cap, first bucket,
fp16, PowerSGD, accumulation...), the 90% interval of the cost model's signed errors
(predicted / measured - 1) on the fidelity benchmark's held-out scoring seed, and the model and
seed they were measured with (written by ``python -m benchmarks.intervals``). A prediction
``p`` of a strategy then stands for a measured step in ``[p / (1 + high), p / (1 + low)]``;
a strategy of several families adds their errors (errs wide). Settings the cost model keeps as
recorded (gradients as bucket views, DDP's static graph) add none; settings no held-out case
has scored (activation checkpointing, ``torch.compile``, FSDP's resharding, a pipeline's
micro-batches and schedule) leave the strategy **unscored**.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from dpro.comm_hooks import POWERSGD
from dpro.optimizer.strategy import Strategy

__all__ = ["Interval", "interval", "intervals_source", "families_of"]

KEPT_AS_RECORDED = ("gradient_as_bucket_view", "static_graph")  # the cost model keeps the step as recorded
UNSCORED = ("activation_checkpointing", "torch_compile", "reshard_after_forward", "fsdp_forward_prefetch",
            "fsdp_merge_units", "fsdp_mesh", "tp_mesh", "pipeline_microbatches", "pipeline_schedule")  # no held-out case in the intervals' table
LOWEST_ERROR = -0.9  # a sum of errors below this would stand for an unbounded step


@dataclass(frozen=True)
class Interval:
    """The measured step (ms) a prediction stands for, 90% of the time on held-out cases."""

    low_ms: float
    high_ms: float
    families: tuple[str, ...]

    def proves_faster_than(self, baseline_ms: float) -> bool:
        """Whether even the interval's slow end is faster than ``baseline_ms``."""
        return self.high_ms < baseline_ms


@cache
def _intervals() -> dict[str, Any]:
    return json.loads(resources.files("dpro.optimizer").joinpath("intervals.json").read_text())


def intervals_source() -> dict[str, Any]:
    """What the intervals were measured with: ``model``, ``commit``, ``seed``, ``quantiles``."""
    data = _intervals()
    return {k: data[k] for k in ("model", "commit", "seed", "quantiles", "made_by")}


def families_of(strategy: Strategy) -> tuple[str, ...] | None:
    """The fidelity benchmark's families a strategy's settings fall in; None: one is unscored."""
    settings = strategy.settings
    if any(settings.get(name) is not None for name in UNSCORED):
        return None
    families = []
    if "bucket_cap_mb" in settings:
        families.append("buckets")
    if "first_bucket_mb" in settings:
        families.append("first bucket")
    hook = settings.get("comm_hook")
    if hook:  # bf16 halves the bytes as fp16 does: fp16's cases stand for it
        families.append(POWERSGD if hook == POWERSGD else "fp16")
    if settings.get("gradient_accumulation"):
        families.append("accumulation")
    return tuple(families)


def interval(strategy: Strategy, predicted_ms: float) -> Interval | None:
    """The interval of ``strategy``'s prediction ``predicted_ms``; None where it is unscored."""
    families = families_of(strategy)
    if families is None:
        return None
    table = _intervals()["families"]
    low = max(sum(table[f]["low_pct"] for f in families) / 100, LOWEST_ERROR)
    high = max(sum(table[f]["high_pct"] for f in families) / 100, LOWEST_ERROR)
    return Interval(predicted_ms / (1 + high), predicted_ms / (1 + low), families)
