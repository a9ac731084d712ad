"""Robust statistics shared by the analyses: the median and the scaled median absolute deviation.

For normally distributed values, ``1.4826 × MAD`` estimates the standard deviation, and it is
not moved by the outliers the analyses look for. A robust z-score is a value's distance from
the median of a reference set, in units of that spread.

    >>> robust_z(np.array([10.0, 11.0, 9.0, 10.0, 30.0]))
    array([ 0.        ,  0.67449...,  -0.67449...,  0.        , 13.48...])
"""

from __future__ import annotations

import numpy as np

__all__ = ["MAD_SCALE", "job_mean", "robust_spread", "robust_z", "timed_ranks"]

MAD_SCALE = 1.4826
"""``1 / Φ⁻¹(3/4)``: the MAD of a normal distribution times this is its standard deviation."""


def robust_spread(values: np.ndarray, centre: float | None = None) -> float:
    """``1.4826 ×`` the median absolute deviation of ``values`` from ``centre`` (default: their median)."""
    values = np.asarray(values, np.float64)
    if values.size == 0:
        return 0.0
    centre = float(np.median(values)) if centre is None else centre
    return MAD_SCALE * float(np.median(np.abs(values - centre)))


def robust_z(values: np.ndarray, reference: np.ndarray | None = None, floor: float = 1e-9,
             centre: float | None = None) -> np.ndarray:
    """How far each of ``values`` lies above the median of ``reference`` (default: ``values``), in
    units of the reference's robust spread, which is at least ``floor``; ``centre`` replaces
    the median as the point deviations are measured from."""
    values = np.asarray(values, np.float64)
    reference = values if reference is None else np.asarray(reference, np.float64)
    middle = float(np.median(reference)) if centre is None else centre
    return (values - middle) / max(robust_spread(reference, middle), floor)


def job_mean(per_rank: dict[int, float], ranks: list[int] | None = None) -> float:
    """A job's figure from its ranks' (a step time): the mean over ``ranks`` (default: all) of
    those with a value, NaN ones left out; NaN when none has one. The one rule by which every
    command turns ranks' step times into the job's."""
    present = [per_rank[r] for r in (per_rank if ranks is None else ranks) if per_rank[r] == per_rank[r]]
    return float(np.mean(present)) if present else float("nan")


def timed_ranks(measured: dict[int, float], ranks: list[int]) -> list[int]:
    """The ranks of ``ranks`` with a measured step (not NaN), or all of them where none has one:
    those a job's figures are taken over, so that predicted and measured cover the same ranks."""
    return [r for r in ranks if measured[r] == measured[r]] or ranks
