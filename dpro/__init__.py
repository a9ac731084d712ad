"""dpro: profiler and performance diagnosis for distributed PyTorch training.

Inside a job run under ``dpro record``, :func:`step` marks the end of a training step for loops
that do not call an optimizer; elsewhere it does nothing.
"""

from __future__ import annotations

import sys

__version__ = "0.1.0"


def step() -> None:
    """Mark the end of one training step (a no-op unless the job runs under ``dpro record``)."""
    hooks = sys.modules.get("dpro.collectors.hooks")
    if hooks is not None:
        hooks.user_step()
