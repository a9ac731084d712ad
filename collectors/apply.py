"""A strategy's settings applied inside the job, without changing the script (``dpro record --apply``).

``dpro record`` passes the settings in :data:`ENV_APPLY` (JSON, validated by the command):

- ``bucket_cap_mb``: every ``DistributedDataParallel`` is built with this bucket cap, whatever
  the script passed;
- ``comm_hook`` (``fp16``, ``bf16``, ``powersgd`` with ``powersgd_rank``): registered on every
  ``DistributedDataParallel`` right after it is built; a hook the script registers later is
  left out (DDP takes one hook), and said so. A hook DDP refuses is left out, and the job runs
  without it.

What was applied and what was left out goes to the rank's ``meta.json`` (``applied``). A
failure here is logged and the job goes on as the script wrote it.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from typing import Any, Callable

ENV_APPLY = "DPRO_APPLY"

__all__ = ["ENV_APPLY", "Applier", "from_environment"]


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

    def report(self) -> dict[str, Any]:
        """``{"settings", "applied", "left_out"}`` for the rank's metadata."""
        return {"settings": self.settings, "applied": list(self.applied), "left_out": list(self.left_out)}

    def install(self, ddp_class: Any, log_error: Callable[[str, BaseException], None]) -> None:
        """Wrap ``ddp_class``'s constructor and ``register_comm_hook``."""
        construct, register = ddp_class.__init__, ddp_class.register_comm_hook
        signature = inspect.signature(construct)
        applier = self

        @functools.wraps(construct)
        def init(module: Any, *args: Any, **kwargs: Any) -> None:
            args, kwargs = applier._with_bucket_cap(signature, module, args, kwargs, log_error)
            construct(module, *args, **kwargs)
            try:
                applier._register_hook(module, register)
            except Exception as e:  # DDP refuses it (bf16 needs CUDA and NCCL): the job runs without
                applier.left_out.append(f"comm_hook={applier.settings['comm_hook']}: {type(e).__name__}: "
                                        + str(e).splitlines()[0][:200])
                log_error("applying the strategy's communication hook", e)

        @functools.wraps(register)
        def register_comm_hook(module: Any, state: Any, hook: Any) -> Any:
            if getattr(module, "_dpro_applied_hook", None):
                applier.left_out.append(f"the script's comm hook {getattr(hook, '__name__', hook)} "
                                        f"(the strategy's {module._dpro_applied_hook} is registered)")
                return None
            return register(module, state, hook)

        ddp_class.__init__ = init
        ddp_class.register_comm_hook = register_comm_hook

    def _with_bucket_cap(self, signature: inspect.Signature, module: Any, args: tuple, kwargs: dict,
                         log_error: Callable[[str, BaseException], None]) -> tuple[tuple, dict]:
        cap = self.settings.get("bucket_cap_mb")
        if cap is None:
            return args, kwargs
        try:
            bound = signature.bind(module, *args, **kwargs)
        except TypeError:  # the script's own call is wrong: let DDP say so
            return args, kwargs
        try:
            before = bound.arguments.get("bucket_cap_mb")
            bound.arguments["bucket_cap_mb"] = cap
            self.applied.append(f"bucket_cap_mb={cap:g}" + ("" if before is None else f" (the script's {before:g})"))
            return bound.args[1:], bound.kwargs
        except Exception as e:
            log_error("applying the strategy's bucket cap", e)
            return args, kwargs

    def _register_hook(self, module: Any, register: Callable[..., Any]) -> None:
        name = self.settings.get("comm_hook")
        if not name:
            return
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        if name == "powersgd":
            rank = int(self.settings["powersgd_rank"])
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                                start_powerSGD_iter=2)
            register(module, state, powerSGD_hook.powerSGD_hook)
            label = f"comm_hook=powersgd (rank {rank})"
        else:
            register(module, None, {"fp16": default_hooks.fp16_compress_hook,
                                    "bf16": default_hooks.bf16_compress_hook}[name])
            label = f"comm_hook={name}"
        module._dpro_applied_hook = name
        self.applied.append(label)
