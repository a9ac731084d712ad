"""dpro: profiler and performance diagnosis for distributed PyTorch training.

Inside a job run under ``dpro record``, :func:`step` marks the end of a training step for loops
that do not call an optimizer; elsewhere it does nothing.
"""

from __future__ import annotations

import sys

try:  # written by setuptools-scm from the git tags when dpro is built or installed
    from dpro._version import __version__
except ImportError:  # a source tree that was never installed
    __version__ = "0+unknown"


def step() -> None:
    """Mark the end of one training step (a no-op unless the job runs under ``dpro record``)."""
    hooks = sys.modules.get("dpro.collectors.hooks")
    if hooks is not None:
        hooks.user_step()
