"""The probe schedule for big fabrics: every pair once, both ways at once, and no directed link
shared by two probes of a round under the routing's hash (fat trees of radix 4, 6 and 8)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dpro.anomaly.fabric.routing import Routing
from dpro.anomaly.fabric.schedule import disjoint_rounds, lower_bound
from dpro.anomaly.fabric.topology import fat_tree
from dpro.anomaly.health.pairwise import probe_rounds
from dpro.anomaly.fabric.topology import probe_tiers


def _directed(routing: Routing, a: int, b: int) -> set[tuple[str, str]]:
    """The switch-to-switch links host ``a``'s probe to ``b`` crosses, as (link, from switch):
    read from the route's names, not from the schedule's own ids."""
    links, switches = routing.route(np.array([a]), np.array([b]))
    return {(routing.links[l], routing.switches[s]) for l, s in zip(links[0], switches[0]) if l >= 0}


@pytest.mark.parametrize("hosts, radix", [(16, 4), (54, 6), (128, 8), (12, 8)])
def test_every_pair_once_and_no_directed_link_twice_in_a_round(hosts: int, radix: int) -> None:
    routing = Routing.build(fat_tree(hosts, radix=radix))
    rounds = disjoint_rounds(routing)
    seen = [tuple(p) for r in rounds for p in r.tolist()]
    assert sorted(seen) == list(itertools.combinations(range(hosts), 2)), "every pair exactly once"
    for pairs in rounds:
        assert len(np.unique(pairs)) == pairs.size, "a host probes one partner a round"
        used: set[tuple[str, str]] = set()
        for a, b in pairs.tolist():
            both = _directed(routing, a, b) | _directed(routing, b, a)
            assert not both & used, (a, b)
            used |= both
    assert hosts - 1 <= lower_bound(routing) <= len(rounds)


def test_a_pod_sends_as_many_pairs_a_round_as_its_uplinks_carry() -> None:
    """The rule without routes (one pair leaves a pod a round) takes 1,799 rounds on a k=8 fat
    tree; with the routes a round carries many pairs out of each pod."""
    topology = fat_tree(128, radix=8)
    routing = Routing.build(topology)
    rounds = disjoint_rounds(routing)
    pod = np.arange(128) // 16
    leaving = max(int((pod[r[:, 0]] != pod[r[:, 1]]).sum()) for r in rounds)
    assert leaving > 8 // 2, "more than one pair out of each pod in some round"
    without = probe_rounds(128, [[t[h] for h in routing.hosts] for t in probe_tiers(topology, routing.hosts)])
    assert len(rounds) < len(without) / 2, (len(rounds), len(without))


def test_one_switch_needs_only_the_circle_methods_rounds() -> None:
    """Hosts under one switch share no switch link: ``n - 1`` rounds, the bound."""
    routing = Routing.build(fat_tree(8, radix=16))
    assert len(disjoint_rounds(routing)) == lower_bound(routing) == 7


def test_a_subset_of_the_hosts_is_scheduled_among_themselves() -> None:
    routing = Routing.build(fat_tree(54, radix=6))
    members = np.array([0, 5, 9, 20, 33, 53])
    rounds = disjoint_rounds(routing, members)
    assert sorted(tuple(p) for r in rounds for p in r.tolist()) == list(itertools.combinations(range(6), 2))
    assert disjoint_rounds(routing, members[:1]) == []
