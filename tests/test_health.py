"""``dpro health``: the checks, the rules, the history and the reports, on real processes — a
local gloo job, a stand-in NVML driver (tests/fakes/fake_nvml.c) for the GPU checks, and a
4-host namespace cluster with one host's link throttled, over several nights (and those nights on
the dashboard's Health page, in a real headless Chromium)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from benchmarks.fabric_sim import Background, Fault, Flow, leaf_spine, measure, topology_spec
from benchmarks.fabric_sim import fat_tree as simulated_fat_tree
from benchmarks.health_nights import CONFIG as NIGHTS_CONFIG
from dpro.anomaly.fabric.follow_up import Z_CLASS as FOLLOWED_Z_CLASS
from dpro.anomaly.fabric.follow_up import SWEEPS, follow_up, probe_adaptively, repeated
from dpro.anomaly.fabric.localize import localize
from dpro.anomaly.fabric.probes import ProbeError, Probes, analyze, read_probes
from dpro.anomaly.fabric.topology import fat_tree, from_spec, host_nic, hosts, probe_tiers
from dpro.anomaly.health.config import Rules
from dpro.anomaly.health.collective_bench import bus_factor
from dpro.anomaly.health.history import History
from dpro.anomaly.health.model import Metric
from dpro.anomaly.fabric.routing import Routing
from dpro.anomaly.fabric.schedule import probe_rounds
from dpro.anomaly.health.rules import Baseline, judge, learned
from dpro.anomaly.suspects import to_json
from dpro.collectors.counters.procstat import read_cpu_times, steal_share
from tools.testing.browser import start_dashboard
from tools.testing.netns import NetnsCluster, can_build_namespaces, torchrun_across_hosts
from tests.conftest import JOBS, ROOT, TORCHRUN, assert_one_line_error, dpro

FAKES = Path(__file__).parent / "fakes"
ARTIFACTS = Path(os.environ.get("DPRO_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "dashboard"


def _health(*args: object, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpro", "health", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_bus_bandwidth_factors_are_nccl_tests() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 4) == bus_factor("reduce_scatter", 4) == bus_factor("all_to_all", 4) == 0.75
    assert bus_factor("broadcast", 16) == 1.0


@pytest.mark.parametrize("n", [2, 3, 4, 7, 8])
def test_probe_rounds_meet_every_pair_once_without_sharing_a_host(n: int) -> None:
    rounds = probe_rounds(n)
    pairs = [frozenset(p) for r in rounds for p in r]
    assert sorted(map(sorted, pairs)) == [[a, b] for a in range(n) for b in range(a + 1, n)]
    assert all(len({h for p in r for h in p}) == 2 * len(r) for r in rounds)
    assert len(rounds) <= n  # the circle method's count


def test_probe_rounds_send_one_pair_per_round_out_of_each_switch() -> None:
    groups = ["leaf0"] * 3 + ["leaf1"] * 3
    rounds = probe_rounds(6, [groups])
    assert sorted(sorted(p) for r in rounds for p in r) == [[a, b] for a in range(6) for b in range(a + 1, 6)]
    for r in rounds:
        assert sum(groups[a] != groups[b] for a, b in r) <= 1


def _simulated_probes(fault: Fault | None, seed: int) -> tuple[object, Probes]:
    """A 4x4-host leaf-spine of the independent simulator (benchmarks.fabric_sim), probed on
    the health check's schedule with 3% noise and light traffic from other tenants."""
    fabric = leaf_spine(4, 4, 2)
    topology = from_spec(topology_spec(fabric))
    tiers = probe_tiers(topology, fabric.hosts)
    rows = np.array(measure(fabric, probe_rounds(16, [[t[h] for h in fabric.hosts] for t in tiers]), [fault] if fault else [], 0.03,
                            Background(0.25), np.random.default_rng(seed)))
    return topology, Probes(fabric.hosts, rows[:, 0].astype(int), rows[:, 1].astype(int), rows[:, 2].astype(int),
                            rows[:, 3])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pooled_probes_name_a_nic_ten_percent_slow_in_one_direction(seed: int) -> None:
    topology, probes = _simulated_probes(Fault("link", ("h6", "leaf1"), 0.10), seed)
    suspects = localize(topology, probes)
    assert suspects and suspects[0].kind == "nic" and suspects[0].name == "h6/nic0", suspects
    assert suspects[0].evidence["direction"] == "sending" and len(suspects) == 1
    topology, probes = _simulated_probes(Fault("link", ("spine1", "leaf2"), 0.20), seed)
    first = localize(topology, probes)[0]
    assert first.kind == "link" and {first.name, *first.evidence["same_as"]} == {"spine0->leaf2", "spine1->leaf2"}
    topology, probes = _simulated_probes(None, seed)
    assert localize(topology, probes) == []


def test_probe_rounds_of_given_pairs_probe_a_repeated_pair_in_two_rounds() -> None:
    groups = ["leaf0"] * 3 + ["leaf1"] * 3
    pairs = [(0, 3), (3, 0), (1, 4), (0, 1)]
    rounds = probe_rounds(6, [groups], pairs)
    assert sorted(p for r in rounds for p in r) == [(0, 1), (0, 3), (0, 3), (1, 4)]
    for r in rounds:
        assert sum(groups[a] != groups[b] for a, b in r) <= 1 and len({h for p in r for h in p}) == 2 * len(r)


def _adaptive(fault: Fault | None, noise: float, seed: int, sweeps: int = 1,
              background: Background = Background(0.25)) -> tuple[object, Probes, int]:
    """The health check's sweep (measured ``sweeps`` times) and follow-ups on the independent
    simulator's 4x4 leaf-spine, each host pair's probes one way over one connection (a source
    port drawn for the trial), as over the check's job; a repeat of a round, a share of its
    time, ``sqrt(sweeps)`` times as noisy."""
    fabric = leaf_spine(4, 4, 2)
    topology = from_spec(topology_spec(fabric))
    tiers = [[t[h] for h in fabric.hosts] for t in probe_tiers(topology, fabric.hosts)]
    first = probe_rounds(16, tiers)
    rng = np.random.default_rng(seed)
    ports = rng.integers(32768, 61000, size=(16, 16))

    def probe(rounds: list[list[tuple[int, int]]], first_round: int) -> Probes:
        rows = np.array(measure(fabric, rounds, [fault] if fault else [], noise * np.sqrt(sweeps), background, rng,
                                pair_ports=ports))
        return Probes(fabric.hosts, rows[:, 0].astype(int), rows[:, 1].astype(int), rows[:, 2].astype(int) + first_round,
                      rows[:, 3])

    probes, added = probe_adaptively(probe, topology, tiers, first, sweeps=sweeps)
    return topology, probes, added


