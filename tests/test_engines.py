"""Traffic engines: real TCP traffic between two processes, their failures and timeouts, the perftest
output parser, and the RDMA engines.

The perftest parser reads a recorded output in the real ``ib_write_bw --report_gbits -D`` format
(fixtures/perftest). The perftest and verbs engines measure where an RDMA device exists, and
must refuse clearly where none does (no tools, no pyverbs, or no device), as on CI.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from dpro.anomaly.engines import ENGINES, get_engine
from dpro.anomaly.engines.base import Direction, Endpoint, Opcode, Workload
from dpro.anomaly.engines.latency import LatencyHistogram
from dpro.anomaly.engines.perftest import PerftestEngine, parse_perftest_output
from dpro.anomaly.engines.tcp import TcpEngine
from dpro.anomaly.engines.verbs import VerbsEngine

PERFTEST_CLIENT = Path(__file__).resolve().parent / "fixtures" / "perftest" / "ib_write_bw-client.txt"
LOCAL = Endpoint("127.0.0.1")
# A host that is up but whose traffic program never answers (other commands run normally).
HANGS = ("sh", "-c", 'case "$*" in *_worker*) exec sleep 60;; esac; exec "$@"', "sh")


def test_tcp_between_two_processes_on_localhost() -> None:
    workload = Workload(message_size=65536, connections=2, batch=2, queue_depth=8)
    result = TcpEngine().run(workload, LOCAL, LOCAL, duration_s=2, timeout_s=10)
    assert result.ok, result.errors
    assert result.throughput_gbps > 0 and result.msgs_per_s > 0
    assert 0 < result.latency_us["p50"] <= result.latency_us["p99"] <= result.latency_us["max"]
    assert set(result.counters) == {"server", "client"}
    sent_bytes = result.throughput_gbps * 1e9 / 8 * 2  # about 2 s of traffic
    for role, counters in result.counters.items():
        [lo] = counters.find("tx_bytes", device="lo", source="netdev")
        assert lo.delta >= 0.8 * sent_bytes and lo.per_s > 0, (role, lo, sent_bytes)
        assert counters.elapsed_s >= 2


def test_tcp_both_ways_with_sges_mtu_and_small_messages() -> None:
    workload = Workload(message_size=3000, direction=Direction.BI, sges=3, mtu=1500, batch=4, queue_depth=16)
    result = TcpEngine().run(workload, LOCAL, LOCAL, duration_s=1, timeout_s=10)
    assert result.ok, result.errors
    assert result.throughput_gbps > 0 and result.latency_us["p50"] > 0
    assert result.to_dict()["workload"]["direction"] == "bi"


def test_tcp_throughput_spans_all_connections_of_a_process() -> None:
    from dpro.anomaly.engines.tcp import _rates

    # One connection ran 1 s, the other got its 1 MB through in the first 0.1 s: 2 MB in 1 s,
    # not 1 MB/s + 10 MB/s.
    senders = [{"bytes": 10**6, "messages": 10, "start_ns": 0, "end_ns": 10**9},
               {"bytes": 10**6, "messages": 10, "start_ns": 0, "end_ns": 10**8}]
    assert _rates(senders) == (16e6, 20.0)


def test_tcp_server_that_never_answers_times_out_quickly() -> None:
    start = time.monotonic()
    result = TcpEngine().run(Workload(), Endpoint("127.0.0.1", prefix=HANGS), LOCAL, duration_s=5, timeout_s=2)
    assert time.monotonic() - start < 8  # the timeout, plus counter snapshots
    assert result.errors == ["server did not become ready within 2 s: killed (its output: no output)"]
    assert result.throughput_gbps is None


def test_tcp_client_that_never_connects_is_reported() -> None:
    result = TcpEngine().run(Workload(), LOCAL, Endpoint("127.0.0.1", prefix=HANGS), duration_s=1, timeout_s=2)
    assert "server exited with code 1: only 0 of 1 connection(s) arrived within 2 s" in result.errors
    assert any(e.startswith("client still running") and e.endswith("killed") for e in result.errors), result.errors


def test_tcp_server_dying_mid_run_is_reported() -> None:
    dies = Endpoint("127.0.0.1", prefix=("timeout", "-s", "KILL", "1.5"))
    start = time.monotonic()
    result = TcpEngine().run(Workload(), dies, LOCAL, duration_s=10, timeout_s=5)
    assert time.monotonic() - start < 9
    assert any(e.startswith("server was killed by SIGKILL") for e in result.errors), result.errors
    assert any(e.startswith("client exited with code 1:") for e in result.errors), result.errors


def test_tcp_server_that_cannot_listen_on_its_address() -> None:
    result = TcpEngine().run(Workload(), Endpoint("192.0.2.1"), LOCAL, duration_s=1, timeout_s=5)  # not ours
    assert result.errors == ["server ended before it was ready: server exited with code 1: "
                             "OSError: [Errno 99] Cannot assign requested address"]


@pytest.mark.privileged
def test_tcp_server_unreachable_from_the_client() -> None:
    # The server listens on 127.0.0.1 of a network namespace of its own: from the client's,
    # nothing listens there.
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"]).returncode != 0:
        pytest.skip("needs unshare -n (root)")
    elsewhere = Endpoint("127.0.0.1", prefix=("unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"))
    start = time.monotonic()
    result = TcpEngine().run(Workload(), elsewhere, LOCAL, duration_s=5, timeout_s=2)
    assert time.monotonic() - start < 8
    assert any(e.startswith("client exited with code 1: cannot connect to 127.0.0.1:") and
               e.endswith("Connection refused") for e in result.errors), result.errors


@pytest.mark.privileged
def test_tcp_between_network_namespaces_diffs_each_hosts_interface() -> None:
    from tools.testing.netns import NetnsCluster, can_build_namespaces

    if reason := can_build_namespaces():
        pytest.skip(reason)
    with NetnsCluster(2, prefix="dpa") as cluster:
        server, client = (Endpoint(h.ip, prefix=("ip", "netns", "exec", h.netns)) for h in cluster.hosts)
        result = TcpEngine().run(Workload(message_size=32768), server, client, duration_s=1, timeout_s=10)
        assert result.ok, result.errors
        sent = result.counters["client"].find("tx_bytes", source="netdev")
        received = result.counters["server"].find("rx_bytes", source="netdev")
        assert [r.device for r in sent] == [cluster.hosts[1].veth] and [r.device for r in received] == [cluster.hosts[0].veth]
        assert sent[0].delta > 1_000_000 and received[0].delta > 1_000_000


def test_engines_refuse_what_they_cannot_do() -> None:
    result = TcpEngine().run(Workload(opcode=Opcode.WRITE, transport="rc"), LOCAL, LOCAL, duration_s=1, timeout_s=1)
    assert result.errors == ["tcp engine does not support: opcode:write, transport:rc"]
    with pytest.raises(ValueError, match="batch"):
        Workload(batch=8, queue_depth=4)
    with pytest.raises(ValueError, match="placement"):
        Workload(placement="gpu0")
    assert Workload(placement="cuda:1", sges=2).features() >= {"placement:cuda", "sges"}


def test_available_engines_and_lookup() -> None:
    assert set(ENGINES) == {"tcp", "perftest", "verbs"}
    assert ENGINES["tcp"].unavailable_reason() is None
    assert get_engine("tcp").name == "tcp"
    with pytest.raises(KeyError, match="known: tcp, perftest, verbs"):
        get_engine("iperf")


def test_perftest_output_is_parsed() -> None:
    report = parse_perftest_output(PERFTEST_CLIENT.read_text())
    assert report.test == "RDMA_Write BW Test"
    assert (report.message_size, report.iterations) == (65536, 1859220)
    assert (report.bw_peak_gbps, report.bw_average_gbps, report.msg_rate_mpps) == (0.0, 194.95, 0.371844)
    assert report.settings == {"device": "mlx5_0", "qps": "4", "transport": "IB", "connection": "RC",
                               "tx_depth": "128", "mtu": "4096[B]", "link_type": "Ethernet", "gid_index": "3"}
    # Without --report_gbits the columns are MiB/s; a size sweep reports its last row.
    sweep = (" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
             "Conflicting CPU frequency values detected: 894.060000 != 800.000000. CPU Frequency is not max.\n"
             " 2          1000             4.85               4.80               2.518597\n"
             " 8388608    1000             23401.80            23396.08                  0.002925\n")
    last = parse_perftest_output(sweep)
    assert last.message_size == 8388608 and last.bw_average_gbps == pytest.approx(23396.08 * 2**20 * 8 / 1e9)
    assert parse_perftest_output(" Did not detect devices \n If device exists, check if driver is up\n") is None


def test_perftest_engine_without_rdma_hardware_fails_clearly() -> None:
    engine = PerftestEngine()
    if reason := engine.unavailable_reason():
        assert "perftest" in reason
        assert engine.run(Workload(), LOCAL, LOCAL).errors == [f"perftest engine unavailable: {reason}"]
        return
    start = time.monotonic()
    result = engine.run(Workload(opcode=Opcode.WRITE), LOCAL, LOCAL, duration_s=2, timeout_s=5)
    assert time.monotonic() - start < 10
    if not Path("/sys/class/infiniband").is_dir():  # the real tools, on a machine with no RDMA device
        assert len(result.errors) == 1 and "server ended before it was ready" in result.errors[0]
        assert "Unable to find the Infiniband/RoCE device" in result.errors[0]
    assert "perftest bandwidth tests measure no latency" in result.notes


def test_verbs_engine_measures_where_a_device_exists_and_refuses_clearly_where_none_does() -> None:
    engine = VerbsEngine()
    reason = engine.unavailable_reason()
    if reason is not None:  # no RDMA device (and pyverbs may be missing): say so, never raise
        assert reason.startswith(("pyverbs is not installed", "no RDMA device"))
        device = Endpoint("127.0.0.1", rdma_device="mlx5_0")
        result = engine.run(Workload(transport="ud", opcode=Opcode.SEND), device, device, duration_s=1, timeout_s=1)
        assert result.errors == [f"verbs engine unavailable: {reason}"] and result.throughput_gbps is None
        return
    import pyverbs.device  # the real path: RC SEND between two processes on this host's first device

    name = pyverbs.device.get_device_list()[0].name.decode()
    local = Endpoint("127.0.0.1", rdma_device=name)
    result = engine.run(Workload(transport="rc", opcode=Opcode.SEND), local, local, duration_s=2, timeout_s=20)
    assert result.ok, result.errors
    assert result.throughput_gbps > 0


def test_latency_histogram_percentiles_merge() -> None:
    a, b = LatencyHistogram(), LatencyHistogram()
    for ns in range(1_000, 101_000, 1_000):  # 1..100 µs
        (a if ns % 2 else b).add(ns)
    a.merge(LatencyHistogram.from_dict(b.to_dict()))
    p = a.percentiles_us()
    assert a.count == 100 and p["max"] == 100.0
    assert p["p50"] == pytest.approx(50, rel=0.02) and p["p99"] == pytest.approx(99, rel=0.02)
    assert LatencyHistogram().percentiles_us() == {}
