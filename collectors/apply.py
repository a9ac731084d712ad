"""A strategy's settings applied inside the job, without changing the script (``dpro record --apply``).

``dpro record`` passes the settings in :data:`ENV_APPLY` (JSON, validated by the command):

- ``bucket_cap_mb``, ``gradient_as_bucket_view``, ``static_graph``: every
  ``DistributedDataParallel`` is built with this bucket cap, with gradients as views into its
  buckets, with a static graph, whatever the script passed;
- ``first_bucket_mb``: every ``DistributedDataParallel`` is built with
  ``bucket_cap_mb_list=[first, cap]`` (torch 2.13; left out on a torch without it), ``cap`` the
  strategy's bucket cap, else the script's, else DDP's default; if DDP refuses the list (under
  compiled autograd's python reducer) the module is built with the script's arguments;
- ``comm_hook`` (``fp16``, ``bf16``, ``powersgd`` with ``powersgd_rank``): registered on every
  ``DistributedDataParallel`` as its first forward pass begins, unless the script (or torch,
  for a fused optimizer) registered a hook already: DDP takes one, and the script's stays. A
  hook DDP refuses (bf16 without CUDA and NCCL) is left out too, as is PowerSGD on gloo with more
  than one bucket (its callbacks issue all-reduces in an order the ranks do not share, and the
  job fails); the job runs without it.
- ``reshard_after_forward``: every ``fully_shard`` (FSDP2) call of the job made with it,
  whatever the script passed (``torch.distributed.fsdp.fully_shard`` is wrapped before the
  script imports it);
- ``fsdp_forward_prefetch``: after each ``fully_shard`` call, every unit so far prefetches the
  next ``K`` units in its forward pass (``set_modules_to_forward_prefetch``), the units in forward
  order as FSDP2 wraps them, bottom-up: each in the order it was wrapped, a unit before the
  units it holds (the root first);
- ``fsdp_mesh`` (``"RxS"``): every ``fully_shard`` call made over one ``(replicate, shard)``
  device mesh of ``R × S`` ranks (HSDP; ``1xN``: sharded over all), built at the first call
  (``init_device_mesh``, on the device type of the module's parameters), whatever mesh the
  script passed; where the job's world size is not ``R × S``, the script's is kept, and said;
- ``pipeline_microbatches`` and ``pipeline_schedule``: every ``ScheduleGPipe`` or
  ``Schedule1F1B`` the script builds from ``torch.distributed.pipelining`` is built with this
  micro-batch count and as this schedule (the names are replaced before the script imports
  them; a script that imports them from ``torch.distributed.pipelining.schedules`` keeps its own);
- ``activation_checkpointing``, ``gradient_accumulation``, ``torch_compile`` and
  ``fsdp_merge_units`` need a change to the model's code, the training loop or its
  ``fully_shard`` calls (the strategy's ``code``): they are left out, and
  said so.

What was applied and what was left out goes to the rank's ``meta.json`` (``applied``). A
failure here is logged and the job goes on as the script wrote it.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import weakref
from typing import Any, Callable

from dpro.collectors.metadata import first_bucket_cap
from dpro.comm_hooks import POWERSGD

ENV_APPLY = "DPRO_APPLY"
CONSTRUCTOR_SETTINGS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph")  # DistributedDataParallel's arguments
CODE_CHANGES = {"activation_checkpointing": "a change to the model's code",
                "gradient_accumulation": "a change to the training loop",
                "torch_compile": "the DDP module compiled in the script",
                "fsdp_merge_units": "a change to the script's fully_shard calls",
                "tp_mesh": "a change to the script's device mesh"}
"""Settings ``--apply`` leaves out, and why: they need the script changed (the strategy's ``code``)."""

_SCHEDULE_ARGS = ("n_microbatches", "loss_fn", "args_chunk_spec", "kwargs_chunk_spec", "output_merge_spec", "scale_grads")
"""The arguments of ``PipelineScheduleSingle`` after the stage, in order (torch 2.13)."""

__all__ = ["CODE_CHANGES", "ENV_APPLY", "Applier", "from_environment"]


def from_environment() -> "Applier | None":
    """The settings ``dpro record --apply`` passed, if any."""
    text = os.environ.get(ENV_APPLY)
    return Applier(json.loads(text)) if text else None


class Applier:
    """Applies ``settings`` to every DistributedDataParallel module of the process."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = dict(settings)
        self.applied: list[str] = []
        self.left_out: list[str] = []
        for name, why in CODE_CHANGES.items():
            value = self.settings.get(name)
            if value:
                shown = "true" if value is True else value
                self.left_out.append(f"{name}={shown} ({why}: see the strategy's code)")
        self._hooked: weakref.WeakSet[Any] = weakref.WeakSet()  # the modules whose hook was decided

    def report(self) -> dict[str, Any]:
        """``{"settings", "applied", "left_out"}`` for the rank's metadata."""
        return {"settings": self.settings, "applied": list(self.applied), "left_out": list(self.left_out)}

    def install(self, ddp_class: Any, log_error: Callable[[str, BaseException], None]) -> None:
        """Wrap ``ddp_class``'s constructor (its arguments) and ``forward`` (the hook)."""
        construct, forward = ddp_class.__init__, ddp_class.forward
        signature = inspect.signature(construct)
        applier = self

        @functools.wraps(construct)
        def init(module: Any, *args: Any, **kwargs: Any) -> None:
            new_args, new_kwargs, notes = applier._with_arguments(signature, module, args, kwargs, log_error)
            if not notes:
                construct(module, *args, **kwargs)
                return
            try:
                construct(module, *new_args, **new_kwargs)
            except AssertionError as e:  # bucket_cap_mb_list refused (compiled autograd's python reducer), before
                if "bucket_cap_mb_list" not in str(e):  # any collective: the script's arguments; anything else is DDP's
                    raise
                applier.left_out.extend(f"{note}: {str(e).splitlines()[0][:200]}" for note in notes)
                log_error("applying the strategy's DistributedDataParallel arguments", e)
                construct(module, *args, **kwargs)
                return
            applier.applied.extend(notes)

        @functools.wraps(forward)
        def first_forward(module: Any, *args: Any, **kwargs: Any) -> Any:
            if module not in applier._hooked:
                applier._hooked.add(module)
                try:
                    applier._register_hook(module)
                except Exception as e:  # DDP refuses it: the job runs without
                    applier.left_out.append(f"comm_hook={applier.settings['comm_hook']}: {type(e).__name__}: "
                                            + str(e).splitlines()[0][:200])
                    log_error("applying the strategy's communication hook", e)
            return forward(module, *args, **kwargs)

        ddp_class.__init__ = init
        if self.settings.get("comm_hook"):
            ddp_class.forward = first_forward

    def install_fsdp(self, log_error: Callable[[str, BaseException], None]) -> None:
        """Wrap FSDP2's ``fully_shard`` so that every unit takes the strategy's
        ``reshard_after_forward`` and forward prefetch (only when the strategy sets one: the
        import is not free)."""
        reshard, depth = self.settings.get("reshard_after_forward"), self.settings.get("fsdp_forward_prefetch")
        shape = self.settings.get("fsdp_mesh")
        if reshard is None and depth is None and shape is None:
            return
        import torch.distributed.fsdp as fsdp
        from torch.distributed.fsdp import _fully_shard

        original = fsdp.fully_shard
        applier = self
        units: list[Any] = []  # in forward order: a parent before the units it holds (FSDP2 wraps bottom-up)
        meshes: list[Any] = []  # the strategy's, once built

        @functools.wraps(original)
        def fully_shard(module: Any, *args: Any, **kwargs: Any) -> Any:
            if shape is not None:
                if not meshes:
                    try:
                        meshes.append(_device_mesh(module, str(shape)))
                    except Exception as e:  # the job runs on the script's mesh
                        meshes.append(None)
                        applier.left_out.append(f"fsdp_mesh={shape} ({str(e).splitlines()[0] if str(e) else e!r})")
                        log_error(f"building FSDP2's {shape} mesh", e)
                if meshes[0] is not None:
                    applier._note(f"fsdp_mesh={shape}" + (" (the script's own mesh replaced)" if kwargs.get("mesh")
                                                          is not None else ""))
                    kwargs["mesh"] = meshes[0]
            if reshard is not None:
                before = kwargs.get("reshard_after_forward")
                kwargs["reshard_after_forward"] = bool(reshard)
                applier._note(f"reshard_after_forward={_shown(bool(reshard))}"
                              + ("" if before is None else f" (the script's {_shown(before)})"))
            unit = original(module, *args, **kwargs)
            if depth is not None:
                try:
                    if _prefetch_forward(units, unit, int(depth)):
                        applier._note(f"forward prefetch of the next {depth} unit(s)")
                except Exception as e:  # the job runs with FSDP2's own prefetching
                    log_error("setting FSDP2's forward prefetch", e)
            return unit

        fsdp.fully_shard = fully_shard
        if getattr(_fully_shard, "fully_shard", None) is original:
            _fully_shard.fully_shard = fully_shard

    def _note(self, note: str) -> None:
        if note not in self.applied:
            self.applied.append(note)

    def install_pipeline(self) -> None:
        """Replace ``torch.distributed.pipelining``'s ``ScheduleGPipe`` and ``Schedule1F1B`` with
        builders of the strategy's schedule and micro-batch count (only when the strategy sets
        one: the import is not free). The builders are functions: a script that subclasses the
        classes, or tests ``isinstance`` against them, is not served."""
        count, name = self.settings.get("pipeline_microbatches"), self.settings.get("pipeline_schedule")
        if count is None and name is None:
            return
        import torch.distributed.pipelining as pipelining

        classes = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}
        applier = self

        def builder(original: type) -> Callable[..., Any]:
            target = classes[name] if name else original

            @functools.wraps(original, updated=())
            def build(stage: Any, *args: Any, **kwargs: Any) -> Any:
                bound = dict(zip(_SCHEDULE_ARGS, args)) | kwargs
                before = bound.get("n_microbatches")
                if count is not None:
                    bound["n_microbatches"] = count
                note = (f"{target.__name__}(n_microbatches={bound.get('n_microbatches')})"
                        f" (the script's {original.__name__}(n_microbatches={before}))")
                if note not in applier.applied:
                    applier.applied.append(note)
                return target(stage, **bound)

            return build

        for cls in classes.values():
            setattr(pipelining, cls.__name__, builder(cls))

    def _with_arguments(self, signature: inspect.Signature, module: Any, args: tuple, kwargs: dict,
                        log_error: Callable[[str, BaseException], None]) -> tuple[tuple, dict, list[str]]:
        """The constructor's arguments with the strategy's in place of the script's, and a note of each."""
        ours = {k: self.settings[k] for k in CONSTRUCTOR_SETTINGS if self.settings.get(k) is not None}
        first = self.settings.get("first_bucket_mb")
        if not ours and first is None:
            return args, kwargs, []
        try:
            bound = signature.bind(module, *args, **kwargs)
        except TypeError:  # the script's own call is wrong: let DDP say so
            return args, kwargs, []
        if first is not None:
            if "bucket_cap_mb_list" in signature.parameters:
                cap = ours.get("bucket_cap_mb") or bound.arguments.get("bucket_cap_mb") or _default_bucket_cap_mb()
                ours["bucket_cap_mb_list"] = [first, cap]
            elif not any(note.startswith("first_bucket_mb") for note in self.left_out):
                self.left_out.append(f"first_bucket_mb={_shown(first)} (this torch's DistributedDataParallel "
                                     "has no bucket_cap_mb_list; torch 2.13 has)")
        try:
            notes = []
            for name, value in ours.items():
                before = bound.arguments.get(name)
                bound.arguments[name] = value
                notes.append(f"{name}={_shown(value)}" + ("" if before is None else f" (the script's {_shown(before)})"))
            return bound.args[1:], bound.kwargs, notes
        except Exception as e:
            log_error("applying the strategy's DistributedDataParallel arguments", e)
            return args, kwargs, []

    def _register_hook(self, module: Any) -> None:
        name = self.settings["comm_hook"]
        existing = module._get_ddp_logging_data().get("comm_hook")
        if existing:
            self.left_out.append(f"comm_hook={name} (the script registered {existing})")
            return
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        if name == POWERSGD:
            import torch.distributed as dist

            if dist.get_backend(module.process_group) == "gloo" and _several_buckets(module):
                self.left_out.append("comm_hook=powersgd (several buckets on gloo: DDP's PowerSGD hook issues its "
                                     "all-reduces from gloo's callbacks in an order the ranks do not share, and the "
                                     "job would fail)")
                return
            rank = int(self.settings["powersgd_rank"])
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                                start_powerSGD_iter=2)
            module.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
            self.applied.append(f"comm_hook=powersgd (rank {rank})")
        else:
            module.register_comm_hook(None, getattr(default_hooks, f"{name}_compress_hook"))
            self.applied.append(f"comm_hook={name}")


