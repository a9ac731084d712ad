"""How much a counter grew between two readings, across wrap-around, saturation and resets.

The rule, for a counter whose declared width is ``w`` bits (from :mod:`dpro.collectors.counters.catalog`):

* A reading that does not fit in ``w`` bits proves the counter is wider: it is read as 64-bit
  (e.g. PMA data counters, 32 bits in the basic set, 64 in the extended set mlx5 uses).
* ``after >= before``: the increase is ``after - before``. A saturating counter found at its
  maximum ``2**w - 1`` gets a note: it stopped counting, the real increase may be larger.
* ``after < before``:

  - a counter narrower than 64 bits that wraps went past ``2**w``: the increase is
    ``after + 2**w - before`` (one wrap: snapshots must be closer than one wrap period);
  - a saturating counter, or a 64-bit one (which cannot wrap in any realistic time), was reset
    (driver reload, ``perfquery -R``...): the increase is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Delta:
    """The increase of one counter in raw units; ``value`` is None when it cannot be known."""

    value: int | None
    wrapped: bool = False
    note: str | None = None


def effective_width(declared: int, *values: int) -> int:
    """``declared``, or 64 when one of ``values`` does not fit in ``declared`` bits."""
    return 64 if any(v >= 1 << declared for v in values) else declared


def delta(before: int, after: int, width: int, saturates: bool = False) -> Delta:
    """The increase from ``before`` to ``after`` of a ``width``-bit counter (see the module's rule)."""
    w = effective_width(width, before, after)
    top = (1 << w) - 1
    if after >= before:
        note = f"saturated at {top} (2^{w}-1): the real increase may be larger" if saturates and after == top else None
        return Delta(after - before, note=note)
    if saturates or w >= 64:
        return Delta(None, note=f"went down from {before} to {after}: the counter was reset")
    return Delta(after + (1 << w) - before, wrapped=True, note=f"wrapped around 2^{w}")
