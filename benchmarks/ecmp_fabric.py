"""A fabric with opaque ECMP for the localization benchmark: random paths, shared links.

Each probe takes one of its equal-cost paths at random (every switch picks a next hop uniformly:
:meth:`dpro.anomaly.fabric.routing.Routing.route` with a generator), which the analysis never sees.
Probes of one round that cross a link in the same direction split its capacity: a probe gets
``min`` over the NIC ports and directed links it crosses of ``capacity / probes there`` (links
are full duplex; switches do not block), where a healthy element has capacity 1 and a faulty one
its remaining share. Shares are of the line rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpro.anomaly.fabric.routing import Routing

WAVES_AT_ONCE = 64  # rounds whose loads are counted together (bounds memory)


@dataclass(frozen=True)
class Degradation:
    """A faulty component (id as in :func:`dpro.anomaly.fabric.tomography.components`) at ``share`` of
    its capacity, per round (``share[round]``, 1 when healthy)."""

    component: int
    share: np.ndarray


def elements(routing: Routing, src: np.ndarray, dst: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Directed elements ``(P, 2 + max_hops)`` each probe crosses on a random path, -1 padded:
    ``2h`` is host ``h``'s NIC sending, ``2h + 1`` receiving, ``2 · hosts + 2l + d`` link ``l``
    in direction ``d``."""
    links, switches = routing.route(src, dst, rng)
    direction = (switches[:, :-1] < switches[:, 1:]).astype(np.int64)
    fabric = np.where(links >= 0, 2 * len(routing.hosts) + 2 * links + direction, -1)
    return np.concatenate([2 * src[:, None], 2 * dst[:, None] + 1, fabric], axis=1)


def component_of(routing: Routing, element: np.ndarray) -> np.ndarray:
    """The component of each directed element (-1 stays -1)."""
    n_hosts = len(routing.hosts)
    link = n_hosts + (element - 2 * n_hosts) // 2
    return np.where(element < 0, -1, np.where(element < 2 * n_hosts, element // 2, link))


def bandwidth(routing: Routing, src: np.ndarray, dst: np.ndarray, rounds: np.ndarray, faults: list[Degradation],
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Each probe's share of the line rate, and whether another probe of its round shared one of
    its directed links or NIC ports (a collision)."""
    elem = elements(routing, src, dst, rng)
    comp = component_of(routing, elem)
    n_elem = 2 * len(routing.hosts) + 2 * len(routing.links)
    load = np.ones(elem.shape)
    for first in range(0, int(rounds.max()) + 1, WAVES_AT_ONCE):
        part = (rounds >= first) & (rounds < first + WAVES_AT_ONCE)
        e = elem[part]
        key = np.where(e >= 0, (rounds[part, None] - first) * n_elem + e, -1)
        counts = np.bincount(key[key >= 0], minlength=WAVES_AT_ONCE * n_elem)
        load[part] = np.where(e >= 0, counts[np.maximum(key, 0)], 1)
    capacity = np.ones(elem.shape)
    for fault in faults:
        on = comp == fault.component
        capacity[on] = np.minimum(capacity[on], np.broadcast_to(fault.share[rounds][:, None], on.shape)[on])
    return (capacity / load).min(axis=1), (load > 1).any(axis=1)
