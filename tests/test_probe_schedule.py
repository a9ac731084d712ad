"""The probe schedule for big fabrics: every pair once, both ways at once, and no directed link
shared by two probes of a round under the routes, by hash or by destination (fat trees of radix
4, 6 and 8)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dpro.anomaly.fabric.routing import Routing
from dpro.anomaly.fabric.schedule import disjoint_rounds, lower_bound, probe_rounds
from dpro.anomaly.fabric.topology import fat_tree, probe_tiers


def _directed(routing: Routing, a: int, b: int) -> set[tuple[str, str]]:
    """The switch-to-switch links host ``a``'s probe to ``b`` crosses, as (link, from switch):
    read from the route's names, not from the schedule's own ids."""
    links, switches = routing.route(np.array([a]), np.array([b]))
    return {(routing.links[l], routing.switches[s]) for l, s in zip(links[0], switches[0]) if l >= 0}


def _assert_disjoint(routing: Routing, rounds: list[np.ndarray], members: np.ndarray) -> None:
    for pairs in rounds:
        assert len(np.unique(pairs)) == pairs.size, "a host probes one partner a round"
        used: set[tuple[str, str]] = set()
        for a, b in members[pairs].tolist():
            both = _directed(routing, a, b) | _directed(routing, b, a)
            assert not both & used, (a, b)
            used |= both


@pytest.mark.parametrize("by", ["hash", "destination"])
@pytest.mark.parametrize("hosts, radix", [(16, 4), (54, 6), (128, 8), (12, 8), (100, 8)])
def test_every_pair_once_and_no_directed_link_twice_in_a_round(hosts: int, radix: int, by: str) -> None:
    routing = Routing.build(fat_tree(hosts, radix=radix), by=by)
    rounds = disjoint_rounds(routing)
    seen = [tuple(p) for r in rounds for p in r.tolist()]
    assert sorted(seen) == list(itertools.combinations(range(hosts), 2)), "every pair exactly once"
    _assert_disjoint(routing, rounds, np.arange(hosts))
    assert hosts - 1 <= lower_bound(routing) <= len(rounds)


def test_a_cable_carries_one_probe_each_way_in_a_round() -> None:
    """Links are full duplex: some round of a k=8 fat tree uses a cable in both directions."""
    routing = Routing.build(fat_tree(128, radix=8))
    both_ways = 0
    for pairs in disjoint_rounds(routing):
        ways = {way for a, b in pairs.tolist() for way in _directed(routing, a, b) | _directed(routing, b, a)}
        both_ways += sum(1 for link, switch in ways if any(l == link and s != switch for l, s in ways))
    assert both_ways > 0


def test_the_bound_is_the_busiest_directed_link_where_that_exceeds_n_minus_one() -> None:
    routing = Routing.build(fat_tree(128, radix=8))
    src, dst = (np.array(side) for side in zip(*itertools.permutations(range(128), 2)))
    links, switches = routing.route(src, dst)  # every probe's hops, counted as (link, from switch)
    hop = links >= 0
    _, load = np.unique(np.stack([links[hop], switches[:, :-1][hop]], axis=1), axis=0, return_counts=True)
    assert load.max() > 127
    assert lower_bound(routing) == load.max()


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
    _assert_disjoint(routing, rounds, members)
    assert disjoint_rounds(routing, members[:1]) == []


@pytest.mark.parametrize("hosts, radix", [(16, 4), (54, 6), (128, 8)])
def test_routes_by_destination_on_a_full_fat_tree_take_about_the_circle_methods_rounds(hosts: int, radix: int) -> None:
    """Under destination-mod-k routes each matching of the schedule shares no link: ``n`` rounds
    (the bound is ``n - 1``), fewer than the hash's routes take (their links' loads are uneven)."""
    topology = fat_tree(hosts, radix=radix)
    by_destination = disjoint_rounds(Routing.build(topology, by="destination"))
    assert len(by_destination) <= hosts
    assert len(by_destination) < len(disjoint_rounds(Routing.build(topology)))


def test_routes_by_destination_go_up_by_the_destinations_digits() -> None:
    """k=4 fat tree: two aggregation switches a pod, two cores each. Host ``d``'s probe from
    another pod goes up to aggregation switch ``d mod 2`` and core ``(d // 2) mod 2`` of it."""
    routing = Routing.build(fat_tree(16, radix=4), by="destination")
    assert routing.choices(0, 15) == [2, 2]
    for d in range(4, 16):
        _, switches = routing.route(np.array([0]), np.array([d]))
        names = [routing.switches[s] for s in switches[0] if s >= 0]
        assert names[1:3] == [f"agg0.{d % 2}", f"core{d % 2}.{d // 2 % 2}"], (d, names)


def test_routes_are_chosen_by_hash_or_destination_only() -> None:
    with pytest.raises(ValueError, match="'hash' or 'destination'"):
        Routing.build(fat_tree(16, radix=4), by="random")


def test_given_pairs_are_scheduled_apart_and_a_repeated_pair_takes_two_rounds() -> None:
    routing = Routing.build(fat_tree(54, radix=6), by="destination")
    members = np.arange(54)
    pairs = [(0, 53), (5, 1), (0, 53), (20, 33), (2, 40)]
    rounds = disjoint_rounds(routing, members, pairs)
    assert sorted(tuple(p) for r in rounds for p in r.tolist()) == sorted([(0, 53), (1, 5), (0, 53), (20, 33), (2, 40)])
    assert not any(((r == [0, 53]).all(axis=1)).sum() > 1 for r in rounds), "a repeated pair takes two rounds"
    _assert_disjoint(routing, rounds, members)
    assert disjoint_rounds(routing, members, []) == []