def test_rounds_measured_again_on_the_same_paths_clear_what_other_traffic_slowed() -> None:
    """Heavy background (a flow of other tenants' a phase) on a healthy leaf-spine: measured
    once, the localizer gets probes that passing flows slowed, and names a healthy class in some
    trials; every round measured SWEEPS times over the same connections, each direction's
    median, names one in fewer (benchmarks.health_localization --tune-sweeps, seed 1: 0.44
    against 0.02)."""
    heavy = Background(flows=1.0, max_demand=0.5)
    alarms = {sweeps: sum(bool(localize(topology, probes, z_class=FOLLOWED_Z_CLASS))
                          for topology, probes, _ in (_adaptive(None, 0.05, seed, sweeps, heavy) for seed in range(12)))
              for sweeps in (1, SWEEPS)}
    assert alarms[SWEEPS] < alarms[1], alarms


def test_a_repeat_of_the_sweep_the_budget_cut_short_is_left_out_of_the_medians() -> None:
    hosts_ = ["a", "b", "c"]
    calls = []

    def measure(rounds: list[list[tuple[int, int]]], first_round: int) -> Probes:
        calls.append(first_round)
        rows = [(x, y) for pairs in rounds for p in pairs for x, y in (p, p[::-1])]
        if len(calls) == 3:  # the budget ran out inside this repeat
            rows = rows[:1]
        src, dst = (np.array(c) for c in zip(*rows))
        return Probes(hosts_, src, dst, np.full(len(src), first_round), np.full(len(src), float(len(calls))))

    probes = repeated(measure, [[(0, 1)], [(1, 2)]], sweeps=3)
    assert calls == [0, 2, 4]
    assert probes.round.tolist() == [0, 0, 0, 0] and probes.value.tolist() == [1.5] * 4  # median of 1 and 2
    with pytest.raises(ProbeError, match="same probes in the same order"):
        probes.medians(replace(probes, src=probes.dst, dst=probes.src))


def test_follow_up_probes_the_pairs_through_a_class_in_doubt_until_it_is_named() -> None:
    """A NIC 10% slow sending, in 10% noise: one sweep leaves it short of the threshold in most
    trials; the follow-up probes again the pairs its probes ran between (h6 sending among them),
    within the budget of one more sweep, and names it in more of them (at the stricter threshold
    the check then uses)."""
    named_after, named_first = 0, 0
    for seed in range(12):
        topology, probes, added = _adaptive(Fault("link", ("h6", "leaf1"), 0.10), 0.10, seed)
        first = probes.round < len(probe_rounds(16, [[t[h] for h in probes.hosts] for t in probe_tiers(topology, probes.hosts)]))
        sweep = probes.take(first)
        assert added <= 120, "at most one more sweep's pairs"
        again = ~first
        if added:
            assert (probes.src[again] == probes.hosts.index("h6")).any(), "the pairs through the suspect's class"
        named_first += any(s.name == "h6/nic0" for s in localize(topology, sweep))
        named_after += any(s.name == "h6/nic0" for s in localize(topology, probes, z_class=FOLLOWED_Z_CLASS))
    assert named_after > named_first


def test_follow_ups_probe_again_the_pairs_that_fell_short_through_the_class_in_doubt() -> None:
    """A fat tree's link from ``agg0_0`` to ``core0``, 10% slow in 5% noise, is one of pod 0's
    four links to the cores, which no probe tells apart: a quarter of the pod's pairs to other
    pods take it. The follow-ups probe again the pairs whose probes through a class in doubt
    fell short, not every pair through it (``distil -inf``), and more of the pairs chosen take
    the slow link."""
    fabric = simulated_fat_tree(4)
    topology = from_spec(topology_spec(fabric))
    tiers = [[t[h] for h in fabric.hosts] for t in probe_tiers(topology, fabric.hosts)]
    first = probe_rounds(16, tiers)
    fault = Fault("link", ("agg0_0", "core0"), 0.10)
    chosen, every = [], []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        ports = rng.integers(32768, 61000, size=(16, 16))

        def probe(rounds: list[list[tuple[int, int]]], first_round: int) -> Probes:
            rows = np.array(measure(fabric, rounds, [fault], 0.05 * np.sqrt(SWEEPS), Background(0.25), rng,
                                    pair_ports=ports))
            return Probes(fabric.hosts, rows[:, 0].astype(int), rows[:, 1].astype(int),
                          rows[:, 2].astype(int) + first_round, rows[:, 3])

        probes = repeated(probe, first, SWEEPS)
        distilled, all_pairs = follow_up(topology, probes, 10**6), follow_up(topology, probes, 10**6, distil=-np.inf)
        assert set(distilled) <= set(all_pairs) and (len(distilled) < len(all_pairs) or not all_pairs)
        slow = {(a, b) for a in range(16) for b in range(16)
                if fault.where in fabric.path(Flow(a, b, int(ports[a, b])))}  # one way or the other
        chosen += [(a, b) in slow or (b, a) in slow for a, b in distilled]
        every += [(a, b) in slow or (b, a) in slow for a, b in all_pairs]

    assert every, "some class was in doubt"
    assert np.mean(chosen) > np.mean(every), (sum(chosen), len(chosen), sum(every), len(every))


def test_a_budget_spent_before_the_first_round_leaves_no_probes_and_no_suspects() -> None:
    fabric = leaf_spine(4, 4, 2)
    topology = from_spec(topology_spec(fabric))
    none = np.zeros(0, int)

    def spent(rounds: list[list[tuple[int, int]]], first_round: int) -> Probes:
        return Probes(fabric.hosts, none, none, none, np.zeros(0))

    probes, added = probe_adaptively(spent, topology, [], probe_rounds(16))
    assert len(probes.value) == 0 and added == 0
    assert localize(topology, probes) == []


def test_follow_up_on_a_healthy_fabric_names_nothing() -> None:
    for seed in range(3):
        topology, probes, _ = _adaptive(None, 0.05, seed)
        assert localize(topology, probes, z_class=FOLLOWED_Z_CLASS) == []


