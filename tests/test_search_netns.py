"""The anomaly search on real traffic: the TCP engine between two network namespaces whose path
is shaped with ``tc tbf`` so that a throughput collapse really exists.

The scenario, measured by hand first (TCP engine, 1 s runs): the client's link is throttled to
50 Mbit/s both ways; the server's uplink, the reverse path, to 5 Mbit/s with a deep queue (tbf
``latency 400ms``). Sending one way (``direction=uni``) gets about 48 Mbit/s at every message size,
connection count, batch and queue depth tried (4 KiB to 64 KiB, 1 to 4 connections, queue depth
1 to 16). Sending both ways at once (``direction=bi``) collapses to about 10 Mbit/s in all, 5 per
direction (about 0.1 of one-way): the server's data fills the slow reverse queue, and the
acknowledgements of the client's data wait behind it (ACK starvation on an asymmetric link, RFC
3449). So the collapse needs ``direction=bi`` and nothing else: that is the minimal feature set
the search must report.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from dpro.anomaly.engines.base import Direction, Endpoint
from dpro.anomaly.engines.tcp import TcpEngine
from dpro.anomaly.search.objectives import ThroughputObjective
from dpro.anomaly.search.collie import Budget, search
from dpro.anomaly.search.report import write_report
from dpro.anomaly.search.space import WorkloadSpace
from tools.testing.netns import NetnsCluster, can_build_namespaces

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

FORWARD_RATE = "50mbit"  # the client's link, both ways
REVERSE_TBF = ("rate", "5mbit", "burst", "32kb", "latency", "400ms")  # the server's uplink
DOMAINS = {"message_size": [4096, 16384, 65536], "connections": [1, 2, 4], "batch": [1, 2, 4],
           "queue_depth": [1, 4, 16]}


@pytest.fixture(scope="module", autouse=True)
def namespaces_available() -> None:
    if reason := can_build_namespaces():
        pytest.skip(reason)


def test_search_finds_the_collapse_of_both_way_traffic_on_an_asymmetric_link(tmp_path: Path) -> None:
    engine = TcpEngine()
    space = WorkloadSpace.for_engine(engine, only=[*DOMAINS, "direction"], domains=DOMAINS)
    start = time.monotonic()
    with NetnsCluster(2, prefix="dps") as cluster:
        server_host, client_host = cluster.hosts
        cluster.throttle(client_host.index, FORWARD_RATE)
        subprocess.run(["tc", "-n", server_host.netns, "qdisc", "replace", "dev", server_host.veth, "root", "tbf",
                        *REVERSE_TBF], check=True, capture_output=True)
        server, client = (Endpoint(h.ip, prefix=("ip", "netns", "exec", h.netns)) for h in cluster.hosts)
        result = search(engine, server, client, space=space, objective=ThroughputObjective(0.5),
                        budget=Budget(max_trials=24, max_seconds=80), seed=1, duration_s=1.0, timeout_s=10.0)
    paths = write_report(result, tmp_path / "report")
    print(paths["markdown"].read_text())  # the evidence, with -s
    assert time.monotonic() - start < 120

    assert result.anomalies, paths["markdown"].read_text()
    for a in result.anomalies:
        assert a.minimal == {"direction": Direction.BI} and a.complete, a
        assert result.trials[a.trial].score < 0.5 and result.trials[a.confirm].score < 0.5
        [reset] = [r for r in a.resets if r.feature == "direction"]
        assert reset.needed and reset.score > 0.7  # one way, the same workload runs at full speed
        assert all(not r.needed for r in a.resets if r.feature != "direction")
    measured = [t for t in result.trials if t.score is not None]
    one_way = [t for t in measured if t.workload.direction is Direction.UNI]
    assert one_way and not [t for t in one_way if t.anomalous]  # no false alarm
    assert all(t.workload.direction is Direction.BI for t in measured if t.anomalous)
    data = json.loads(paths["json"].read_text())
    assert data["anomalies"][0]["minimal_features"] == {"direction": "bi"}
