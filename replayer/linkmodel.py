"""The link model fitted on a run's calibration: the job's collectives timed over sizes.

``dpro record`` times each collective on the job's default process group at sizes from 4 KiB
to 64 MiB (:mod:`dpro.collectors.calibration`). A collective of ``B`` bytes takes
``a + B * b`` (``a`` the fixed cost per call, ``b`` per byte), fitted per collective in two
parts (:func:`split_fit`): ``b`` from the larger half of the sizes, where the bytes' cost shows,
and ``a`` from the smaller half, where the fixed cost does. One line through every size
misses both where the two regimes disagree: through a shaped link small calls cost more than
the line from the large ones allows (a 300 Mb/s link's 4 KiB all-reduce 2-8 ms, its 64 KiB one
2.4 ms), and a fit on relative error over all of them gave 34 ns a byte where 1-16 MiB ran
at 41-42. Each rank's calls end together, so the median over ranks and repeats is kept per
size.

The replay's unit is a send of the collective's algorithm (:func:`dpro.graph.collectives.schedule`):
a ring all-reduce over ``n`` ranks is ``2(n-1)`` steps, each sending ``B/n``. The fit becomes a
per-send :class:`~dpro.replayer.cost.AlphaBeta` with ``alpha = a / steps`` and
``beta = steps * fraction / b``, so that the algorithm's sends add up to the measured call.
The calibration's TCP streams between ranks give the links' own rate (:func:`wire_rates`): the
share of ``b`` a faster or slower link changes.

    >>> model = calibrated_link_model(calibrations, link_class="intra")    # doctest: +SKIP
    >>> model[("all_reduce", "intra")].time_ns(2**20)                       # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from dpro.graph.collectives import schedule

from dpro.replayer.cost import AlphaBeta
from dpro.run_records import Calibration

__all__ = ["CollectiveFit", "calibrated_link_model", "fit_collectives", "per_send", "split_fit", "wire_rates"]

LINK_PERCENTILE = 90


@dataclass(frozen=True)
class CollectiveFit:
    """``fixed_ns + bytes * ns_per_byte`` for one call of ``coll`` over ``group_size`` ranks."""

    coll: str
    group_size: int
    fixed_ns: float
    ns_per_byte: float
    sizes: int

    def time_ns(self, nbytes: float) -> float:
        return self.fixed_ns + nbytes * self.ns_per_byte


def fit_collectives(calibrations: dict[int, Calibration]) -> dict[str, CollectiveFit]:
    """One fit per calibrated collective, from every rank's ``calibration.json``."""
    times: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    for calibration in calibrations.values():
        for row in calibration.collectives:
            times[(row.coll, row.group_size, row.size)] += row.times_ns
    by_coll: dict[tuple[str, int], list[tuple[int, float]]] = defaultdict(list)
    for (coll, n, nbytes), ts in times.items():
        by_coll[(coll, n)].append((nbytes, float(np.median(ts))))
    fits = {}
    for (coll, n), points in by_coll.items():
        if len(points) >= 2:
            nbytes, ns = np.array(sorted(points)).T
            fixed, per_byte = split_fit(nbytes, ns)
            fits[coll] = CollectiveFit(coll, n, fixed, per_byte, len(points))
    return fits


def split_fit(nbytes: np.ndarray, ns: np.ndarray) -> tuple[float, float]:
    """``ns ~ a + nbytes * b`` over sizes in increasing order: ``b`` fitted on the larger half
    (:func:`_relative_least_squares`, its own fixed term free), ``a`` the median of the smaller
    half's time beyond ``nbytes * b`` (``>= 0``); over all sizes alike where the larger half has
    fewer than two."""
    half = len(nbytes) // 2
    if len(nbytes) - half < 2 or half < 1:
        return _relative_least_squares(nbytes, ns)
    _, per_byte = _relative_least_squares(nbytes[half:], ns[half:])
    return max(float(np.median(ns[:half] - nbytes[:half] * per_byte)), 0.0), per_byte


def _relative_least_squares(nbytes: np.ndarray, ns: np.ndarray) -> tuple[float, float]:
    """``ns ~ a + nbytes * b`` minimizing the squared relative error, ``a, b >= 0``."""
    weights = 1.0 / ns
    design = np.stack([np.ones_like(nbytes), nbytes], axis=1) * weights[:, None]
    (a, b), *_ = np.linalg.lstsq(design, ns * weights, rcond=None)
    if a < 0:  # no visible fixed cost: bandwidth only
        a, b = 0.0, float(np.sum(nbytes * ns * weights ** 2) / np.sum((nbytes * weights) ** 2))
    if b < 0:  # no visible cost per byte: latency only
        a, b = float(np.median(ns)), 0.0
    return float(a), float(b)


def per_send(fit: CollectiveFit, group_size: int | None = None) -> AlphaBeta:
    """The per-send model of ``fit``'s collective decomposed over ``group_size`` ranks (default:
    the calibrated group)."""
    sends = schedule(fit.coll, group_size or fit.group_size)
    steps = sends.steps or 1
    fraction = float(sends.fraction.mean()) if len(sends.fraction) else 1.0
    beta = steps * fraction / fit.ns_per_byte if fit.ns_per_byte > 0 else np.inf
    return AlphaBeta(fit.fixed_ns / steps, float(beta), fit.sizes)


def calibrated_link_model(calibrations: dict[int, Calibration], link_class: str,
                          wire_bytes_per_ns: float | None = None) -> dict[tuple[str, str], AlphaBeta]:
    """The per-send model of every calibrated collective, for the run's ``link_class`` (the
    class of its default process group: ``intra`` on one host, else ``inter``), with the
    measured rate of the links of that class (:func:`wire_rates`) where it is known."""
    return {(coll, link_class): dataclasses.replace(per_send(fit), wire_bytes_per_ns=wire_bytes_per_ns)
            for coll, fit in fit_collectives(calibrations).items()}


def wire_rates(calibrations: dict[int, Calibration], rank_hosts: dict[int, str]) -> dict[str, float]:
    """Bytes per ns of the links between ranks, per class (``intra``: both ranks on one host,
    ``inter``): the median over the class's links of the calibration's TCP streams, each at the
    :data:`LINK_PERCENTILE` th percentile of its rate over its whole windows. What a link can
    carry is the most a stream got through it (as BBR estimates a path's bandwidth: the highest
    delivery rate it saw); a short stream through a shaped queue spends much of its time
    recovering from losses (at 20 Mb/s, half of a stream ran at 5 Mb/s while its cwnd grew
    back), and a percentile short of the maximum leaves out a shaper's first burst."""
    rates: dict[str, list[float]] = defaultdict(list)
    for calibration in calibrations.values():
        for link in calibration.links:
            src, dst = rank_hosts.get(link.src), rank_hosts.get(link.dst)
            whole = link.window_bytes[:-1]  # the last window is partial
            if src and dst and whole and max(whole) > 0 and link.window_ns > 0:  # a stream never timed: no rate
                rates["intra" if src == dst else "inter"].append(float(np.percentile(whole, LINK_PERCENTILE)) /
                                                                  link.window_ns)
    return {cls: float(np.median(r)) for cls, r in rates.items()}