@pytest.mark.parametrize("radix", [4, 6])
def test_on_a_fat_tree_no_two_probes_of_a_round_may_share_a_link(radix: int) -> None:
    topology = fat_tree(radix**3 // 4, radix)  # three tiers: pods of ToRs and aggregation switches
    graph = nx.Graph(topology)
    names = hosts(topology)
    nics = [host_nic(topology, h) for h in names]
    edges, pod = probe_tiers(topology, names)
    assert len(set(pod.values())) == radix and len(set(edges.values())) == radix**2 // 2
    rounds = probe_rounds(len(names), [[edges[h] for h in names], [pod[h] for h in names]])
    assert sorted(sorted(p) for r in rounds for p in r) == [[a, b] for a in range(len(names))
                                                            for b in range(a + 1, len(names))]
    for r in rounds:
        used: set[tuple[str, str]] = set()
        for a, b in r:  # one direction at a time, as the probes run; any equal-cost path
            links = {link for path in nx.all_shortest_paths(graph, nics[a], nics[b]) for link in zip(path, path[1:])}
            assert not links & used, (a, b, links & used)
            used |= links


def test_a_learned_baseline_drops_outliers_and_needs_enough_nights() -> None:
    rules = Rules()
    assert learned([10.0, 10.5], rules) is None
    baseline = learned([10.0, 10.4, 9.8, 0.5, 10.2], rules)  # one broken night is not the baseline
    assert baseline.value == pytest.approx(10.1) and "4 earlier runs" in baseline.source
    bandwidth = Metric("send_gbps", 7.0, "Gb/s", True)
    assert judge(bandwidth, Baseline(10.0, 0.0, "file"), rules) == ("warn", pytest.approx(0.3))
    assert judge(Metric("send_gbps", 4.0, "Gb/s", True), Baseline(10.0, 0.0, "file"), rules)[0] == "fail"
    assert judge(Metric("time_ms", 13.0, "ms", False), Baseline(10.0, 0.0, "file"), rules)[0] == "warn"
    assert judge(bandwidth, Baseline(10.0, 0.2, "noisy history"), rules)[0] == "pass"  # within 3 sigma (log)
    # Noise is a factor, not an amount: nights of 6.06, 4.87 and 2.41 Gb/s do not hide a drop to 0.19.
    noisy = learned([6.06, 4.87, 2.41], rules)
    assert noisy.value == pytest.approx(4.87)
    assert judge(Metric("recv_gbps", 0.19, "Gb/s", True), noisy, rules)[0] == "fail"
    assert judge(Metric("recv_gbps", 2.5, "Gb/s", True), noisy, rules)[0] == "pass"  # within that noise


def test_what_the_hosts_lost_together_is_the_jobs_and_a_host_regresses_beyond_it() -> None:
    from dpro.anomaly.health.config import HealthConfig
    from dpro.anomaly.health.model import JOB, Check, HealthReport, Node
    from dpro.anomaly.health.rules import apply_rules
    from dpro.anomaly.suspects import Suspect

    def night(*rates: float, suspected: tuple[int, ...] = ()) -> dict[str, Check]:
        typical = float(np.median([r for i, r in enumerate(rates) if i not in suspected]))
        nodes = [Node(f"h{i}", [Check("pairwise", metrics=[Metric("send_gbps", r, "Gb/s", True)])])
                 for i, r in enumerate([*rates, typical])]
        nodes[-1].host = JOB
        report = HealthReport("t0", "t1", nodes, [Suspect("host", f"h{i}", 5.0, host=f"h{i}") for i in suspected])
        apply_rules(report, HealthConfig(rules=Rules(degraded_pct=40, failed_pct=60)),
                    lambda host, key: [20.0, 20.5, 19.5])  # every host's earlier nights, the job's too
        return {n.host: n.checks[0] for n in report.nodes}

    # three healthy hosts 40-50% slow together beside a throttled one: the job's loss, not theirs
    slow = night(10.0, 11.0, 12.0, 0.2, suspected=(3,))
    assert [slow[h].status for h in ("h0", "h1", "h2", "h3", JOB)] == ["pass", "pass", "pass", "fail", "warn"]
    assert slow["h0"].evidence["common_change_pct"] == {"send_gbps": -45.0}
    assert ("is 99% below its baseline 20 (median of 3 earlier runs); with the 45% the unsuspected hosts' median "
            "lost taken out, 98%") in slow["h3"].message
    assert slow["h3"].evidence["regressions"]["send_gbps"]["common_change_pct"] == -45.0
    assert "is 45% worse than its baseline 20" in slow[JOB].message
    # one host behind the others is still its own regression
    alone = night(20.0, 19.0, 10.0, 21.0)
    assert [alone[h].status for h in ("h0", "h1", "h2", "h3", JOB)] == ["pass", "pass", "warn", "pass", "pass"]
    # with two unsuspected hosts, no common change is taken out: one of them would move it by half
    two = night(11.0, 11.0, 0.2, 0.2, suspected=(2, 3))
    assert [two[h].status for h in ("h0", "h1")] == ["warn", "warn"] and "common_change_pct" not in two["h0"].evidence
    # a common gain is not taken out: a host that kept its own baseline has not regressed
    assert night(40.0, 40.0, 20.0, 40.0)["h2"].status == "pass"


def test_the_history_is_migrated_by_alembic_and_matches_its_model(tmp_path: Path) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from dpro.anomaly.health.history import Base

    with History.open(f"sqlite:///{tmp_path}/deep/health.db") as history:
        with history.engine.connect() as connection:
            context = MigrationContext.configure(connection)
            assert context.get_current_revision() == "0002"
            assert compare_metadata(context, Base.metadata) == []


def test_bad_config_and_bad_database_are_one_line_errors_with_exit_code_3(tmp_path: Path) -> None:
    bad = tmp_path / "health.yaml"
    for text, fragment in (("collectives: {sizes: [1]}", "unknown key collectives.'sizes'"),
                           ("pairwise: {seconds: fast}", "pairwise.seconds"),
                           ("pairwise: {sweeps: 0}", "pairwise.sweeps must be at least 1"),
                           ("pairwise: {routes: ecmp}", "pairwise.routes is one of unknown, destination"),
                           ("pairwise: {routes: destination}", "needs the topology"),
                           ("rules: {degraded_pct: 60, failed_pct: 50}", "degraded_pct <= failed_pct"),
                           ("baseline: missing.yaml", "does not exist"), ("- a list", "mapping")):
        bad.write_text(text)
        result = _health("--config", bad)
        assert result.returncode == 3
        assert_one_line_error(result, fragment)
    result = _health("--db", "nosuchdb://x")
    assert result.returncode == 3
    assert_one_line_error(result, "cannot open the health database")
    assert _health("--no-such-option").returncode == 3


def test_alone_it_runs_its_own_processes_reports_and_remembers(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/health.db"
    first = _health("-o", tmp_path / "night1", "--db", db)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "dpro health: healthy"
    report = json.loads((tmp_path / "night1" / "health.json").read_text())
    assert report["verdict"] == "healthy" and report["world_size"] == 2 and report["suspects"] == []
    job = next(n for n in report["nodes"] if n["host"] == "job")
    all_reduce = next(c for c in job["checks"] if c["name"] == "collective.all_reduce")
    assert {m["name"] for m in all_reduce["metrics"]} >= {"busbw_gbps_1mb", "busbw_gbps_16mb"}
    assert (tmp_path / "night1" / "health.md").read_text().startswith("# dpro health: healthy")
    # the CPU time the hypervisor took, read from the real /proc/stat: recorded, and on one host never judged
    [host] = [n for n in report["nodes"] if n["host"] != "job"]
    [cpu] = [c for c in host["checks"] if c["name"] == "cpu"]
    assert cpu["status"] == "pass" and [m["name"] for m in cpu["metrics"]] == ["steal_pct"], cpu
    assert 0 <= cpu["metrics"][0]["value"] <= 100 and cpu["metrics"][0]["higher_is_better"] is None
    # plotly.js once, beside the night's folder, where the next nights' pages find it
    [plotly] = tmp_path.glob("plotly-*.min.js")
    assert f"<script src='../{plotly.name}'" in (tmp_path / "night1" / "health.html").read_text()
    # nothing is overwritten
    again = _health("-o", tmp_path / "night1", "--db", db)
    assert again.returncode == 3
    assert_one_line_error(again, "health.json exists")
    # a baseline far above what this machine does (but never failing: failed_pct 100): degraded, and why
    (tmp_path / "baseline.yaml").write_text("collective.all_reduce/busbw_gbps_16mb: 100000\n")
    (tmp_path / "health.yaml").write_text("baseline: baseline.yaml\ncollectives: {ops: [all_reduce]}\n"
                                          "rules: {failed_pct: 100}\n")
    second = _health("-o", tmp_path / "night2", "--db", db, "--config", tmp_path / "health.yaml")
    assert second.returncode == 1, second.stderr
    assert "busbw_gbps_16mb" in second.stdout and "baseline file" in second.stdout
    with History.open(db) as history:
        runs = history.runs()
    assert [r["verdict"] for r in runs] == ["degraded", "healthy"]


def _proc_stat(path: Path, busy: int, steal: int) -> None:
    """A written ``/proc/stat`` whose CPUs spent ``busy`` ticks in user time and ``steal`` stolen."""
    path.write_text(f"cpu  {busy} 0 0 1000 0 0 0 {steal} 0 0\ncpu0 {busy} 0 0 1000 0 0 0 {steal} 0 0\n")


def test_the_cpu_check_keeps_the_share_the_hypervisor_took_and_skips_a_kernel_without_steal(tmp_path: Path) -> None:
    from dpro.anomaly.health.cpu import CpuWatch

    stat = tmp_path / "stat"
    _proc_stat(stat, 100, 10)
    watch = CpuWatch(stat)
    watch.start()
    _proc_stat(stat, 400, 110)  # 300 ticks busy, 100 stolen
    [check] = watch.finish()
    assert check.status == "pass" and check.metrics[0].name == "steal_pct", check
    assert check.metrics[0].value == pytest.approx(25.0) and not check.metrics[0].comparable
    stat.write_text("cpu  1 2 3 4\n")  # before 2.6.11: no steal column
    watch.start()
    [check] = watch.finish()
    assert check.status == "skip" and "no steal time" in check.message, check


def test_a_host_that_lost_more_cpu_than_the_others_warns_and_its_suspects_say_so() -> None:
    from dpro.anomaly.health.config import HealthConfig
    from dpro.anomaly.health.cpu import judge_steal
    from dpro.anomaly.health.job import _judge
    from dpro.anomaly.health.model import Check, HealthReport, Node
    from dpro.anomaly.suspects import Suspect

    def cpu(share: float) -> Check:
        return Check("cpu", metrics=[Metric("steal_pct", 100 * share, "%")], evidence={"steal_share": share})

    def judged(*shares: float, suspects: list[Suspect] = ()) -> HealthReport:
        report = HealthReport("t0", "t1", [Node(f"h{i}", [cpu(s)]) for i, s in enumerate(shares)], list(suspects))
        judge_steal(report)
        return report

    def warned(r: HealthReport) -> list[str]:
        return [n.host for n in r.nodes if n.checks[0].status == "warn"]

    nic, other = Suspect("nic", "h0/nic0", 5.0, host="h0"), Suspect("nic", "h1/nic0", 4.5, host="h1")
    stolen = judged(0.31, 0.02, 0.03, 0.01, suspects=[nic, other])
    assert warned(stolen) == ["h0"] and "the hypervisor took 31%" in stolen.nodes[0].checks[0].message
    assert stolen.nodes[0].checks[0].evidence["other_hosts_steal_share"] == 0.02
    assert nic.evidence == {"steal_share": 0.31, "other_hosts_steal_share": 0.02} and other.evidence == {}
    assert warned(judged(0.31, 0.30, 0.33)) == []  # one contended machine (or cloud): no host stands out
    assert warned(judged(0.5)) == []  # one host: nothing to compare with
    assert warned(judged(0.11, 0.02, 0.02)) == []  # 9 points above the others'
    assert warned(judged(0.12, 0.02, 0.02)) == ["h0"]  # 10 points: 0.0999... in floats, named
    # the check's judge calls it: gathered from each host's leader, judged on rank 0
    report = _judge(HealthConfig(), None, "t0", ["a", "b", "c"], [("a", [cpu(0.4)]), ("b", [cpu(0.01)]),
                                                                  ("c", [cpu(0.02)])], [], None, None, "gloo")
    assert [n.host for n in report.nodes if any(c.status == "warn" for c in n.checks)] == ["a"], report.nodes


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory) -> Path:
    """The stand-in NVML driver library built from tests/fakes/fake_nvml.c (two GPUs)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is needed to build the stand-in NVML library")
    folder = tmp_path_factory.mktemp("fake-nvml")
    subprocess.run([gcc, "-shared", "-fPIC", "-o", folder / "libnvidia-ml.so.1", FAKES / "fake_nvml.c"], check=True)
    return folder


@pytest.mark.parametrize("faults, verdict, code, says", [
    ("", "healthy", 0, "checks passed"),
    ("ecc", "failed", 1, "gpu1.ecc: 2 uncorrected ECC errors"),
    ("xid", "failed", 1, "gpu1.xid: XID 79"),
    ("pcie", "degraded", 1, "gpu1.pcie: PCIe link x8, below the device's x16"),
    ("nvlink", "degraded", 1, "gpu1.nvlink: NVLink 2 down"),
    ("thermal", "degraded", 1, "gpu1.throttle: clocks held down: software thermal slowdown"),
])
def test_node_problem_detector_mode_reads_the_gpus_through_nvml(fake_nvml: Path, tmp_path: Path, faults: str,
                                                                verdict: str, code: int, says: str) -> None:
    result = _health("--npd", "--db", f"sqlite:///{tmp_path}/h.db",
                     env={"LD_LIBRARY_PATH": str(fake_nvml), "FAKE_NVML_FAULTS": faults})
    assert result.returncode == code, result.stderr
    line = result.stdout.strip()
    assert "\n" not in line and len(line) <= 80 and line.startswith(verdict) and says[:60] in line


def test_a_gpu_fault_fails_the_node_in_the_full_check(fake_nvml: Path, tmp_path: Path) -> None:
    result = _health("-o", tmp_path / "out", "--db", f"sqlite:///{tmp_path}/h.db", "--config", _quick(tmp_path),
                     env={"LD_LIBRARY_PATH": str(fake_nvml), "FAKE_NVML_FAULTS": "xid"})
    assert result.returncode == 2, result.stderr
    report = json.loads((tmp_path / "out" / "health.json").read_text())
    host = next(n for n in report["nodes"] if n["host"] != "job")
    xid = next(c for c in host["checks"] if c["name"] == "gpu1.xid")
    assert host["verdict"] == "failed" and xid["evidence"]["xids"] == [79]


def _quick(folder: Path) -> Path:
    config = folder / "quick.yaml"
    config.write_text("collectives: {ops: [all_reduce], sizes_mb: [1], iterations: 2}\n"
                                              "pairwise: {seconds: 0.08}\n")
    return config


# -- a namespace cluster, several nights ---------------------------------------------------------


@pytest.fixture(scope="module")
def nights(tmp_path_factory) -> list[tuple[list[subprocess.CompletedProcess], dict]]:
    """Four nights of ``torchrun --no-python ... dpro health`` on 4 namespace hosts sharing one
    history; host 2's link is throttled to 200 Mbit/s on the last night only."""
    reason = can_build_namespaces()
    if reason:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("nights")
    # Loopback probes between namespaces on a shared 2-core machine: a healthy host's rates move
    # a median 21-35% between two healthy nights (benchmarks.health_nights, 2026-12-07), and its
    # rate on the throttled night is the mean of two probes. There the healthy hosts' probes also
    # fall together (the median host up to 64% below its baseline in exploratory sessions, not
    # kept), which flagged a healthy host in CI before the rules took that
    # common change out. This cluster's operator sets its thresholds (the benchmark's) above the
    # median move between healthy nights (21-35%; single moves reach several times that). What
    # is left beyond the common change reached 46% in 10 sessions and, once in 10 more, 64%
    # beside a busy core: this test can still fail on a heavily loaded machine (at these
    # thresholds 1 of 10 busy sessions, 0 of 10 quiet ones). The throttle costs 98%.
    (folder / "health.yaml").write_text(NIGHTS_CONFIG)
    program = [Path(sys.executable).parent / "dpro", "health", "--db", f"sqlite:///{folder}/health.db",
               "--config", folder / "health.yaml"]
    results = []
    with NetnsCluster(4, prefix="dh") as cluster:
        for night in range(4):
            if night == 3:
                cluster.throttle(2, "200mbit")
            runs = torchrun_across_hosts(cluster, [*program, "-o", folder / f"night{night}"], no_python=True,
                                         timeout=300)
            results.append((runs, json.loads((folder / f"night{night}" / "health.json").read_text())))
    return results, folder


@pytest.mark.privileged
@pytest.mark.slow
def test_the_throttled_host_is_named_first_and_no_other_is_flagged(nights) -> None:
    results, folder = nights
    for runs, report in results[:3]:
        assert report["verdict"] == "healthy", report
        assert all(r.returncode == 0 for r in runs)
    runs, report = results[3]
    assert report["suspects"][0]["name"] == "dh-h2" and report["suspects"][0]["kind"] == "host"
    assert len(report["suspects"]) == 1
    verdicts = {n["host"]: n["verdict"] for n in report["nodes"]}
    # its probes fell ~98% below the others' (200 Mbit/s on a 10 Gb/s veth): past failed_pct (75)
    assert verdicts["dh-h2"] == "failed", report["suspects"][0]
    assert report["suspects"][0]["evidence"]["severity"] == "failed" and report["suspects"][0]["evidence"]["drop_pct"] >= 75
    flagged = [(n["host"], c["name"], c["message"]) for n in report["nodes"] if n["host"] in ("dh-h0", "dh-h1", "dh-h3")
               for c in n["checks"] if c["status"] in ("warn", "fail")]
    assert not flagged and all(verdicts[h] == "healthy" for h in ("dh-h0", "dh-h1", "dh-h3")), flagged
    # the job's own rates: the median unsuspected host's, where what the hosts lost together is judged
    rates = {n["host"]: {m["name"]: m["value"] for c in n["checks"] if c["name"] == "pairwise" for m in c["metrics"]}
             for n in report["nodes"]}
    assert rates["job"]["send_gbps"] == pytest.approx(np.median([rates[h]["send_gbps"] for h in ("dh-h0", "dh-h1", "dh-h3")]))
    assert all(r.returncode != 0 for r in runs)  # torchrun passes on the verdict as a failure
    # every probe is kept beside the report, and read back points at the same host
    probes = read_probes(folder / "night3" / "probes.csv")
    assert sorted(probes.hosts) == [f"dh-h{i}" for i in range(4)] and len(probes.value) >= 12
    assert [(s.kind, s.name) for s in analyze(probes)][:1] == [("host", "dh-h2")]


@pytest.mark.privileged
@pytest.mark.slow
def test_the_history_flags_the_last_nights_regression(nights) -> None:
    _, folder = nights
    result = dpro("health", "history", "--db", f"sqlite:///{folder}/health.db", "--json")
    assert result.returncode == 1, result.stderr
    found = json.loads(result.stdout)
    assert [r["verdict"] for r in found["runs"]][:3] == ["healthy"] * 3 and len(found["runs"]) == 4
    flagged_hosts = {r["host"] for r in found["regressions"]}
    assert "dh-h2" in flagged_hosts and not flagged_hosts & {"dh-h0", "dh-h1", "dh-h3"}
    recv = found["nodes"]["dh-h2"]["pairwise/recv_gbps"]
    assert len(recv["values"]) == 4 and recv["status"].startswith("regression")


@pytest.mark.privileged
@pytest.mark.slow
def test_the_last_nights_page_leads_with_the_verdict_and_the_throttled_host(nights, browser, capsys) -> None:
    _, folder = nights
    page = folder / "night3" / "health.html"
    browser.get_log("browser")  # what earlier pages logged
    browser.set_window_size(1400, 900)
    browser.get(page.as_uri())
    WebDriverWait(browser, 30).until(lambda b: b.execute_script(
        "return Array.from(document.querySelectorAll('.js-plotly-plot')).filter(gd => gd._fullLayout).length >= 2"))
    verdict = browser.execute_script("""const a = document.getElementById('verdict'), r = a.getBoundingClientRect();
        return {text: a.innerText, top: r.top, bottom: r.bottom, height: window.innerHeight}""")
    assert verdict["text"].startswith("Verdict: failed") and "Top suspect: host dh-h2" in verdict["text"], verdict
    assert 0 <= verdict["top"] and verdict["bottom"] <= verdict["height"], "on the first screen"
    checks = [r.text for r in browser.find_elements(
        By.XPATH, "//h2[starts-with(., 'Checks')]/following-sibling::table[1]//tr")]
    assert checks[1].startswith("dh-h2 pairwise FAIL"), checks[:5]  # failing first
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    sizes = {p.name: p.stat().st_size for p in page.parent.iterdir()}
    [plotly] = folder.glob("**/plotly-*.min.js")  # one copy for the four nights, in the folder that holds them
    with capsys.disabled():
        print(f"\nhealth report sizes (bytes): {sizes}; {plotly.name} {plotly.stat().st_size} once for 4 nights")
    assert sizes["health.html"] < 1e6 and plotly.parent == folder


@pytest.mark.privileged
@pytest.mark.slow
def test_a_first_night_far_below_the_line_rate_is_not_ok(tmp_path: Path) -> None:
    """No history, no baseline file: two hosts whose links run at 20 Mbit/s behind 10 Gb/s veths
    (500 times slower). The all-reduce and both hosts' probes fall below 1% of the line rate
    (the stated rule, ``rules.line_rate_pct``) and are flagged; the NICs, with nothing to compare
    with, read "no baseline", never "ok"."""
    reason = can_build_namespaces()
    if reason:
        pytest.skip(reason)
    (tmp_path / "health.yaml").write_text("collectives: {ops: [all_reduce], sizes_mb: [1], iterations: 2}\n"
                                          "pairwise: {seconds: 0.2}\n")
    with NetnsCluster(2, prefix="dl", rates={0: "20mbit", 1: "20mbit"}) as cluster:
        runs = torchrun_across_hosts(cluster, [Path(sys.executable).parent / "dpro", "health", "-o", tmp_path / "out",
                                               "--db", f"sqlite:///{tmp_path}/h.db", "--config", tmp_path / "health.yaml"],
                                     no_python=True, timeout=300)
    assert (tmp_path / "out" / "health.json").exists(), runs[0].stderr[-2000:]
    report = json.loads((tmp_path / "out" / "health.json").read_text())
    assert report["verdict"] == "degraded", report
    checks = {(n["host"], c["name"]): c for n in report["nodes"] for c in n["checks"]}
    reduce = checks[("job", "collective.all_reduce")]
    assert reduce["status"] == "warn" and "of the NICs' line rate 10 Gb/s" in reduce["message"], reduce
    assert all(checks[(h, "pairwise")]["status"] == "warn" for h in ("dl-h0", "dl-h1"))
    markdown = (tmp_path / "out" / "health.md").read_text()
    assert "| job | collective.all_reduce | WARN |" in markdown
    nics = [line for line in markdown.splitlines() if " | nic." in line]
    assert nics and all(" | no baseline | " in line for line in nics), nics


@pytest.fixture(scope="module")
def health_dashboard(nights):
    """``dpro dashboard --health-db`` over the four nights' history, no run, on a free local port; its URL."""
    _, folder = nights
    server, url = start_dashboard("--health-db", f"sqlite:///{folder}/health.db")
    yield url
    server.terminate()
    server.wait(timeout=30)


def _plotted(browser, element_id: str) -> list[dict]:
    """The traces plotly drew in the graph ``element_id``."""
    return browser.execute_script(f"return document.querySelector('#{element_id} .js-plotly-plot').data")


@pytest.mark.privileged
@pytest.mark.slow
def test_the_dashboard_shows_the_nights_the_regression_and_the_last_matrix(browser, health_dashboard) -> None:
    hosts = ["dh-h0", "dh-h1", "dh-h2", "dh-h3"]
    wait = WebDriverWait(browser, 60, ignored_exceptions=(StaleElementReferenceException,))
    browser.get_log("browser")  # what earlier pages logged
    browser.get(health_dashboard + "/")  # no run: the Health page is the only one
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#health-matrix .main-svg"))
    assert [a.get_attribute("id") for a in browser.find_elements(By.CSS_SELECTOR, "a[id^=nav-]")] == ["nav-health"]
    # a row per night, a column per host (and the run's verdict): the last night's dh-h2 not healthy
    grid = _plotted(browser, "health-verdicts")[0]
    assert len(grid["y"]) == 4 and grid["x"][0] == "run" and set(hosts) <= set(grid["x"])
    verdicts = [dict(zip(grid["x"], row)) for row in grid["text"]]  # oldest night first
    assert all(night[h] == "healthy" for night in verdicts[:3] for h in hosts)
    assert verdicts[3]["dh-h2"] in ("degraded", "failed") and verdicts[3]["run"] != "healthy"
    assert all(h in browser.find_element(By.ID, "health-verdicts").text for h in hosts)
    # the last night's matrix
    matrix = _plotted(browser, "health-matrix")[0]
    assert matrix["type"] == "heatmap" and matrix["x"] == hosts == matrix["y"]
    assert browser.find_elements(By.CSS_SELECTOR, "#health-matrix .hm image")
    # the regressions: dh-h2 and no other host (the job-wide collectives may be listed too)
    flagged = {td.text for td in browser.find_elements(By.CSS_SELECTOR, "#health-regressions tbody td:first-child")}
    assert "dh-h2" in flagged and not flagged & {"dh-h0", "dh-h1", "dh-h3"}, flagged
    assert "dh-h2" in browser.find_element(By.ID, "health-suspects").text
    # the trend of the default metric, a line per host, dh-h2's last night marked
    trend = _plotted(browser, "health-trend")
    assert [t["name"] for t in trend[:4]] == hosts and all(len(t["y"]) == 4 for t in trend[:4])
    assert trend[-1]["name"] == "regression" and [m.split(":")[0] for m in trend[-1]["hovertext"]] == ["dh-h2"]
    # another metric redraws it
    title = "return document.querySelector('#health-trend .js-plotly-plot').layout.title.text"
    assert browser.execute_script(title).startswith("pairwise/recv_gbps ")
    browser.find_element(By.ID, "health-metric").click()
    option = wait.until(lambda b: [o for o in b.find_elements(By.CSS_SELECTOR, "[role=option]")
                                   if o.text == "pairwise/send_gbps"])[0]
    browser.execute_script("arguments[0].scrollIntoView()", option)
    option.click()
    wait.until(lambda b: b.execute_script(title).startswith("pairwise/send_gbps "))
    assert [t["name"] for t in _plotted(browser, "health-trend")[:4]] == hosts
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "health.png"))
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_the_dashboard_needs_a_run_or_an_existing_health_history(tmp_path: Path) -> None:
    assert_one_line_error(dpro("dashboard"), "give a RUN, or --health-db URL")
    topology = tmp_path / "topology.yaml"
    topology.write_text("switches: [leaf0]\nhosts: {a: [], b: []}\nlinks: [[a, leaf0], [b, leaf0]]\n")
    assert_one_line_error(dpro("dashboard", "--health-db", "sqlite:///x.db", "--topology", topology),
                          "--topology goes with a RUN")
    missing = tmp_path / "nowhere" / "health.db"
    assert_one_line_error(dpro("dashboard", "--health-db", f"sqlite:///{missing}"), "no such file", str(missing))
    assert not missing.parent.exists()  # never created
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("create table t (x)").connection.close()
    assert_one_line_error(dpro("dashboard", "--health-db", f"sqlite:///{other}"), "not a health history")


