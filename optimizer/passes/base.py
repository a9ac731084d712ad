"""What a pass returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Proposals:
    """Settings a pass proposes (each a dict of :data:`dpro.optimizer.strategy.SETTINGS`), or,
    when it proposes none, ``why``."""

    settings: list[dict[str, Any]] = field(default_factory=list)
    why: str = ""
