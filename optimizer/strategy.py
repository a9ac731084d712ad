"""A strategy: settings of the job's DDP, what they change in code, and how to predict them.

Settings (the keys of :attr:`Strategy.settings`, those ``dpro record --apply`` sets):

- ``bucket_cap_mb``: DDP's gradient bucket cap (``DistributedDataParallel(bucket_cap_mb=...)``);
- ``first_bucket_mb``: the cap of DDP's first bucket (the gradients ready first), the others
  keeping theirs (``DistributedDataParallel(bucket_cap_mb_list=[first, cap])``, torch 2.13; DDP's
  own first cap is 1 MiB when ``bucket_cap_mb`` is left out and the cap itself when it is given);
- ``comm_hook``: ``fp16`` or ``bf16`` (DDP's compression hooks) or ``powersgd`` with
  ``powersgd_rank`` (``matrix_approximation_rank``; ``start_powerSGD_iter`` 2, from the first
  steps on). Compression changes the numerics: such a strategy is ``lossy``.
- ``gradient_as_bucket_view``: ``True`` makes the gradients views into DDP's buckets
  (``DistributedDataParallel(gradient_as_bucket_view=True)``): one copy of them instead of two,
  and no copy into the buckets. Exact; a script that detaches gradients in place
  (``p.grad.detach_()``, ``requires_grad_()`` on them) fails under it (torch's own caveat).
- ``static_graph``: ``True`` tells DDP the set of gradients and their order do not change
  from step to step (``DistributedDataParallel(static_graph=True)``): it skips searching for
  unused parameters and may re-bucket once. Exact; a job whose graph changes between steps
  fails under it. The cost model keeps the step time as recorded.
- ``activation_checkpointing``: the name of a list of the model's blocks (``"blocks"`` for
  ``model.blocks[0]``, ``model.blocks[1]``, ...) each run under
  ``torch.utils.checkpoint.checkpoint``: the backward pass recomputes their activations instead
  of keeping them. Exact (the same numbers, computed twice); a code change ``--apply`` cannot make.
- ``gradient_accumulation``: ``K`` (2 or more): each step's batch in ``K`` micro-batches, each
  forward and backward pass on one, DDP's ``no_sync`` on all but the last (one all-reduce of
  the summed gradients a step). The same batch, the same numbers (the loss divided by ``K``),
  except for a model whose layers mix the samples of a batch (BatchNorm's statistics). A change
  to the training loop ``--apply`` cannot make.
- ``reshard_after_forward``: FSDP2's setting for every unit (``fully_shard(module,
  reshard_after_forward=...)``): ``True`` frees each unit's gathered parameters after its
  forward and gathers them again before its backward (less memory, one more all-gather per
  unit); ``False`` keeps them. Exact; ``--apply`` sets it.
- ``fsdp_forward_prefetch``: ``K`` (0 or more): each FSDP2 unit prefetches the next ``K`` units'
  parameters in its forward pass (``unit.set_modules_to_forward_prefetch([...])``, the units in
  the order ``fully_shard`` was called on them; the root unit, the first ``K``). Exact;
  ``--apply`` sets it.
- ``fsdp_merge_units``: ``G`` (2 or more): every ``G`` consecutive FSDP2 units but the root
  wrapped as one (``fully_shard([block_i, ..., block_i+G-1])``): fewer, larger all-gathers and
  reduce-scatters. Exact; a change to the script's ``fully_shard`` calls ``--apply`` cannot make.
- ``fsdp_mesh``: ``"RxS"``: FSDP2 over a ``(replicate, shard)`` device mesh of the same ranks
  (``init_device_mesh(..., (R, S), mesh_dim_names=("replicate", "shard"))`` given to every
  ``fully_shard``: HSDP; ``"1xN"``: a 1-D mesh, sharded over all). The same numbers up to the
  order of the gradients' sums; ``--apply`` sets it.
- ``tp_mesh``: ``"DPxTP"``: tensor parallel's ``(dp, tp)`` device mesh of the same ranks
  (``init_device_mesh(..., (DP, TP), mesh_dim_names=("dp", "tp"))``, each block parallelized
  over ``mesh["tp"]`` with the script's plan): the layers split over ``TP`` ranks, the gradients
  averaged over ``DP``. Each replica's batch as the script reads it (the global batch changes
  with ``DP``); a change to the script's mesh ``--apply`` cannot make.
- ``pipeline_microbatches`` and ``pipeline_schedule`` (``gpipe`` or ``1f1b``): a
  ``torch.distributed.pipelining`` schedule's micro-batch count and kind (``ScheduleGPipe(stage,
  n_microbatches=...)`` or ``Schedule1F1B``): the same batch per step, split otherwise. Exact
  (the gradients are summed over the micro-batches either way); ``--apply`` sets both (the
  batch must divide into the micro-batches).
- ``torch_compile``: ``True`` compiles the DDP module with ``torch.compile`` (TorchInductor
  fuses its ops; DDP's optimizer splits the graph at the buckets so that the all-reduces still
  overlap the backward pass). Exact up to float rounding (fused ops round once); a code change
  ``--apply`` cannot make (the module must be compiled after DDP wraps it).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpro.analysis.whatif import Change
from dpro.collectors.apply import CODE_CHANGES
from dpro.comm_hooks import CAST_HOOKS, HOOKS, POWERSGD, compress_flag
from dpro.errors import DproError
from dpro.replayer.pipeline import SCHEDULES

__all__ = ["HOOKS", "SETTINGS", "Strategy", "StrategyError", "read_strategy"]

SETTINGS = ("bucket_cap_mb", "first_bucket_mb", "comm_hook", "powersgd_rank", "gradient_as_bucket_view",
            "static_graph", "activation_checkpointing", "gradient_accumulation", "torch_compile",
            "reshard_after_forward", "fsdp_forward_prefetch", "fsdp_merge_units", "fsdp_mesh", "tp_mesh",
            "pipeline_microbatches", "pipeline_schedule")
DEFAULT_BUCKET_CAP_MB = 25  # DistributedDataParallel's bucket_cap_mb when the script gives none
LOSSY_HOOKS = frozenset(HOOKS)  # every hook DDP ships sends fewer bits than the gradients hold


class StrategyError(DproError, ValueError):
    """A strategy file or settings that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Strategy:
    """A combination of settings (``passes``: the passes that proposed them)."""

    settings: dict[str, Any] = field(default_factory=dict)
    passes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        validate(self.settings)

    @property
    def name(self) -> str:
        """``as-recorded``, or the settings, e.g. ``bucket-cap-50mb+powersgd-2``."""
        parts = []
        if "bucket_cap_mb" in self.settings:
            parts.append(f"bucket-cap-{self.settings['bucket_cap_mb']:g}mb")
        if "first_bucket_mb" in self.settings:
            parts.append(f"first-bucket-{self.settings['first_bucket_mb']:g}mb")
        hook = self.settings.get("comm_hook")
        if hook:
            parts.append(f"{POWERSGD}-{self.settings['powersgd_rank']}" if hook == POWERSGD else hook)
        if self.settings.get("gradient_as_bucket_view"):
            parts.append("grad-as-bucket-view")
        if self.settings.get("static_graph"):
            parts.append("static-graph")
        if self.settings.get("activation_checkpointing"):
            parts.append(f"checkpoint-{self.settings['activation_checkpointing']}")
        if self.settings.get("gradient_accumulation"):
            parts.append(f"accumulate-{self.settings['gradient_accumulation']}")
        if self.settings.get("torch_compile"):
            parts.append("torch-compile")
        reshard = self.settings.get("reshard_after_forward")
        if reshard is not None:
            parts.append("reshard-after-forward" if reshard else "no-reshard-after-forward")
        if self.settings.get("fsdp_forward_prefetch") is not None:
            parts.append(f"forward-prefetch-{self.settings['fsdp_forward_prefetch']}")
        if self.settings.get("fsdp_merge_units"):
            parts.append(f"units-of-{self.settings['fsdp_merge_units']}")
        if self.settings.get("fsdp_mesh"):
            parts.append(f"mesh-{self.settings['fsdp_mesh']}")
        if self.settings.get("tp_mesh"):
            parts.append(f"tp-mesh-{self.settings['tp_mesh']}")
        if self.settings.get("pipeline_microbatches"):
            parts.append(f"microbatches-{self.settings['pipeline_microbatches']}")
        if self.settings.get("pipeline_schedule"):
            parts.append(self.settings["pipeline_schedule"])
        return "+".join(parts) or "as-recorded"

    @property
    def code_change(self) -> bool:
        """Whether the script must be changed by hand: ``dpro record --apply`` cannot set it all."""
        return any(self.settings.get(name) for name in CODE_CHANGES)

    @property
    def lossy(self) -> bool:
        """Whether the strategy changes the numerics (a compression hook)."""
        return self.settings.get("comm_hook") in LOSSY_HOOKS

    def change(self) -> Change:
        """The configuration :func:`dpro.analysis.whatif.predict` predicts."""
        hook = self.settings.get("comm_hook")
        compress = compress_flag(hook, self.settings.get("powersgd_rank")) if hook else None
        return Change(bucket_cap_mb=self.settings.get("bucket_cap_mb"),
                      first_bucket_mb=self.settings.get("first_bucket_mb"), compress=compress,
                      recompute_forward=bool(self.settings.get("activation_checkpointing")) or None,
                      accumulate=self.settings.get("gradient_accumulation"),
                      fuse_ops=self.settings.get("torch_compile"),
                      reshard_after_forward=self.settings.get("reshard_after_forward"),
                      forward_prefetch=self.settings.get("fsdp_forward_prefetch"),
                      merge_units=self.settings.get("fsdp_merge_units"), fsdp_mesh=self.settings.get("fsdp_mesh"),
                      tp_mesh=self.settings.get("tp_mesh"), microbatches=self.settings.get("pipeline_microbatches"),
                      schedule=self.settings.get("pipeline_schedule"))

    def code(self) -> list[str]:
        """The code change that makes the job run this strategy, one line each."""
        lines = []
        arguments = []
        if "bucket_cap_mb" in self.settings:
            arguments.append(f"bucket_cap_mb={self.settings['bucket_cap_mb']:g}")
        if "first_bucket_mb" in self.settings:
            cap = self.settings.get("bucket_cap_mb")
            arguments.append(f"bucket_cap_mb_list=[{self.settings['first_bucket_mb']:g}, "
                             f"{DEFAULT_BUCKET_CAP_MB if cap is None else cap:g}]")
        if self.settings.get("gradient_as_bucket_view"):
            arguments.append("gradient_as_bucket_view=True")
        if self.settings.get("static_graph"):
            arguments.append("static_graph=True")
        if arguments:
            lines.append(f"model = DistributedDataParallel(module, ..., {', '.join(arguments)})")
        if "first_bucket_mb" in self.settings and "bucket_cap_mb" not in self.settings:
            lines.append(f"# bucket_cap_mb_list's second cap: your bucket_cap_mb if you give one ({DEFAULT_BUCKET_CAP_MB} is DDP's default)")
        if self.settings.get("reshard_after_forward") is not None:
            lines.append(f"fully_shard(module, reshard_after_forward={self.settings['reshard_after_forward']})"
                         "  # every unit, the root too")
        if self.settings.get("fsdp_forward_prefetch") is not None:
            k = self.settings["fsdp_forward_prefetch"]
            lines.append(f"units[i].set_modules_to_forward_prefetch(units[i + 1:i + {k + 1}])"
                         "  # units: the fully_shard modules in forward order, the root first")
        if self.settings.get("fsdp_merge_units"):
            g = self.settings["fsdp_merge_units"]
            lines.append(f"for i in range(0, len(blocks), {g}): fully_shard(blocks[i:i + {g}])"
                         "  # a list: one FSDP unit of them all")
        if self.settings.get("fsdp_mesh"):
            r, n = self.settings["fsdp_mesh"].split("x")
            lines.append(f"mesh = init_device_mesh(device_type, ({n},))  # torch.distributed.device_mesh" if r == "1" else
                         f"mesh = init_device_mesh(device_type, ({r}, {n}), mesh_dim_names=(\"replicate\", \"shard\"))"
                         "  # torch.distributed.device_mesh")
            lines.append("fully_shard(module, mesh=mesh)  # every unit, the root too")
        if self.settings.get("tp_mesh"):
            dp, tp = self.settings["tp_mesh"].split("x")
            lines.append(f"mesh = init_device_mesh(device_type, ({dp}, {tp}), mesh_dim_names=(\"dp\", \"tp\"))"
                         "  # torch.distributed.device_mesh")
            lines.append("parallelize_module(block, mesh[\"tp\"], plan)  # every block, the plan as before; "
                         "the gradients averaged over mesh[\"dp\"]")
        m, schedule = self.settings.get("pipeline_microbatches"), self.settings.get("pipeline_schedule")
        if m or schedule:
            cls = SCHEDULES.get(schedule or "", "YourSchedule")
            lines.append(f"schedule = {cls}(stage, n_microbatches={m if m else '...'}, loss_fn=...)"
                         "  # torch.distributed.pipelining")
        if self.settings.get("torch_compile"):
            lines.append("model = torch.compile(model)  # the DistributedDataParallel module, after DDP wraps it")
        hook = self.settings.get("comm_hook")
        if hook in CAST_HOOKS:
            lines += ["from torch.distributed.algorithms.ddp_comm_hooks import default_hooks",
                      f"model.register_comm_hook(None, default_hooks.{hook}_compress_hook)"]
        elif hook == POWERSGD:
            lines += ["from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook",
                      "state = powerSGD_hook.PowerSGDState(process_group=None, "
                      f"matrix_approximation_rank={self.settings['powersgd_rank']}, start_powerSGD_iter=2)",
                      "model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)"]
        blocks = self.settings.get("activation_checkpointing")
        if blocks:
            lines += ["from torch.utils.checkpoint import checkpoint",
                      f"# in the model's forward, each block of self.{blocks}:",
                      "x = checkpoint(block, x, use_reentrant=False)  # instead of x = block(x)"]
        k = self.settings.get("gradient_accumulation")
        if k:
            lines += ["import contextlib",
                      "# in the training loop, instead of one forward and backward pass of the batch:",
                      f"micro_batches = batch.chunk({k})",
                      "for i, micro in enumerate(micro_batches):",
                      "    with model.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext():",
                      "        (loss_fn(model(micro)) / len(micro_batches)).backward()",
                      "optimizer.step()"]
        return lines