def _health_on_a_routed_fabric(tmp_path: Path, routes: str, pairwise: str) -> dict:
    """``dpro health`` across a routed leaf-spine of namespaces (3 leaves of 4 hosts, 2 spines,
    routed by ``routes``) whose ``leaf0 -> spine0`` is throttled to 100 Mbit/s; its report.
    ``pairwise``: the config's pairwise line."""
    reason = can_build_namespaces()
    if reason:
        pytest.skip(reason)
    from tools.testing.fabric import RoutedFabric

    with RoutedFabric(leaves=3, spines=2, hosts_per_leaf=4, routes=routes) as fabric:
        fabric.throttle_link("leaf0", "spine0", "100mbit")
        fabric.write_topology(tmp_path / "fabric.yaml")
        (tmp_path / "health.yaml").write_text("topology: fabric.yaml\n"
                                              "collectives: {ops: [all_reduce], sizes_mb: [1], iterations: 2}\n"
                                              f"{pairwise}\n")
        runs = torchrun_across_hosts(fabric, [Path(sys.executable).parent / "dpro", "health", "-o", tmp_path / "out",
                                              "--db", f"sqlite:///{tmp_path}/h.db", "--config", tmp_path / "health.yaml"],
                                     no_python=True, timeout=300)
    assert (tmp_path / "out" / "health.json").exists(), runs[0].stderr[-2000:]
    report = json.loads((tmp_path / "out" / "health.json").read_text())
    # every probe is kept beside the report: read back, they name what the report names
    probes = read_probes(tmp_path / "out" / "probes.csv")
    assert probes.both_ways == (routes == "destination")
    topology = from_spec(json.loads((tmp_path / "fabric.yaml").read_text()))
    routing = Routing.build(topology, by="destination") if routes == "destination" else None
    again = to_json(localize(topology, probes, z_class=FOLLOWED_Z_CLASS, routing=routing))["suspects"]
    assert [s["name"] for s in again] == [s["name"] for s in report["suspects"]], (again, report["suspects"])
    return report


