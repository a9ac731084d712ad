"""The benchmark's independent fabric simulator: ECMP routing, faults, max-min rates, probes."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from benchmarks.fabric_sim import (Background, Fault, Flow, dpro_name, fat_tree, flow_rates,
                                   leaf_spine, measure, random_fault, topology_spec)


def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """The circle method: n - 1 rounds in which every host is in one pair, every pair once."""
    ids = list(range(n))
    rounds = []
    for _ in range(n - 1):
        rounds.append([(ids[i], ids[n - 1 - i]) for i in range(n // 2)])
        ids = [ids[0], ids[-1]] + ids[1:-1]
    return rounds


def flows(src: int, dst: int, count: int = 400) -> list[Flow]:
    """``count`` flows from ``src`` to ``dst`` that differ in their source port only."""
    return [Flow(src, dst, 32768 + port) for port in range(count)]


def test_round_robin_covers_every_pair_once():
    pairs = [tuple(sorted(p)) for r in round_robin(16) for p in r]
    assert sorted(pairs) == [(a, b) for a in range(16) for b in range(a + 1, 16)]


def test_ecmp_spreads_flows_over_all_spines_and_is_stable():
    fabric = leaf_spine(2, 2, 4)
    paths = [fabric.path(f) for f in flows(0, 2, 2000)]
    for path in paths:
        assert path[0] == ("h0", "leaf0") and path[-1] == ("leaf1", "h2") and len(path) == 4
        assert all(a[1] == b[0] for a, b in zip(path, path[1:]))
    spines = Counter(path[1][1] for path in paths)
    assert set(spines) == {f"spine{i}" for i in range(4)}
    assert all(400 <= n <= 600 for n in spines.values()), spines
    again = leaf_spine(2, 2, 4)  # the same 5-tuple takes the same path, in any run
    assert all(again.path(f) == path for f, path in zip(flows(0, 2, 2000), paths))
    assert fabric.path(Flow(0, 1, 40000)) == [("h0", "leaf0"), ("leaf0", "h1")]


def test_fat_tree_shape_and_two_level_ecmp():
    fabric = fat_tree(4)
    assert len(fabric.hosts) == 16 and len(fabric.switches) == 20 and len(fabric.cables) == 48
    assert len(fabric.path(Flow(0, 1, 40000))) == 2  # same edge switch
    assert len(fabric.path(Flow(0, 2, 40000))) == 4  # same pod
    paths = [fabric.path(f) for f in flows(0, 15, 2000)]
    assert all(len(p) == 6 and p[0] == ("h0", "edge0_0") and p[-1] == ("edge3_1", "h15")
               for p in paths)
    # Each of the 4 cores gets about a quarter: the edge's and the aggregation switch's
    # choices are not correlated (with one shared hash, only 2 cores would be used).
    cores = Counter(p[2][1] for p in paths)
    assert set(cores) == {f"core{i}" for i in range(4)}
    assert all(400 <= n <= 600 for n in cores.values()), cores


def test_link_fault_slows_only_its_direction():
    fabric = leaf_spine(2, 1, 1)  # h0 - leaf0 - spine0 - leaf1 - h1
    for where in [("leaf0", "spine0"), ("h0", "leaf0"), ("leaf1", "h1")]:
        faults = [Fault("link", where, 0.4)]
        assert flow_rates(fabric, [Flow(0, 1, 40000)], faults) == pytest.approx([60.0])
        assert flow_rates(fabric, [Flow(1, 0, 40000)], faults) == pytest.approx([100.0])


def test_switch_fault_slows_flows_through_it_only():
    fabric = leaf_spine(2, 1, 2)
    faults = [Fault("switch", "spine1", 0.5)]
    probe = flows(0, 1, 200)
    for flow in probe[:40]:
        via = fabric.path(flow)[1][1]
        expected = 50.0 if via == "spine1" else 100.0
        assert flow_rates(fabric, [flow], faults) == pytest.approx([expected])
    assert {fabric.path(f)[1][1] for f in probe[:40]} == {"spine0", "spine1"}
    # A leaf's egress includes its host links: both directions of h0's probes slow down.
    leaf = [Fault("switch", "leaf0", 0.5)]
    assert flow_rates(fabric, [Flow(0, 1, 1), Flow(1, 0, 2)], leaf) == pytest.approx([50, 50])
    three = leaf_spine(3, 1, 1)
    assert flow_rates(three, [Flow(1, 2, 1), Flow(2, 1, 2)], leaf) == pytest.approx([100, 100])
    slowed = fabric.capacities(leaf) < fabric.capacity
    assert [fabric.links[i] for i in np.flatnonzero(slowed)] == [
        ("leaf0", "h0"), ("leaf0", "spine0"), ("leaf0", "spine1")]


def test_probes_take_random_paths():
    fabric = leaf_spine(2, 1, 2)
    faults = [Fault("switch", "spine1", 0.5)]
    rates = {round(measure(fabric, [[(0, 1)]], faults, rng=seed)[0][3]) for seed in range(20)}
    assert rates == {50, 100}


def test_probes_on_the_ports_the_prober_chose_take_the_same_path_every_time():
    fabric = leaf_spine(2, 1, 2)
    faults = [Fault("switch", "spine1", 0.5)]
    by_port = {port: {round(measure(fabric, [[(0, 1)]], faults, rng=seed, sports=[port, port])[0][3])
                      for seed in range(10)} for port in range(40000, 40010)}
    assert all(len(rates) == 1 for rates in by_port.values()), by_port
    assert set().union(*by_port.values()) == {50, 100}, "the ports still spread the probes over both spines"
    with pytest.raises(ValueError, match="1 source ports for 2 probes"):
        measure(fabric, [[(0, 1)]], sports=[40000])


def test_a_host_pairs_connection_keeps_its_path_in_every_round_it_is_probed():
    fabric = leaf_spine(2, 1, 2)  # h0 on leaf0, h1 on leaf1: every probe crosses a spine
    faults = [Fault("switch", "spine1", 0.5)]
    for seed in range(10):
        ports = np.random.default_rng(seed).integers(32768, 61000, size=(2, 2))
        rows = measure(fabric, [[(0, 1)]] * 4, faults, rng=seed, pair_ports=ports)
        assert {round(r[3]) for r in rows if r[0] == 0} in ({50}, {100}), rows  # one path a direction


def test_max_min_fair_shares():
    fabric = leaf_spine(2, 2, 1)  # h0, h1 on leaf0; h2, h3 on leaf1; 100 G uplinks
    assert flow_rates(fabric, [Flow(0, 2, 1), Flow(1, 3, 2)]) == pytest.approx([50, 50])
    capped = flow_rates(fabric, [Flow(0, 2, 1), Flow(1, 3, 2)], demands=[20, np.inf])
    assert capped == pytest.approx([20, 80])
    wide = leaf_spine(2, 2, 1, uplink_gbps=400)
    # Three flows into h2 share its link; h1's other flow takes what h1's NIC has left.
    rates = flow_rates(wide, [Flow(0, 2, 1), Flow(1, 2, 2), Flow(3, 2, 3), Flow(1, 3, 4)])
    assert rates == pytest.approx([100 / 3, 100 / 3, 100 / 3, 200 / 3])


def test_max_min_rates_have_a_bottleneck_each():
    """The definition of max-min fairness: every flow is at its demand or crosses a full link
    on which no flow gets more than it does."""
    fabric = fat_tree(4)
    rng = np.random.default_rng(3)
    fault = [Fault("link", ("agg0_0", "core1"), 0.7)]
    capacity = fabric.capacities(fault)
    for _ in range(20):
        src = rng.integers(16, size=40)
        batch = [Flow(int(s), int((s + rng.integers(1, 16)) % 16), int(rng.integers(1 << 16)))
                 for s in src]
        demands = np.where(rng.random(40) < 0.5, rng.uniform(0, 60, 40), np.inf)
        rates = flow_rates(fabric, batch, fault, demands)
        load = np.zeros(len(fabric.links))
        for flow, rate in zip(batch, rates):
            load[fabric.route(flow)] += rate
        assert np.all(load <= capacity + 1e-6)
        for flow, rate, demand in zip(batch, rates, demands):
            full = [i for i in fabric.route(flow) if load[i] >= capacity[i] - 1e-6]
            top = [max(r for f, r in zip(batch, rates) if i in fabric.route(f)) for i in full]
            assert rate >= demand - 1e-6 or any(rate >= t - 1e-6 for t in top)


def test_clean_probes_measure_the_host_link_rate():
    fabric = leaf_spine(4, 4, 2, uplink_gbps=400)  # not oversubscribed: no ECMP collisions
    rows = measure(fabric, round_robin(16), rng=0)
    assert len(rows) == 240
    assert sorted((a, b) for a, b, _, _ in rows) == [(a, b) for a in range(16)
                                                     for b in range(16) if a != b]
    assert sorted({r for _, _, r, _ in rows}) == list(range(15))
    assert all(gbps == pytest.approx(100.0) for *_, gbps in rows)


def test_each_round_runs_forward_then_backward_phases():
    fabric = leaf_spine(2, 2, 1)  # h0, h1 on leaf0; h2, h3 on leaf1; one 100 G uplink each
    # 0->2 and 1->3 would share leaf0->spine0 at once; 3->1 runs the other way.
    apart = measure(fabric, [[(0, 2), (3, 1)]], rng=0)
    assert [(a, b) for a, b, _, _ in apart] == [(0, 2), (3, 1), (2, 0), (1, 3)]
    assert all(gbps == pytest.approx(100.0) for *_, gbps in apart)
    together = measure(fabric, [[(0, 2), (1, 3)], [(0, 1)]], rng=0)
    assert [(a, b, r) for a, b, r, _ in together] == [
        (0, 2, 0), (1, 3, 0), (2, 0, 0), (3, 1, 0), (0, 1, 1), (1, 0, 1)]
    assert [gbps for *_, gbps in together] == pytest.approx([50, 50, 50, 50, 100, 100])


def test_noise_is_log_normal_with_sigma_noise():
    fabric = leaf_spine(4, 4, 2, uplink_gbps=400)
    rng = np.random.default_rng(1)
    logs = [np.log(gbps / 100.0) for _ in range(10)
            for *_, gbps in measure(fabric, round_robin(16), noise=0.05, rng=rng)]
    assert abs(np.mean(logs)) < 0.01
    assert np.std(logs) == pytest.approx(0.05, rel=0.1)


def test_oversubscribed_fabric_probes_collide():
    rows = measure(leaf_spine(4, 4, 2), round_robin(16), rng=0)  # 2:1 at the leaves
    assert min(gbps for *_, gbps in rows) < 60 and max(gbps for *_, gbps in rows) == 100


def test_access_link_fault_in_a_schedule():
    fabric = leaf_spine(4, 4, 2, uplink_gbps=400)
    rows = measure(fabric, round_robin(16), [Fault("link", ("h3", "leaf0"), 0.3)], rng=0)
    for src, dst, _, gbps in rows:
        assert gbps == pytest.approx(70.0 if src == 3 else 100.0)


def test_background_takes_bandwidth_but_is_no_fault():
    fabric = leaf_spine(4, 4, 2, uplink_gbps=400)
    busy = measure(fabric, round_robin(16), background=Background(flows=8, max_demand=0.5),
                   rng=0)
    rates = np.array([gbps for *_, gbps in busy])
    assert rates.max() <= 100.0 + 1e-9 and 60.0 < rates.mean() < 90.0
    by_src = [rates[[i for i, row in enumerate(busy) if row[0] == h]].mean() for h in range(16)]
    assert min(by_src) > 0.75 * max(by_src)  # spread over all hosts, no slow host
    light = measure(fabric, round_robin(16), background=0.25, rng=0)  # 4 flows per phase
    assert rates.mean() < np.mean([gbps for *_, gbps in light]) < 95.0


def test_same_seed_same_results():
    fabric = fat_tree(4)
    runs = [measure(fabric, round_robin(16), noise=0.05, background=0.5, rng=seed)
            for seed in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_random_fault_draws_every_kind_of_place():
    fabric = leaf_spine(2, 2, 2)
    rng = np.random.default_rng(0)
    drawn = [random_fault(fabric, rng, 0.5) for _ in range(400)]
    places = {f.where for f in drawn}
    assert {("h0", "leaf0"), ("leaf0", "h0"), ("leaf0", "spine1"), ("spine1", "leaf0"),
            "spine1", "leaf1"} <= places
    assert Counter(f.kind for f in drawn)["switch"] == pytest.approx(200, abs=50)
    access = [random_fault(fabric, rng, 0.5, kinds=("link",), access_share=1.0)
              for _ in range(50)]
    assert all(f.where in fabric.access_links for f in access)
    assert all(f.kind == "switch" for f in (random_fault(fabric, rng, 0.5, kinds=("switch",))
                                            for _ in range(20)))
    assert all(fabric.capacities([f]).min() == 50.0 for f in drawn)


def test_unknown_fault_place_is_an_error():
    fabric = leaf_spine(2, 1, 1)
    for fault in [Fault("link", ("h0", "spine0"), 0.5), Fault("switch", "h0", 0.5),
                  Fault("nic", "h0", 0.5)]:
        with pytest.raises(ValueError):
            fabric.capacities([fault])


def test_topology_spec_lists_every_cable_once_and_every_host():
    fabric = fat_tree(4)
    spec = json.loads(json.dumps(topology_spec(fabric)))
    assert spec["hosts"] == {f"h{i}": [] for i in range(16)}
    assert sorted(spec["switches"]) == sorted(fabric.switches) and len(spec["switches"]) == 20
    cables = [frozenset(link) for link in spec["links"]]
    assert len(cables) == len(set(cables)) == 48
    assert set(cables) == {frozenset(link) for link in fabric.links}
    assert len(topology_spec(leaf_spine(4, 4, 2))["links"]) == 16 + 8


def test_dpro_name():
    assert dpro_name("h12") == "h12/nic0"
    assert [dpro_name(n) for n in ("leaf0", "spine3", "edge0_1", "agg1_0", "core2")] == [
        "leaf0", "spine3", "edge0_1", "agg1_0", "core2"]
