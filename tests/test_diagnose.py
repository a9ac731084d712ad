"""`dpro diagnose` on real recorded 2-rank gloo jobs: a rank made slow is named, with the
cause, and the same job without the slow rank names none; a NIC whose fault counters moved
during the job is named from the node's counter snapshots, and so is a host whose hypervisor took
its CPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpro.collectors.counters.procstat import BUSY_STATES

from .conftest import EXAMPLE, JOBS, SMALL_LM, TORCHRUN, dpro

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("straggler") / "run"
    done = subprocess.run([sys.executable, "-m", "dpro", "record", "-o", str(run), "--skip", "4", "--warmup", "1",
                           "--steps", "4", "--no-calibrate", "--", *TORCHRUN, "--nproc-per-node=2", str(EXAMPLE), "--steps", "14",
                           *SMALL_LM, "--slow-rank", "1", "--slow-ms", "40"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return run


def test_a_slow_rank_is_named_first_as_a_compute_straggler(straggler_run: Path) -> None:
    out = dpro("diagnose", straggler_run, "--json")
    assert out.returncode == 0, out.stderr
    # first but for this machine's own stolen CPU, which a contended test machine may add
    first = [s for s in json.loads(out.stdout)["suspects"] if "steal_share" not in s["evidence"]][0]
    assert (first["kind"], first["rank"]) == ("rank", 1)
    assert first["evidence"]["cause"].startswith("compute") and first["evidence"]["late_ms"] > 20
    text = dpro("diagnose", straggler_run)
    lines = [line for line in text.stdout.splitlines() if "steal_share=" not in line]
    assert text.returncode == 0 and lines[0].split()[1:4] == ["rank", "rank", "1"]


def test_the_same_job_without_a_slow_rank_names_no_straggler(recorded_run: Path) -> None:
    out = dpro("diagnose", recorded_run, "--json")
    assert out.returncode == 0, out.stderr
    suspects = json.loads(out.stdout)["suspects"]
    for s in suspects:
        assert set(s) == {"kind", "name", "rank", "host", "score", "evidence"}
    # a busy test machine may make one rank a little slower, never by the 20+ ms of the slow rank above
    late = [s for s in suspects if s["evidence"].get("cause", "").startswith("compute")
            and s["evidence"]["late_ms"] > 20]
    assert late == [], late
    assert [s["score"] for s in suspects] == sorted((s["score"] for s in suspects), reverse=True)


def test_a_nic_whose_fault_counters_moved_is_named(tmp_path: Path) -> None:
    # No RDMA NIC here: the job is recorded with NIC counters read from a recorded mlx5 sysfs tree;
    # the end snapshot is then the same host's tree ten seconds later, where out-of-sequence
    # packets (a 32-bit counter that wrapped), buffer drops and ACK timeouts went up on mlx5_0,
    # and its interface dropped packets.
    from dpro.collectors.counters import take_snapshot

    run = tmp_path / "run"
    done = dpro("record", "-o", run, "--sysfs-root", FIXTURES / "sysfs-mlx5" / "before", "--",
                sys.executable, JOBS / "exit_with.py", "0")
    assert done.returncode == 0, done.stderr
    [node] = (run / "nodes").iterdir()
    after = take_snapshot(FIXTURES / "sysfs-mlx5" / "after", gpu=False).to_dict()
    start = json.loads((node / "counters-start.json").read_text())
    (node / "counters-end.json").write_text(json.dumps({**after, "host": start["host"],
                                                        "monotonic_ns": start["monotonic_ns"] + 10**10}))
    out = dpro("diagnose", run, "--json")
    assert out.returncode == 0, out.stderr
    nics = [s for s in json.loads(out.stdout)["suspects"] if s["kind"] == "nic"]
    assert [s["name"] for s in nics] == [f"{start['host']}/mlx5_0/1", f"{start['host']}/ens1f0np0"]
    assert nics[0]["evidence"]["counters"] == {"ack_timeouts": 2, "rx_no_buffer_drops": 250, "rx_out_of_sequence": 16}
    assert nics[1]["evidence"]["counters"] == {"rx_drops": 4} and nics[0]["evidence"]["ranks"] == [0]


def _with_steal(snapshot: dict, steal_share: float, start: dict) -> dict:
    """``snapshot`` (a node's end) with the steal time a hypervisor that took ``steal_share`` of the
    CPU time wanted since ``start`` would have left: a fake, for no VM here steals on demand."""
    before, after = start["cpu_times"], snapshot["cpu_times"]
    busy = sum(after[s] - before[s] for s in BUSY_STATES)
    steal = before["steal"] + round(busy * steal_share / (1 - steal_share))
    return {**snapshot, "cpu_times": {**after, "steal": steal}}


def test_a_host_whose_hypervisor_took_its_cpus_is_named_against_the_runs_other_hosts(tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = dpro("record", "-o", run, "--", sys.executable, JOBS / "exit_with.py", "0")
    assert done.returncode == 0, done.stderr
    [node] = (run / "nodes").iterdir()
    start = json.loads((node / "counters-start.json").read_text())
    end = json.loads((node / "counters-end.json").read_text())
    states = set(end["cpu_times"])
    assert states == {"user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"}, "the real /proc/stat"

    def hosts(suspects_of: Path) -> list[tuple[str, dict]]:
        out = dpro("diagnose", suspects_of, "--json")
        assert out.returncode == 0, out.stderr
        return [(s["name"], s["evidence"]) for s in json.loads(out.stdout)["suspects"]
                if s["kind"] == "host" and "steal_share" in s["evidence"]]

    (node / "counters-end.json").write_text(json.dumps({k: v for k, v in end.items() if k != "cpu_times"}))
    assert hosts(run) == [], "a node without CPU time, as run format 1.4 wrote it"
    (node / "counters-end.json").write_text(json.dumps(_with_steal(end, 0.3, start)))
    [(name, evidence)] = hosts(run)  # a run of one host: against none
    assert name == start["host"] and evidence["steal_share"] == pytest.approx(0.3, abs=0.01)
    # a second node on another host, whose hypervisor took as much: no host is slower than the other
    other = node.with_name("other-1")
    other.mkdir()
    node_json = json.loads((node / "node.json").read_text())
    (other / "node.json").write_text(json.dumps({**node_json, "host": "other"}))
    for name in ("counters-start.json", "counters-end.json"):
        (other / name).write_text(json.dumps({**json.loads((node / name).read_text()), "host": "other"}))
    assert hosts(run) == []
    # ... and one whose hypervisor took half as much: the first is named (15 points above it), not the other
    (other / "counters-end.json").write_text(json.dumps({**_with_steal(end, 0.15, start), "host": "other"}))
    [(name, evidence)] = hosts(run)
    assert name == start["host"] and evidence["other_hosts_steal_share"] == pytest.approx(0.15, abs=0.01)