ROUTED_TRIES = 3


def _routed_check_naming_only_links(tmp_path: Path, routes: str, pairwise: str) -> tuple[dict, Path]:
    """:func:`_health_on_a_routed_fabric`, made again where it named a link first and anything but
    links beside it (a host, NIC or switch), up to :data:`ROUTED_TRIES` checks, the folder of
    each kept. A check that names anything else first is returned as it is, for the test to
    fail: naming a switch in place of its uplink was a mended fault of the localizer ("the
    narrowest class" in docs/health/README.md). The 2 shared cores' probes are noisy: a loaded
    CI's check named a host or NIC beside the uplink once (at 18101d1) and switch ``leaf2`` once
    (at 960068e), and of the 60 routed runs kept and replayed (docs/health/README.md, "Still
    open") ECMP run 9 names ``dfab-h4``'s NIC and ``leaf2``'s uplinks beside it, a miss of the
    localizer left open. A check made again warns (``-ra`` lists it) with what it named and the
    CPU the hypervisor took meanwhile; its folder, ``probes.csv`` with it, stays in
    ``tmp_path``. Fails where every check named more than links."""
    named = []
    for attempt in range(ROUTED_TRIES):
        folder = tmp_path / f"check{attempt}"
        folder.mkdir()
        before, _ = read_cpu_times()
        report = _health_on_a_routed_fabric(folder, routes, pairwise)
        suspects = report["suspects"]
        others = [(s["kind"], s["name"], round(s["score"], 2)) for s in suspects[1:] if s["kind"] != "link"]
        if not suspects or suspects[0]["kind"] != "link" or not others:
            return report, folder
        named.append({"named": others, "stolen_cpu": steal_share(before, read_cpu_times()[0]), "folder": str(folder)})
        warnings.warn(f"the routed health check named more than links beside the first, made again: {named[-1]}",
                      stacklevel=2)
    pytest.fail(f"every check named more than links: {named}")