def validate(settings: dict[str, Any]) -> None:
    """Raise :class:`StrategyError` for settings ``dpro`` cannot predict or apply."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise StrategyError(f"unknown strategy setting {unknown[0]!r} (known: {', '.join(SETTINGS)})")
    for name in ("bucket_cap_mb", "first_bucket_mb"):
        cap = settings.get(name)
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap < 1e6):
            raise StrategyError(f"{name} must be a positive number of MB, not {cap!r}")
    hook = settings.get("comm_hook")
    if hook is not None and hook not in HOOKS:
        raise StrategyError(f"comm_hook must be one of {', '.join(HOOKS)}, not {hook!r}")
    rank = settings.get("powersgd_rank")
    if (hook == POWERSGD) != (rank is not None):
        raise StrategyError("powersgd_rank goes with comm_hook powersgd, and only with it")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
        raise StrategyError(f"powersgd_rank must be a positive integer, not {rank!r}")
    blocks = settings.get("activation_checkpointing")
    if blocks is not None and not (isinstance(blocks, str) and all(p.isidentifier() for p in blocks.split("."))):
        raise StrategyError(f"activation_checkpointing must name a list of the model's blocks, not {blocks!r}")
    k = settings.get("gradient_accumulation")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 2):
        raise StrategyError(f"gradient_accumulation must be a number of micro-batches of 2 or more, not {k!r}")
    reshard = settings.get("reshard_after_forward")
    if reshard is not None and not isinstance(reshard, bool):
        raise StrategyError(f"reshard_after_forward must be true or false, not {reshard!r}")
    k = settings.get("fsdp_forward_prefetch")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
        raise StrategyError(f"fsdp_forward_prefetch must be a number of units, 0 or more, not {k!r}")
    g = settings.get("fsdp_merge_units")
    if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 2):
        raise StrategyError(f"fsdp_merge_units must be a number of units, 2 or more, not {g!r}")
    shape = settings.get("fsdp_mesh")
    if shape is not None and not (isinstance(shape, str) and re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", shape)):
        raise StrategyError(f"fsdp_mesh must be REPLICATExSHARD (e.g. \"2x2\"), not {shape!r}")
    shape = settings.get("tp_mesh")
    if shape is not None and not (isinstance(shape, str) and re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", shape)):
        raise StrategyError(f"tp_mesh must be DPxTP (e.g. \"4x1\"), not {shape!r}")
    m = settings.get("pipeline_microbatches")
    if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
        raise StrategyError(f"pipeline_microbatches must be a positive number of micro-batches, not {m!r}")
    schedule = settings.get("pipeline_schedule")
    if schedule is not None and schedule not in SCHEDULES:
        raise StrategyError(f"pipeline_schedule must be one of {', '.join(SCHEDULES)}, not {schedule!r}")
    for name in ("gradient_as_bucket_view", "static_graph", "torch_compile"):
        if settings.get(name) is not None and settings[name] is not True:
            raise StrategyError(f"{name} can only be true (the default is false), not {settings[name]!r}")


def read_strategy(path: str | os.PathLike) -> Strategy:
    """The strategy of a ``strategy.json`` that ``dpro optimize -o`` wrote (its ``settings``)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise StrategyError(f"cannot read strategy {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("settings"), dict):
        raise StrategyError(f"{path}: not a strategy file (expected an object with \"settings\")")
    return Strategy(data["settings"], tuple(data.get("passes") or ()))
