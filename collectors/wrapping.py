"""Wrapping a function of torch's so that dpro's code runs once the original returned."""

from __future__ import annotations

import functools
from typing import Any, Callable

__all__ = ["wrap_after"]


def wrap_after(owner: Any, name: str, after: Callable[..., Any]) -> Callable[..., Any]:
    """Replace ``owner.name`` by a wrapper that calls ``after(*args)`` once the original returned;
    the wrapper (what ``owner.name`` now is, until something replaces it)."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        after(*args)
        return result

    setattr(owner, name, wrapper)
    return wrapper