@pytest.mark.privileged
@pytest.mark.slow
def test_on_a_routed_fabric_the_slow_direction_of_a_leaf_uplink_is_named_not_a_host(tmp_path: Path) -> None:
    """Three leaves of four hosts, two spines, ECMP between leaves (hashed on ports: each
    connection its own path); what leaf0 sends to spine0 is throttled to 100 Mbit/s. Leaf0's
    hosts have 32 connections out of it. On this machine's noisy probes the localizer needs
    about 5 of them through spine0 (its counted score: 5 very slow probes of 32, where few
    others are); that fewer take it has odds of 1 in 100,000 (with three hosts a leaf, 5 of 18
    were needed and missed with odds of 1 in 65). Each probe measured once: here a probe is
    bound by the 2 shared cores, and rank 0's host (the store, the barriers' root) is the
    busiest, a bias that the medians of short repeats bring past the threshold (8 repeats named
    its NIC too in 2 of 3 runs of 10 ms repeats and 1 of 2 of 50 ms). A check that names more
    than links beside the uplink even so is made again, with a warning
    (:func:`_routed_check_naming_only_links`)."""
    report, _ = _routed_check_naming_only_links(tmp_path, "ecmp", "pairwise: {seconds: 0.08, sweeps: 1}")
    assert report["suspects"], report["pairwise"]
    first = report["suspects"][0]
    named = {first["name"], *first["evidence"]["same_as"]}
    assert first["kind"] == "link" and "leaf0->spine0" in named, report["suspects"]
    assert named <= {"leaf0->spine0", "leaf0->spine1"}  # leaf0's uplinks: no probe tells them apart
    assert all(s["kind"] == "link" for s in report["suspects"]), report["suspects"]
    assert all(n["verdict"] == "healthy" for n in report["nodes"] if n["host"] != "job"), \
        [(n["host"], [c["message"] for c in n["checks"] if c["status"] != "pass"]) for n in report["nodes"]]
    # the drop is diluted by the probes ECMP may have sent over leaf0's other uplink: either grade, as it says
    evidence = first["evidence"]
    assert evidence["severity"] == ("failed" if evidence["drop_pct"] >= 50 else "degraded"), evidence
    assert report["verdict"] == max((s["evidence"]["severity"] for s in report["suspects"]),
                                    key=["degraded", "failed"].index), report["suspects"]


