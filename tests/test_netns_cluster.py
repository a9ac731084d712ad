"""The network-namespace mini-cluster: real namespaces, a real bridge, tc, and a real 2-host gloo job."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpro.run_format import open_run
from tools.testing import netns
from tools.testing.netns import NetnsCluster, can_build_namespaces, cleanup_stale, record_across_hosts

from .conftest import EXAMPLE, ROOT, SMALL_LM

pytestmark = pytest.mark.privileged

RECORD_ARGS = ("--skip", "3", "--warmup", "1", "--steps", "2", "--no-calibrate")
JOB = [EXAMPLE, "--steps", "10", *SMALL_LM]

# Receives until EOF, then answers with the number of bytes received.
SERVER = """
import socket, sys
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
conn, _ = server.accept()
received = 0
while chunk := conn.recv(1 << 16):
    received += len(chunk)
conn.sendall(str(received).encode())
conn.close()
"""
# Sends N bytes and waits for the answer: prints the bytes acknowledged and the seconds taken.
CLIENT = """
import socket, sys, time
ip, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
start = time.perf_counter()
with socket.create_connection((ip, port), timeout=60) as c:
    c.sendall(bytes(size))
    c.shutdown(socket.SHUT_WR)
    acknowledged = int(c.recv(64))
print(acknowledged, time.perf_counter() - start)
"""


@pytest.fixture(scope="module", autouse=True)
def namespaces_available() -> None:
    reason = can_build_namespaces()
    if reason:
        pytest.skip(reason)


def transfer_seconds(cluster: NetnsCluster, src: int, dst: int, size: int, port: int = 5001) -> float:
    """Send ``size`` bytes over TCP from host ``src`` to host ``dst``; the seconds it took."""
    server = cluster.popen(dst, [sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline() == "ready\n"
    client = cluster.run(src, [sys.executable, "-c", CLIENT, cluster.hosts[dst].ip, str(port), str(size)],
                         timeout=60, capture_output=True, text=True)
    assert client.returncode == 0, client.stderr
    assert server.wait(timeout=10) == 0
    acknowledged, seconds = client.stdout.split()
    assert int(acknowledged) == size
    return float(seconds)


def netns_names() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def assert_cleaned_up(tag: str, pids: list[int]) -> None:
    assert not [n for n in netns_names() if n.startswith(tag)]
    assert not list(Path("/etc/netns").glob(f"{tag}*"))
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert tag not in links and "dpro-h" not in links and "dpro-p" not in links and "dpro-br" not in links
    deadline = time.monotonic() + 5
    while any(map(alive, pids)) and time.monotonic() < deadline:  # orphans are reaped by init
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)]


def test_hosts_have_their_names_and_throttling_slows_their_links_both_ways() -> None:
    size = 2 * 1024 * 1024
    with NetnsCluster(3) as cluster:
        for h in cluster.hosts:
            result = cluster.run(h.index, [sys.executable, "-c", "import socket; n = socket.gethostname(); "
                                           "print(n, socket.gethostbyname(n))"],
                                 timeout=30, capture_output=True, text=True)
            assert result.stdout.split() == [h.name, h.ip], result.stderr
        assert socket.gethostname() not in {h.name for h in cluster.hosts}  # ours is untouched

        free = transfer_seconds(cluster, 0, 2, size)
        cluster.throttle(1, "8mbit")  # 1 MB/s: 2 MiB take ~2 s
        sending = transfer_seconds(cluster, 1, 0, size)  # tbf on host 1's veth
        receiving = transfer_seconds(cluster, 2, 1, size)  # tbf on its bridge port
        assert transfer_seconds(cluster, 0, 2, size) < 0.5 + 3 * free  # the others keep their speed
        cluster.unthrottle(1)
        restored = transfer_seconds(cluster, 1, 2, size)
    for throttled in (sending, receiving):
        assert throttled > 1.0 and throttled > 5 * free, (free, sending, receiving)
        assert restored < throttled / 5, (restored, throttled)


def test_everything_is_removed_even_when_the_body_raises() -> None:
    with pytest.raises(RuntimeError, match="body failed"):
        with NetnsCluster(2) as cluster:
            tag = cluster.tag
            sleeper = cluster.popen(0, ["sleep", "300"])
            # A grandchild that leaves the process group: found through its namespace.
            escaper = cluster.popen(1, [sys.executable, "-c", "import subprocess; print(subprocess.Popen("
                                        "['sleep', '300'], start_new_session=True).pid, flush=True)"],
                                    stdout=subprocess.PIPE, text=True)
            grandchild = int(escaper.stdout.readline())
            assert escaper.wait(timeout=10) == 0 and alive(grandchild)
            assert len([n for n in netns_names() if n.startswith(tag)]) == 3  # 2 hosts and the switch
            raise RuntimeError("body failed")
    assert sleeper.returncode == -signal.SIGKILL
    assert_cleaned_up(tag, [sleeper.pid, grandchild])


def test_cleanup_stale_removes_what_a_killed_run_left() -> None:
    script = ("import time\nfrom tools.testing.netns import NetnsCluster\n"
              "with NetnsCluster(2, prefix='dprocrash') as c:\n"
              "    p = c.popen(1, ['sleep', '300'])\n"
              "    print(c.tag, p.pid, flush=True)\n"
              "    time.sleep(300)\n")
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)  # tools/
    tag, pid = owner.stdout.readline().split()
    cleanup_stale("dprocrash")  # its owner is alive: left alone
    assert len([n for n in netns_names() if n.startswith(tag)]) == 3
    owner.kill()
    owner.wait()
    assert alive(int(pid)) and [n for n in netns_names() if n.startswith(tag)]
    cleanup_stale("dprocrash")
    assert_cleaned_up(tag, [int(pid)])


def median_step_ms(run_dir: Path, rank: int) -> float:
    steps = open_run(run_dir).steps(rank)
    return float(steps["dur_ns"].dropna().median()) / 1e6


@pytest.fixture(scope="module")
def two_host_run(tmp_path_factory) -> Path:
    """The example job on 2 hosts × 1 rank, recorded with dpro record --join on each."""
    run_dir = tmp_path_factory.mktemp("netns") / "run"
    with NetnsCluster(2) as cluster:
        results = record_across_hosts(cluster, run_dir, JOB, record_args=RECORD_ARGS, timeout=300)
    for r in results:
        assert r.returncode == 0, r.stderr[-3000:]
    return run_dir


def test_a_gloo_job_recorded_across_two_hosts(two_host_run: Path) -> None:
    run = open_run(two_host_run)
    assert run.ranks == [0, 1]
    nodes = run.nodes()
    assert sorted(n["host"] for n in nodes) == ["dpro-h0", "dpro-h1"]
    assert all(n["exit_code"] == 0 for n in nodes)
    for rank in (0, 1):
        meta = json.loads((run.rank_dir(rank) / "meta.json").read_text())  # as the job wrote it
        assert (meta["rank"], meta["node_rank"], meta["world_size"], meta["host"]) == (rank, rank, 2, f"dpro-h{rank}")
        assert meta["backend"] == "gloo"
        assert meta["environment"]["GLOO_SOCKET_IFNAME"] == f"dpro-h{rank}"
        assert run.trace_path(rank) is not None
        assert len(run.steps(rank)) == 10
    clock = json.loads((run.rank_dir(1) / "clock.json").read_text())
    assert clock["offset_ns"] is not None and clock["rtt_ns"] > 0, clock
    assert clock["store"].startswith("10.77.0.10:")  # measured across the bridge, to host 0


def test_a_throttled_link_slows_the_job_down(two_host_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with NetnsCluster(2, rates={1: "8mbit"}) as cluster:
        results = record_across_hosts(cluster, run_dir, JOB, record_args=RECORD_ARGS, timeout=300)
    for r in results:
        assert r.returncode == 0, r.stderr[-3000:]
    run = open_run(run_dir)
    assert run.ranks == [0, 1]
    # Each step all-reduces the gradients: on 2 ranks, each sends and receives about one
    # gradient's worth, here through a 1 MB/s link. A busy CPU stretches both runs' steps, so the
    # test compares the time added rather than only the ratio.
    grad_bytes = sum(run.rank_meta(1).ddp[0].bucket_bytes)
    link_ms = grad_bytes / 1e6 * 1e3
    for rank in (0, 1):
        free, throttled = median_step_ms(two_host_run, rank), median_step_ms(run_dir, rank)
        assert throttled - free > link_ms / 2 and throttled > 1.5 * free, (rank, free, throttled, link_ms)


def test_when_one_host_fails_the_others_are_stopped(tmp_path: Path, monkeypatch) -> None:
    script = tmp_path / "fail_on_rank1.py"
    script.write_text("import os, sys\nimport torch.distributed as dist\n"
                      "if os.environ['RANK'] == '1':\n    sys.exit(3)\n"
                      "dist.init_process_group('gloo')  # waits for rank 1, which never comes\n")
    monkeypatch.setattr(netns, "FAIL_FAST_S", 3.0)
    start = time.monotonic()
    with NetnsCluster(2) as cluster:
        results = record_across_hosts(cluster, tmp_path / "run", [script], timeout=120)
    assert results[1].returncode == 1 and "exitcode  : 3" in results[1].stderr
    assert results[0].returncode != 0 and "got signal: 15" in results[0].stderr  # stopped, not timed out
    assert time.monotonic() - start < 60
    assert sorted(n["host"] for n in open_run(tmp_path / "run").nodes()) == ["dpro-h0", "dpro-h1"]
