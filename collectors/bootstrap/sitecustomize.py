"""dpro's bootstrap, put on PYTHONPATH by ``dpro record`` so that every Python process of the job
loads it at start-up. It installs dpro's hooks (which wait for ``import torch``), then runs the
``sitecustomize`` that would have run without dpro, if there is one. It never stops the process.
"""

import importlib
import os
import sys


def _run_next_sitecustomize(here: str) -> None:
    """Import the sitecustomize that this one shadows, and keep this folder off sys.path."""
    ours = sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError as e:
        if e.name != "sitecustomize":
            raise
    finally:
        if ours is not None:
            sys.modules["sitecustomize"] = ours


def _bootstrap() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        if os.environ.get("DPRO_RUN_DIR"):
            from dpro.collectors import hooks

            hooks.install()
    except Exception as e:  # dpro not importable in this interpreter, or broken: warn and go on
        print(f"dpro: warning: not recording this process ({type(e).__name__}: {e})", file=sys.stderr)
    _run_next_sitecustomize(here)


_bootstrap()