@pytest.mark.privileged
@pytest.mark.slow
def test_routes_by_destination_probe_both_ways_in_fewer_rounds_and_still_name_the_uplink(tmp_path: Path) -> None:
    """The same fabric routed by destination (a /32 route a host, over spine ``d mod 2``), and
    the check told so: its first sweep takes the schedule for known routes, each pair both ways
    at once, and names leaf0's throttled uplink as before."""
    report, folder = _routed_check_naming_only_links(tmp_path, "destination",  # each probe once: see the test above
                                                  "pairwise: {seconds: 0.08, sweeps: 1, routes: destination}")
    topology = from_spec(json.loads((folder / "fabric.yaml").read_text()))
    names = hosts(topology)
    safe = len(probe_rounds(len(names), [[t[h] for h in names] for t in probe_tiers(topology, names)]))
    assert report["pairwise"]["routes"] == "destination"
    assert report["pairwise"]["first_sweep_rounds"] < safe, (report["pairwise"], safe)
    first = report["suspects"][0]
    named = {first["name"], *first["evidence"]["same_as"]}
    assert first["kind"] == "link" and named == {"leaf0->spine0"}, report["suspects"]  # the routes tell the uplinks apart
    # the partners of its probes, slowed by acknowledgements queued behind them, name no downlink into leaf0
    assert not [s for s in report["suspects"] if s["name"].endswith("->leaf0")], report["suspects"]
    assert all(n["verdict"] == "healthy" for n in report["nodes"] if n["host"] != "job"), \
        [(n["host"], [c["message"] for c in n["checks"] if c["status"] != "pass"]) for n in report["nodes"]]
    assert report["verdict"] == "failed" and first["evidence"]["severity"] == "failed", first  # 100 Mbit/s of 10 Gb/s


