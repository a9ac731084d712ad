"""C4-style localization on a real mini-cluster: 4 hosts (network namespaces with their own
hostnames, on a bridge), one host's link throttled by ``tc tbf``, a real 4-rank gloo job recorded
with one ``dpro record`` per host into one run directory, and the TCP probe engine across them.
Both the recorded run and the probe matrix must name the throttled host first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpro.anomaly.engines import get_engine
from dpro.anomaly.engines.base import Endpoint, Workload
from dpro.anomaly.fabric.pairwise import measure, write_probes
from dpro.anomaly.fabric.probes import analyze, read_probes
from dpro.anomaly.run.traffic_matrix import connection_rates
from dpro.run_format import open_run
from tools.testing.netns import NetnsCluster, can_build_namespaces, record_across_hosts

from .conftest import EXAMPLE, dpro

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

THROTTLED = 2
RATE = "40mbit"  # the others run at the bridge's speed (several Gb/s)


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    reason = can_build_namespaces()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("c4")
    run_dir, probes_path = tmp / "run", tmp / "probes.json"
    with NetnsCluster(4, rates={THROTTLED: RATE}) as cluster:
        done = record_across_hosts(cluster, run_dir, [EXAMPLE, "--steps", "16"],
                                   record_args=("--skip", "6", "--warmup", "1", "--steps", "3", "--no-calibrate"),
                                   timeout=400)
        assert [p.returncode for p in done] == [0] * 4, "\n".join(p.stderr[-2000:] for p in done)
        hosts = {h.name: Endpoint(h.ip, ("ip", "netns", "exec", h.netns), h.veth) for h in cluster.hosts}
        probes, results = measure(get_engine("tcp"), hosts, Workload(message_size=1 << 20), seconds=1.5)
        write_probes(probes, probes_path)
        throttled = cluster.hosts[THROTTLED].name
    return run_dir, probes_path, throttled


def test_the_recorded_run_names_the_throttled_host_first(cluster_run: tuple[Path, Path, str]) -> None:
    run_dir, _, throttled = cluster_run
    out = dpro("diagnose", run_dir, "--json")
    assert out.returncode == 0, out.stderr
    # but for the machine's own stolen CPU, which its namespace hosts may lose in different shares
    suspects = [s for s in json.loads(out.stdout)["suspects"] if "steal_share" not in s["evidence"]]
    rates = connection_rates(open_run(run_dir)).drop(columns=["local_ip"]).to_string()
    assert suspects and suspects[0]["host"] == throttled, f"{suspects[:3]}\n{rates}"
    assert suspects[0]["kind"] in ("host", "nic") and suspects[0]["evidence"]["source"] == "the job's TCP connections"
    assert suspects[0]["evidence"]["ranks"] == [THROTTLED], "the rank that ran there"


def test_the_probe_matrix_names_the_throttled_host_first(cluster_run: tuple[Path, Path, str]) -> None:
    run_dir, probes_path, throttled = cluster_run
    probes = read_probes(probes_path)
    assert len(probes.value) == 12, "every ordered pair of 4 hosts, in 3 rounds"
    assert analyze(probes)[0].host == throttled
    out = dpro("diagnose", run_dir, "--probes", probes_path, "--json")
    assert out.returncode == 0, out.stderr
    assert [s for s in json.loads(out.stdout)["suspects"] if "steal_share" not in s["evidence"]][0]["host"] == throttled
