"""The anomaly search (simulated annealing, minimal feature sets), its workload space and its report.

The search algorithm is tested against ``ModelNic``: a deterministic MODEL of a NIC, used only to
test the algorithm. It makes no traffic and proves nothing about real NICs; the search on real
traffic (the TCP engine through a tc-throttled link) is tests/test_search_netns.py.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from dpro.cli.anomaly import anomaly
from dpro.collectors.counters.snapshot import CounterDiff, CounterRate
from dpro.anomaly.engines.base import Direction, Endpoint, Result, Workload
from dpro.anomaly.engines.tcp import TcpEngine
from dpro.anomaly.search.objectives import CounterObjective, ThroughputObjective, parse_objective
from dpro.anomaly.search.collie import Budget, SearchResult, search
from dpro.anomaly.search.report import to_json, to_markdown, write_report
from dpro.anomaly.search.space import WorkloadSpace

HERE = Endpoint("192.0.2.1")  # never contacted: the model makes no traffic
PLANTED = {"connections", "message_size"}
RDMA_FEATURES = frozenset({"opcode:send", "opcode:write", "opcode:read", "direction:uni", "direction:bi",
                           "placement:host", "connections", "batch", "queue_depth", "sges", "mtu",
                           "transport:rc", "transport:uc"})


class ModelNic:
    """A deterministic model of a NIC, for testing the search algorithm only.

    Throughput follows a per-message overhead curve and degrades gently with more connections and
    smaller messages ("strain", 0 to 1); a planted anomaly collapses it to 5 % and makes a pause
    frame storm when ``connections >= 16`` and ``message_size <= 1024``, whatever the other
    features. ``clock`` (a one-item list) advances by ``seconds_per_run`` each run."""

    name = "model"
    line_gbps = 100.0

    def __init__(self, clock: list[float] | None = None, seconds_per_run: float = 0.0) -> None:
        self.runs: list[Workload] = []
        self.clock, self.seconds_per_run = clock, seconds_per_run

    def unavailable_reason(self) -> str | None:
        return None

    def supported_features(self) -> frozenset[str]:
        return RDMA_FEATURES

    @staticmethod
    def planted(w: Workload) -> bool:
        return w.connections >= 16 and w.message_size <= 1024

    def run(self, workload: Workload, server_host: Endpoint, client_host: Endpoint,
            duration_s: float = 5.0, timeout_s: float = 10.0) -> Result:
        self.runs.append(workload)
        if self.clock is not None:
            self.clock[0] += self.seconds_per_run
        strain = math.log2(workload.connections) / 5 * math.log2(2**20 / workload.message_size) / 12
        gbps = self.line_gbps * workload.message_size / (workload.message_size + 2048)
        gbps *= 0.05 if self.planted(workload) else 1 - 0.4 * strain
        pause_per_s = 1e5 if self.planted(workload) else 1e4 * strain
        if workload.direction is Direction.BI:
            gbps *= 2
        pause = CounterRate("ethtool", "model0", "rx_pause_ctrl_phy", "rx_pause_frames", "frames",
                            int(pause_per_s * duration_s), pause_per_s)
        return Result(self.name, workload, throughput_gbps=gbps, msgs_per_s=gbps * 1e9 / 8 / workload.message_size,
                      counters={role: CounterDiff(duration_s, [pause]) for role in ("server", "client")})


class FailingModelNic(ModelNic):
    """The model, but its engine raises on 8 SGEs and reports a failure on batches of 16."""

    def run(self, workload: Workload, *args, **kwargs) -> Result:
        if workload.sges == 8:
            raise RuntimeError("model crash on 8 SGEs")
        if workload.batch == 16:
            return Result(self.name, workload, errors=["model: batch of 16 refused"])
        return super().run(workload, *args, **kwargs)


class FlakyModelNic(ModelNic):
    """The model, but the planted collapse happens only the first time a workload is run."""

    def run(self, workload: Workload, *args, **kwargs) -> Result:
        result = super().run(workload, *args, **kwargs)
        if self.planted(workload) and self.runs.count(workload) > 1:
            result.throughput_gbps *= 20
        return result


def run_search(engine: ModelNic | None = None, **kwargs) -> SearchResult:
    kwargs.setdefault("budget", Budget(120))
    return search(engine or ModelNic(), HERE, HERE, **kwargs)


# --- the workload space -------------------------------------------------------------------------


def test_space_of_the_tcp_engine() -> None:
    space = WorkloadSpace.for_engine(TcpEngine())
    assert space.names == ["message_size", "connections", "batch", "queue_depth", "sges", "mtu", "direction"]
    assert space.features["message_size"].values[:3] == (256, 512, 1024)  # log scale
    assert space.features["direction"].values == (Direction.UNI, Direction.BI)
    assert space.baseline == Workload()
    assert space.differences(Workload(connections=4, direction="bi")) == {"connections": 4, "direction": Direction.BI}


def test_neighbours_change_one_feature_and_stay_valid() -> None:
    space = WorkloadSpace.for_engine(ModelNic())
    rng, workload = random.Random(1), space.baseline
    moved = set()
    for _ in range(500):
        nxt = space.neighbour(workload, rng)
        changed = [n for n in space.names if getattr(nxt, n) != getattr(workload, n)]
        assert len(changed) == 1 and nxt.batch <= nxt.queue_depth and space.valid(nxt)
        moved.add(changed[0])
        workload = nxt
    assert moved == set(space.names)
    assert space.neighbour(space.baseline, random.Random(0), {"connections": 1.0, **{
        n: 0.0 for n in space.names if n != "connections"}}).connections != space.baseline.connections


def test_domains_and_features_are_checked() -> None:
    tcp = TcpEngine()
    space = WorkloadSpace.for_engine(tcp, only=["message_size", "direction"], domains={"message_size": ["4096", 1024]})
    assert space.names == ["message_size", "direction"]
    assert space.features["message_size"].values == (1024, 4096)
    assert space.baseline.message_size == 4096  # the default 65536 snapped into the domain
    for kwargs, message in [({"only": ["opcode"]}, "cannot vary opcode"),
                            ({"only": ["colour"]}, "no workload feature 'colour'"),
                            ({"only": ["direction"], "domains": {"connections": [1, 2]}}, "not searched"),
                            ({"domains": {"message_size": ["big"]}}, "whole numbers"),
                            ({"domains": {"direction": ["sideways"]}}, "direction is one of uni, bi")]:
        with pytest.raises(ValueError, match=message):
            WorkloadSpace.for_engine(tcp, **kwargs)
    with pytest.raises(ValueError, match="does not support transport = ud"):
        WorkloadSpace.for_engine(ModelNic(), domains={"transport": ["rc", "ud"]})


# --- the search ---------------------------------------------------------------------------------


@pytest.mark.parametrize("objective", ["throughput", "counter:rx_pause_frames"])
@pytest.mark.parametrize("seed", range(4))
def test_finds_the_planted_anomaly_and_exactly_its_features(objective: str, seed: int) -> None:
    engine = ModelNic()
    result = run_search(engine, objective=parse_objective(objective, 5e4 if "counter" in objective else None),
                        seed=seed)
    assert result.anomalies, f"no anomaly in {len(result.trials)} trials"
    assert all(a.complete for a in result.anomalies[:-1])  # only the last one can run out of budget
    for a in result.anomalies:
        assert set(a.minimal) == PLANTED if a.complete else set(a.minimal) >= PLANTED, a
        assert engine.planted(a.found) and engine.planted(a.workload)
        assert a.workload == replace(Workload(), **a.minimal)
        needed = {r.feature for r in a.resets if r.needed}
        assert needed == PLANTED if a.complete else needed <= PLANTED
        assert result.trials[a.confirm].workload == a.found and result.trials[a.confirm].kind == "confirm"
    anomalous = [t for t in result.trials if t.anomalous]
    assert all(engine.planted(t.workload) for t in anomalous)  # nothing outside the planted region
    assert len(result.trials) == 120 and len(engine.runs) == 120


def test_the_same_seed_walks_the_same_way() -> None:
    def walk(seed: int) -> list[tuple[str, Workload]]:
        return [(t.kind, t.workload) for t in run_search(seed=seed, budget=Budget(40)).trials]

    assert walk(3) == walk(3)
    assert walk(3) != walk(4)


def test_the_trial_budget_is_respected() -> None:
    engine = ModelNic()
    result = run_search(engine, budget=Budget(max_trials=7))
    assert len(result.trials) == len(engine.runs) == 7 and result.stopped == "budget spent"
    assert [t.index for t in result.trials] == list(range(7))


def test_the_time_budget_is_respected() -> None:
    clock = [0.0]
    engine = ModelNic(clock, seconds_per_run=1.0)
    result = run_search(engine, budget=Budget(max_trials=None, max_seconds=4.5), clock=lambda: clock[0])
    assert len(engine.runs) == 5 and result.elapsed_s == 5.0  # started at 0, 1, 2, 3 and 4 s
    assert [t.seconds for t in result.trials] == [1.0] * 5


def test_engine_errors_and_exceptions_are_recorded_not_fatal() -> None:
    result = run_search(FailingModelNic(), budget=Budget(150), seed=1)
    raised = [t for t in result.trials if t.result.errors == ["the engine raised RuntimeError: model crash on 8 SGEs"]]
    refused = [t for t in result.trials if t.result.errors == ["model: batch of 16 refused"]]
    assert raised and refused and len(result.trials) == 150
    assert all(t.score is None and not t.anomalous for t in raised + refused)
    assert result.anomalies and all(set(a.minimal) == PLANTED for a in result.anomalies)


def test_a_small_space_is_measured_once_then_the_search_stops() -> None:
    engine = ModelNic()
    space = WorkloadSpace.for_engine(engine, only=["connections", "direction"], domains={"connections": [1, 2]})
    result = run_search(engine, space=space, budget=Budget(50))
    assert result.stopped == "no unmeasured workload left" and not result.anomalies
    assert sorted(map(str, engine.runs)) == sorted(map(str, {*engine.runs})) and len(engine.runs) == 4


def test_a_search_whose_every_run_fails_stops_early() -> None:
    class Broken(ModelNic):
        def run(self, workload: Workload, *args, **kwargs) -> Result:
            return Result(self.name, workload, errors=["no route to host"])

    result = run_search(Broken())
    assert len(result.trials) == 5 and not result.anomalies
    assert result.stopped == "the first 5 measurements all failed, the last with: no route to host"


def test_an_anomaly_that_does_not_come_back_is_not_reported() -> None:
    result = run_search(FlakyModelNic(), seed=2)
    assert not result.anomalies and result.unconfirmed
    remeasured = [(found, again) for found, again in result.unconfirmed if again is not None]
    assert len(remeasured) >= len(result.unconfirmed) - 1  # the budget may end before the last one
    for found, again in remeasured:
        assert result.trials[found].anomalous and not result.trials[again].anomalous
        assert result.trials[again].workload == result.trials[found].workload


def test_an_anomalous_baseline_has_an_empty_minimal_feature_set() -> None:
    # Expecting 10 times the model's line rate: every workload, the baseline too, is anomalous.
    result = run_search(objective=ThroughputObjective(0.5, link_gbps=1000.0))
    [a] = result.anomalies
    assert a.minimal == {} and a.workload == Workload() and a.complete
    assert result.stopped == "the baseline itself is anomalous"


def test_a_counter_no_run_has_is_noted() -> None:
    result = run_search(objective=CounterObjective("port_xmit_wait"), budget=Budget(10))
    assert not result.anomalies and all(t.score is None for t in result.trials)
    assert result.notes == ["no measurement had the counter 'port_xmit_wait' on either endpoint"]


def test_objectives_parse_and_check_their_thresholds() -> None:
    assert parse_objective("throughput").threshold == 0.5
    assert parse_objective("counter:tx_dropped", 3).describe()["counter"] == "tx_dropped"
    for spec, threshold, link, message in [("latency", None, None, "'throughput' or 'counter:NAME'"),
                                           ("throughput", 2.0, None, "fraction"),
                                           ("counter:", None, None, "name the counter"),
                                           ("counter:x", None, 100.0, "only applies to the throughput"),
                                           ("throughput", None, -1.0, "must be positive")]:
        with pytest.raises(ValueError, match=message):
            parse_objective(spec, threshold, link)
    with pytest.raises(ValueError, match="a number of trials, a number of seconds"):
        Budget(None, None)


# --- the report ---------------------------------------------------------------------------------


def test_report_json_and_markdown(tmp_path: Path) -> None:
    result = run_search(seed=0)
    paths = write_report(result, tmp_path / "out")
    data = json.loads(paths["json"].read_text())
    assert data == json.loads(json.dumps(to_json(result)))
    assert set(data) == {"engine", "objective", "seed", "budget", "stopped", "elapsed_s", "space", "anomalies",
                         "unconfirmed", "trials", "notes"}
    assert data["engine"] == "model" and data["objective"]["name"] == "throughput"
    assert data["budget"] == {"max_trials": 120, "max_seconds": None}
    assert len(data["trials"]) == 120
    assert {t["kind"] for t in data["trials"]} == {"search", "reference", "confirm", "minimize"}
    trial = data["trials"][0]
    assert set(trial) == {"index", "kind", "changed", "score", "anomalous", "accepted", "temperature", "seconds",
                          "throughput_gbps", "msgs_per_s", "latency_us", "counters", "errors", "notes", "workload"}
    assert trial["counters"]["server"].keys() <= {"model0:rx_pause_frames"}
    first = data["anomalies"][0]
    assert set(first["minimal_features"]) == PLANTED and first["complete"]
    assert first["score"] < 0.5 and first["confirm_score"] < 0.5
    assert data["trials"][first["trial"]]["anomalous"]
    needed = {r["feature"] for r in first["resets"] if r["needed"]}
    assert needed == PLANTED and all(r["score"] >= 0.5 for r in first["resets"] if r["needed"])
    assert data["space"]["baseline"] == Workload().to_dict()

    markdown = paths["markdown"].read_text()
    assert markdown == to_markdown(result)
    assert markdown.startswith("# Anomaly search: model engine, objective throughput (anomalous below 0.5)")
    assert f"## Anomalies ({len(result.anomalies)})" in markdown
    minimal = ", ".join(f"{n}={v}" for n, v in first["minimal_features"].items())
    assert f"Minimal feature set: **{minimal}**" in markdown
    rows = [line for line in markdown.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 120
    assert "| connections | 1 |" in markdown and "| needed |" in markdown


# --- the command line ---------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--engine", "carrier-pigeon"], "no engine 'carrier-pigeon'; known: tcp, perftest, verbs"),
    (["--objective", "latency"], "objective must be 'throughput' or 'counter:NAME'"),
    (["--features", "opcode"], "the tcp engine cannot vary opcode"),
    (["--domain", "message_size"], "--domain takes NAME=V1,V2,..."),
    (["--domain", "connections=0"], "connections values must be positive"),
    (["--threshold", "5"], "fraction"),
])
def test_search_command_bad_input_is_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(anomaly, ["search", "--server", "127.0.0.1", "--client", "127.0.0.1", *args])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], \
        result.output


def test_search_command_on_localhost(tmp_path: Path) -> None:
    out = tmp_path / "search"
    result = CliRunner().invoke(anomaly, [
        "search", "--server", "127.0.0.1", "--client", "127.0.0.1", "--budget", "3", "--duration", "0.3",
        "--features", "connections,direction", "--domain", "connections=1,2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "search.json").read_text())
    assert data["engine"] == "tcp" and len(data["trials"]) == 3
    assert all(not t["errors"] and t["throughput_gbps"] > 0 for t in data["trials"])
    assert (out / "search.md").read_text().startswith("# Anomaly search: tcp engine")
    assert f"report: {out / 'search.md'}, {out / 'search.json'}" in result.output
