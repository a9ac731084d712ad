"""Collectives moved onto the groups of another device-mesh shape, over the links those cross
(shared by ``--fsdp-mesh`` and ``--tp-mesh``)."""

from __future__ import annotations

from collections import Counter

from dpro.replayer.cost import link_class
from dpro.replayer.graph_edits import WhatIf

__all__ = ["crossed", "flows_per_link", "merged_calls", "regroup_over", "runs", "strides"]


def runs(world: int, size: int) -> list[range]:
    """The groups of a mesh's inner dimension (``init_device_mesh``'s layout): ``size`` consecutive ranks."""
    return [range(k, k + size) for k in range(0, world, size)]


def strides(world: int, inner: int) -> list[range]:
    """The groups of a 2-D mesh's outer dimension: ranks ``inner`` apart."""
    return [range(k, world, inner) for k in range(inner)]


def crossed(w: WhatIf, groups: list[range]) -> str:
    """``inter`` where any of ``groups`` (of ranks) spans hosts, else ``intra``: the recorded
    ranks of a call stand for every group, and still wait for one another, so the slowest sets
    the step."""
    return "inter" if any(link_class(w.graph, list(g)) == "inter" for g in groups) else "intra"


def flows_per_link(w: WhatIf, groups: list[range]) -> int:
    """The most ring hops of ``groups``, run at once, that go from one host to another the same
    way: the flows sharing the busiest inter-host link (each group a ring in its ranks' order, as
    gloo's and NCCL's ring algorithms run; 0 where no group spans hosts)."""
    hosts = w.graph.hosts
    hops: Counter[tuple[str, str]] = Counter()
    for group in groups:
        ranks = list(group)
        if len(ranks) < 2:
            continue
        for a, b in zip(ranks, ranks[1:] + ranks[:1]):
            if hosts.get(a, "") != hosts.get(b, ""):
                hops[(hosts.get(a, ""), hosts.get(b, ""))] += 1
    return max(hops.values(), default=0)


def regroup_over(w: WhatIf, calls: list[tuple[str, int]], size: int, groups: list[range], was: list[range],
                 wires: dict[str, float]) -> str:
    """Each of ``calls`` (recorded on the groups ``was``) over ``size`` ranks of the new
    ``groups`` (:meth:`WhatIf.regroup`), over the links those cross; returns their class. A call
    recorded over another class, where the run measured none over the new one, keeps its
    recorded class's model with its time per byte re-timed at the classes' calibrated rates
    (``wires``: :func:`dpro.replayer.linkmodel.wire_rates`). Between hosts both ways, the wire's
    share is re-timed for the flows that share the busiest link (:func:`flows_per_link`): 2x2's
    two 2-rank rings across two hosts share it, 4x1's one ring of 4 does not. Where recorded
    groups merge into one, their calls become one (:func:`merged_calls`, :meth:`WhatIf.join`)."""
    new_link = crossed(w, groups)
    before, after = flows_per_link(w, was), flows_per_link(w, groups)
    by_link: dict[str, list[tuple[str, int]]] = {}
    for call in calls:
        by_link.setdefault(link_class(w.graph, list(w._collective(*call)["ranks"])), []).append(call)
    for old_link, mine in by_link.items():
        rate = 1.0 if old_link == new_link else (
            wires[new_link] / wires[old_link] if new_link in wires and old_link in wires else None)
        sharing = before / after if old_link == new_link == "inter" and before and after else 1.0
        w.regroup(mine, size, new_link, rate, sharing)
    w.join(merged_calls(w, calls, groups))
    return new_link


def merged_calls(w: WhatIf, calls: list[tuple[str, int]], groups: list[range]) -> list[list[tuple[str, int]]]:
    """Where recorded groups merge into one of ``groups``, the calls that become one: the
    ``k``-th call of each name of every recorded group inside the new one, in the order each
    group issued them. The calls of a name are left apart where the merging groups made
    different numbers of them."""
    by_group: dict[tuple[int, str, tuple[int, ...]], list[tuple[str, int]]] = {}
    for coll, occurrence in calls:
        ranks = tuple(sorted(int(r) for r in w._collective(coll, occurrence)["ranks"]))
        new = next((k for k, g in enumerate(groups) if set(ranks) <= set(g)), None)
        if new is not None and len(ranks) < len(groups[new]):
            by_group.setdefault((new, coll, ranks), []).append((coll, occurrence))
    merging: dict[tuple[int, str], list[list[tuple[str, int]]]] = {}
    for (new, coll, _), mine in sorted(by_group.items()):
        merging.setdefault((new, coll), []).append(sorted(mine, key=lambda c: c[1]))
    return [list(joined) for lists in merging.values() if len(lists) > 1 and len({len(x) for x in lists}) == 1
            for joined in zip(*lists)]