def test_collectives_are_sized_by_time_and_a_size_too_slow_for_its_share_is_cut(tmp_path: Path) -> None:
    import torch
    import torch.distributed as dist

    from dpro.anomaly.health.collective_bench import run_collectives

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        cpu = torch.device("cpu")
        slow = run_collectives(("all_reduce",), (16.0, 1.0), 5, cpu, seconds=1e-7)[0]
        quick = run_collectives(("all_reduce",), (1.0,), 3, cpu, seconds=60.0)[0]
    finally:
        dist.destroy_process_group()
    assert slow.evidence["timed_calls"] == {"1mb": 0}, "the warm-up took its whole share: its time is the finding"
    assert [m.name for m in slow.metrics] == ["busbw_gbps_1mb", "time_ms_1mb"], "the smaller size first, 16 MB cut"
    assert slow.message.startswith("cut 16 MB: one call would take") and slow.evidence["cut"]
    assert quick.evidence["timed_calls"] == {"1mb": 3} and "cut" not in quick.evidence and not quick.message


def test_a_check_whose_time_budget_runs_out_says_what_it_cut_and_is_still_kept(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/health.db"
    cut = _health("-o", tmp_path / "cut", "--db", db, "--time-budget", "1e-9")
    assert cut.returncode == 0, cut.stderr
    report = json.loads((tmp_path / "cut" / "health.json").read_text())
    job = next(n for n in report["nodes"] if n["host"] == "job")
    collectives = [c for c in job["checks"] if c["name"].startswith("collective.")]
    assert collectives and all(c["status"] == "skip" and "time budget (1e-09 s) ran out" in c["message"]
                               for c in collectives), collectives
    assert report["time_budget_s"] == 1e-9
    with History.open(db) as history:
        assert len(history.runs()) == 1, "the cut check is in the history"
    assert_one_line_error(_health("--time-budget", "0"), "--time-budget")
    (tmp_path / "bad.yaml").write_text("time_budget_s: -5\n")
    assert_one_line_error(_health("--config", tmp_path / "bad.yaml"), "time_budget_s")


def test_a_class_without_healthy_peers_needs_more_evidence() -> None:
    """Every probe between the leaves of a leaf-spine may cross either spine: the spines are one
    class with no probe of their length outside it. A lower tail there (other tenants' traffic
    skews it as a spine's fault would) past ``z_class`` but short of ``no_peers`` times it is not named."""
    fabric = leaf_spine(4, 4, 2)
    topology = from_spec(topology_spec(fabric))
    rng = np.random.default_rng(5)
    src, dst = (np.array(side) for side in zip(*[(a, b) for a in range(16) for b in range(16) if a != b]))
    between = src // 4 != dst // 4
    value = 100 * np.exp(rng.normal(0, 0.03, len(src)))
    value[between] *= np.where(rng.random(between.sum()) < 0.2, 0.8, 1.0)  # a skewed tail between leaves
    probes = Probes(fabric.hosts, src, dst, np.zeros(len(src), np.int64), value)
    named = localize(topology, probes, no_peers=1.0)
    assert named and named[0].kind == "switch" and named[0].name.startswith("spine"), named
    assert not any(s.name.startswith("spine") for s in localize(topology, probes, no_peers=1.5))


def test_a_pair_probes_both_ways_at_once_over_gloo_without_mixing_its_streams() -> None:
    """Two local ranks probe each other in two rounds, one way after the other and then both
    ways at once (a receiver thread, the acknowledgements on their own tag): every direction of
    every round gives a rate, and nothing hangs."""
    result = subprocess.run([*TORCHRUN, "--nproc-per-node=2", JOBS / "pairwise_both_ways.py"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    for mode in ("one", "both"):
        probes = sorted((int(s), int(d), int(r)) for s, d, r, _ in rows[mode])
        assert probes == [(0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1)], (mode, rows[mode])
        assert all(gbps > 0 for *_, gbps in rows[mode])
