"""DDP's communication hooks by the one name each goes by in dpro: a strategy's ``comm_hook``,
``dpro whatif --compress``, the calibration's ``compression`` parts and what ``--apply``
registers. Cheap to import: the hooks inside the job use it.

    >>> parse_compress(compress_flag(POWERSGD, 4))
    ('powersgd', 4)
"""

from __future__ import annotations

CAST_HOOKS: dict[str, str] = {"fp16": "float16", "bf16": "bfloat16"}
"""The hooks that cast each bucket to half precision (``default_hooks.<name>_compress_hook``),
and the torch dtype each casts to."""
NCCL_ONLY = frozenset({"bf16"})
"""Hooks that refuse to register on another backend (bf16's needs CUDA 11+ and NCCL 2.10+)."""
CAST_BYTES_RATIO = 0.5
"""The bytes a cast hook sends per byte of float32 gradient."""
POWERSGD = "powersgd"
"""``powerSGD_hook.powerSGD_hook``, with a matrix rank of its own (a strategy's ``powersgd_rank``)."""
POWERSGD_MATMUL = "matmul"
"""The calibration's part that times PowerSGD's matrix products."""
HOOKS = (*CAST_HOOKS, POWERSGD)


def compress_flag(hook: str, rank: int | None = None) -> str:
    """The ``--compress`` value of ``hook``: ``fp16``, ``bf16`` or ``powersgd:RANK``."""
    return f"{POWERSGD}:{rank}" if hook == POWERSGD else hook


def parse_compress(value: str) -> tuple[str, int | None]:
    """``(hook, rank)`` of a ``--compress`` value; a :class:`ValueError` that says what is known."""
    if value in CAST_HOOKS:
        return value, None
    kind, _, rank = value.partition(":")
    if kind == POWERSGD:
        if not rank.isdigit() or int(rank) < 1:
            raise ValueError(f"{value!r}: {POWERSGD} takes a rank of at least 1 ({POWERSGD}:4)")
        return POWERSGD, int(rank)
    raise ValueError(f"{value!r} is not one of {', '.join(CAST_HOOKS)}, {POWERSGD}:RANK")