def _several_buckets(module: Any) -> bool:
    """Whether DDP's buckets, once rebuilt after the first step, will be more than one: the
    gradients do not fit the first bucket's cap (the reducer holds one bucket until then)."""
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad) > first_bucket_cap(module)


def _prefetch_forward(units: list[Any], unit: Any, depth: int) -> bool:
    """Place ``unit``, just wrapped (a module, or the list ``fully_shard([a, b])`` made one unit
    of, then held by its first module), in ``units`` (forward order: before the first unit it
    holds, else last) and give every unit the next ``depth`` units as its forward prefetch;
    whether any unit got one."""
    modules = list(unit) if isinstance(unit, (list, tuple)) else [unit]
    held = {id(m) for module in modules for m in module.modules()}
    inner = [i for i, u in enumerate(units) if id(u) in held]
    units.insert(inner[0] if inner else len(units), modules[0])
    for i, u in enumerate(units):
        u.set_modules_to_forward_prefetch(units[i + 1:i + 1 + depth])
    return depth > 0 and len(units) > 1


def _device_mesh(module: Any, shape: str) -> Any:
    """The ``(replicate, shard)`` device mesh ``shape`` names (``"2x2"``; 1-D for ``1xN``) over
    the job's ranks, on the device type of ``module``'s parameters (the accelerator's, or the
    CPU, for parameters not yet placed)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    replicate, shard = (int(n) for n in shape.split("x"))
    if replicate * shard != dist.get_world_size():
        raise ValueError(f"the mesh {shape} has {replicate * shard} ranks; the job runs {dist.get_world_size()}")
    first = module[0] if isinstance(module, (list, tuple)) else module
    device = next((p.device.type for p in first.parameters()), "meta")
    if device == "meta":
        accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        device = accelerator.type if accelerator is not None else "cpu"
    if replicate == 1:
        return init_device_mesh(device, (shard,))
    return init_device_mesh(device, (replicate, shard), mesh_dim_names=("replicate", "shard"))


def _default_bucket_cap_mb() -> float:
    from torch.nn.parallel import distributed

    return getattr(distributed, "_DEFAULT_BUCKET_CAP_MB", 25)


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return str(value) if isinstance(value, bool) or not isinstance(value, (int, float)) else f"{value:g}"
