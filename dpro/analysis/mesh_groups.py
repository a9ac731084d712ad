"""Collectives moved onto the groups of another device-mesh shape, over the links those cross
(shared by ``--fsdp-mesh`` and ``--tp-mesh``)."""

from __future__ import annotations

from dpro.replayer.cost import link_class
from dpro.replayer.whatif import WhatIf

__all__ = ["crossed", "regroup_over"]


def crossed(w: WhatIf, groups: list[range]) -> str:
    """``inter`` where any of ``groups`` (of ranks) spans hosts, else ``intra``: the recorded
    ranks of a call stand for every group, and still wait for one another, so the slowest sets
    the step."""
    return "inter" if any(link_class(w.graph, list(g)) == "inter" for g in groups) else "intra"


def regroup_over(w: WhatIf, calls: list[tuple[str, int]], size: int, new_link: str,
                 wires: dict[str, float]) -> None:
    """Each of ``calls`` over ``size`` ranks and links of class ``new_link``
    (:meth:`WhatIf.regroup`): a call recorded over another class, where the run measured none
    over ``new_link``, keeps its recorded class's model with the wire's share re-timed at the
    classes' calibrated rates (``wires``: :func:`dpro.replayer.linkmodel.wire_rates`)."""
    by_link: dict[str, list[tuple[str, int]]] = {}
    for call in calls:
        by_link.setdefault(link_class(w.graph, list(w._collective(*call)["ranks"])), []).append(call)
    for old_link, mine in by_link.items():
        rate = 1.0 if old_link == new_link else (
            wires[new_link] / wires[old_link] if new_link in wires and old_link in wires else None)
        w.regroup(mine, size, new_link, rate)
