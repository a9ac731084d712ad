"""The job's TCP connections: ``ss`` parsing, the sampler inside ``dpro record``, and the
host-to-host matrix diagnosed from them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpro.anomaly.run.traffic_matrix import connection_matrix, connection_rates, connection_suspects
from dpro.anomaly.fabric.probes import analyze, from_matrix
from dpro.collectors.connections import COLUMNS, descendants, parse_ss
from dpro.run_format import open_run

from .conftest import assert_one_line_error, dpro

FIXTURES = Path(__file__).parent / "fixtures" / "ss"


@pytest.mark.parametrize("name", ["established.txt", "all-states.txt"])
def test_parse_ss_output_captured_on_this_machine(name: str) -> None:
    # Captured with `ss -tinpH [state established]` during a 6.5 MB loopback transfer; ss omits
    # the state column when it filters by state.
    sockets = parse_ss((FIXTURES / name).read_text())
    assert len(sockets) == 2
    sender = next(s for s in sockets if s["bytes_acked"])
    assert int(sender["bytes_acked"]) >= 6553600 and sender["local"].startswith("127.0.0.1:")
    assert sender["pids"].isdigit() and float(sender["rtt_ms"]) > 0 and int(sender["delivery_rate_bps"]) > 0
    receiver = next(s for s in sockets if not s["bytes_acked"])
    assert int(receiver["bytes_received"]) >= 6553600


def test_parse_the_time_a_receiver_held_the_sender_back() -> None:
    # Captured with `ss -tinpH state established` while a reader took 64 KB every 10 ms
    sockets = parse_ss((FIXTURES / "rwnd-limited.txt").read_text())
    sender = next(s for s in sockets if s["bytes_acked"])
    assert sender["busy_ms"] == "1004" and sender["rwnd_limited_ms"] == "836"
    assert sender["sndbuf_limited_ms"] == "", "ss omits a limit that never held"


def test_descendants_of_a_process_tree() -> None:
    import os
    import subprocess

    child = subprocess.Popen(["sh", "-c", "sleep 5 & wait"])
    try:
        import time

        deadline = time.monotonic() + 5
        while len(found := descendants(os.getpid())) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {os.getpid(), child.pid} < found
    finally:
        child.kill()
        child.wait()


def test_record_samples_the_jobs_connections(recorded_run: Path) -> None:
    node = next((recorded_run / "nodes").iterdir())
    assert "sampled" in json.loads((node / "node.json").read_text())["collectors"]["connections"]
    lines = (node / "connections.csv").read_text().splitlines()
    assert lines[0].split(",") == list(COLUMNS)
    assert len(lines) > 1, "gloo's connections between the two ranks were seen"
    assert connection_suspects(open_run(recorded_run)) == [], "one host: no network connection to judge"


def write_node(run: Path, host: str, ip: str, peers: dict[str, float], pid: int) -> None:
    """A node directory with connection samples: 64 MB sent to each peer at ``rate`` Mb/s."""
    node = run / "nodes" / f"{host}-{pid}"
    node.mkdir(parents=True)
    (node / "node.json").write_text(json.dumps({"host": host}))
    rows = [",".join(COLUMNS)]
    for i, (peer, rate_mbps) in enumerate(peers.items()):
        busy = 64 * 8 * (1 << 20) / (rate_mbps * 1e6) * 1e3
        for t, acked, busy_ms in ((0, 1000, 10), (1, 1000 + 64 * (1 << 20), 10 + busy)):
            rows.append(f"{t},{pid},{ip}:{40000 + i},{peer}:29500,{acked},0,{busy_ms:.0f},0.1,0.05,1000,0")
    (node / "connections.csv").write_text("\n".join(rows) + "\n")


def test_a_slow_host_in_a_ring_of_connections(tmp_path: Path) -> None:
    # A ring h0 -> h1 -> h2 -> h3 -> h0 as gloo lays it out; h2's link runs at 40 Mb/s.
    ips = {f"h{i}": f"10.0.0.{i + 1}" for i in range(4)}
    rates = {"h0": 900.0, "h1": 40.0, "h2": 40.0, "h3": 700.0}  # h1 -> h2 and h2 -> h3 cross h2's link
    for i, host in enumerate(ips):
        nxt = f"h{(i + 1) % 4}"
        write_node(tmp_path, host, ips[host], {ips[nxt]: rates[host]}, 100 + i)
    (tmp_path / "run.json").write_text(json.dumps({"format": "dpro-run", "format_version": "1.0"}))
    table = connection_rates(open_run(tmp_path))
    assert len(table) == 4 and table["rate_bps"].min() == pytest.approx(40e6, rel=0.01)
    matrix = connection_matrix(table)
    assert matrix is not None and matrix.hosts == list(ips)
    suspects = connection_suspects(open_run(tmp_path))
    assert [s.host for s in suspects] == ["h2"] and suspects[0].evidence["source"] == "the job's TCP connections"


def test_a_connections_rate_is_its_bulk_intervals_less_the_time_its_receiver_held_it(tmp_path: Path) -> None:
    node = tmp_path / "nodes" / "h0-1"
    node.mkdir(parents=True)
    (node / "node.json").write_text(json.dumps({"host": "h0"}))
    rows = [",".join(COLUMNS)]
    acked, busy, rwnd = 0, 0, 0
    for t in range(12):
        if t % 2:  # bulk: 8 MB at 400 Mb/s, after the receiver held the sender back for 100 ms
            acked, busy, rwnd = acked + (8 << 20), busy + 8 * 8 * (1 << 20) / 400e3 + 100, rwnd + 100
        else:  # small messages: 64 KB spread over 50 ms of latency
            acked, busy = acked + (64 << 10), busy + 50
        rows.append(f"{t * 500_000_000},1,10.0.0.1:4000,10.0.0.2:29500,{acked},0,{busy:.0f},0.1,0.05,1000,0,{rwnd or ''},")
    (node / "connections.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "run.json").write_text(json.dumps({"format": "dpro-run", "format_version": "1.2"}))
    (row,) = connection_rates(open_run(tmp_path)).itertuples()
    assert row.intervals == 6 and row.limited_ms == 600
    assert row.rate_bps == pytest.approx(400e6, rel=0.01)
    assert row.bytes * 8 / (row.busy_ms / 1e3) < 300e6, "the average over the whole job is pulled down"


def test_a_link_too_slow_for_a_bulk_interval_is_still_measured(tmp_path: Path) -> None:
    node = tmp_path / "nodes" / "h0-1"
    node.mkdir(parents=True)
    (node / "node.json").write_text(json.dumps({"host": "h0"}))
    rows = [",".join(COLUMNS)]
    for t in range(40):  # 1 Mb/s, sending all the time: 62.5 KB per 500 ms interval
        rows.append(f"{t * 500_000_000},1,10.0.0.1:4000,10.0.0.2:29500,{t * 62_500},0,{t * 500},40,0.05,1000000,0,,")
    (node / "connections.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "run.json").write_text(json.dumps({"format": "dpro-run", "format_version": "1.2"}))
    (row,) = connection_rates(open_run(tmp_path)).itertuples()
    assert row.intervals == 39 and row.rate_bps == pytest.approx(1e6, rel=0.01)


def test_dpros_own_link_streams_are_not_the_jobs_traffic(tmp_path: Path) -> None:
    # h0 sends to h1 in the job (port 29500) and in calibration's stream to h1's listener (41000)
    for host, ip, peer_ip, local_port in (("h0", "10.0.0.1", "10.0.0.2", 40000), ("h1", "10.0.0.2", "10.0.0.1", 29500)):
        node = tmp_path / "nodes" / f"{host}-1"
        node.mkdir(parents=True)
        (node / "node.json").write_text(json.dumps({"host": host}))
        rows = [",".join(COLUMNS)]
        for t in range(3):
            if host == "h0":
                rows.append(f"{t},1,{ip}:40000,{peer_ip}:29500,{t * (8 << 20)},0,{t * 200},1,0.05,1,0,,")
                rows.append(f"{t},1,{ip}:40001,{peer_ip}:41000,{t * (400 << 20)},0,{t * 300},1,0.05,1,0,,")
            else:  # the receiving ends
                rows.append(f"{t},1,{ip}:29500,{peer_ip}:40000,0,{t * (8 << 20)},0,1,0.05,1,0,,")
                rows.append(f"{t},1,{ip}:41000,{peer_ip}:40001,0,{t * (400 << 20)},0,1,0.05,1,0,,")
        (node / "connections.csv").write_text("\n".join(rows) + "\n")
    for rank, host in enumerate(("h0", "h1")):
        d = tmp_path / "ranks" / str(rank)
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"rank": rank, "host": host}))
        links = [{"src": 1 - rank, "dst": rank, "listen": [f"10.0.0.{rank + 1}", 41000 if host == "h1" else 41001]}]
        (d / "calibration.json").write_text(json.dumps({"collectives": {"links": links}}))
    (tmp_path / "run.json").write_text(json.dumps({"format": "dpro-run", "format_version": "1.2"}))
    table = connection_rates(open_run(tmp_path))
    assert table["peer_ip"].tolist() == ["10.0.0.2"] and table["bytes"].tolist() == [16 << 20], \
        "the 800 MB stream would have made the job's 16 MB look light"


def test_a_few_fast_connections_do_not_make_a_healthy_host_a_suspect() -> None:
    # Measured on the 4-namespace cluster of test_diagnose_cluster (h2's link at 40 Mb/s, 2 CPU
    # cores for 4 ranks): the healthy links ran from 170 Mb/s to 10 Gb/s. Once h2 is peeled, h0
    # is left to be judged against h1 -> h3 alone, and one fast probe is no baseline.
    mbps = np.array([[np.nan, 170.7, 38.5, 527.2],
                     [2259.5, np.nan, 36.1, 10066.8],
                     [np.nan, 34.9, np.nan, 35.2],
                     [2308.0, np.nan, 36.4, np.nan]])
    suspects = analyze(from_matrix(mbps * 1e6, ["h0", "h1", "h2", "h3"]))
    assert [(s.kind, s.host) for s in suspects] == [("host", "h2")]


def test_one_pair_of_hosts_is_no_baseline() -> None:
    # Measured by dpro health on the 4-namespace cluster of test_health (h2's link at 200 Mb/s):
    # once h2 is peeled, h3 is left to be judged against h0 <-> h1 alone, both directions of one
    # link; h3's probes fell 10% below both and it was named too (CI, stop 26).
    gbps = np.array([[np.nan, 13.233, 0.191, 9.002],
                     [11.764, np.nan, 0.191, 6.593],
                     [0.191, 0.191, np.nan, 0.192],
                     [9.698, 10.523, 0.192, np.nan]])
    suspects = analyze(from_matrix(gbps * 1e9, ["h0", "h1", "h2", "h3"]))
    assert [(s.kind, s.host) for s in suspects] == [("host", "h2")]


def test_small_matrices_need_a_clear_separation() -> None:
    names = ["a", "b", "c", "d"]
    ring = np.full((4, 4), np.nan)
    ring[0, 1], ring[1, 2], ring[2, 3], ring[3, 0] = 900, 880, 860, 910  # healthy, a little noise
    assert analyze(from_matrix(ring, names)) == []
    ring[1, 2], ring[2, 3] = 500, 520  # c is slower than every other link, by 40 %
    assert [s.host for s in analyze(from_matrix(ring, names))] == ["c"]


def test_diagnose_rejects_bad_input(tmp_path: Path) -> None:
    assert dpro("diagnose", tmp_path / "missing").returncode != 0
    (tmp_path / "bad.json").write_text("{}")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text(json.dumps({"format": "dpro-run", "format_version": "1.0"}))
    assert_one_line_error(dpro("diagnose", tmp_path / "run", "--probes", tmp_path / "bad.json"), "expected keys")
