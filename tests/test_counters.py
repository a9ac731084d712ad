"""The anomaly counter layer: sysfs trees, ethtool output, wrap-around, vendor names, missing hardware.

No RDMA NIC exists on the test machine, so the RDMA inputs are recorded real formats:
``fixtures/sysfs-mlx5/{before,after}/sys`` has the directory layout and counter file names of a
real mlx5 (ConnectX, RoCE) host, ``fixtures/ethtool/mlx5.txt`` the real ``ethtool -S`` layout and
counter names of an mlx5 port with PFC on priority 3. Their values are set for the cases tested
here: between ``before`` and ``after`` (10 s apart), the 32-bit ``out_of_sequence`` wraps,
``np_cnp_sent`` disappears, ``symbol_error`` sits saturated, and ``mlx5_1`` has no hw_counters.
The netdev, ethtool and NVML paths also run for real against this machine's own ``lo`` and lack of GPU.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpro.collectors.counters import catalog, ethtool, procstat, snapshot, sysfs
from dpro.collectors.counters.snapshot import CounterKey, diff, take_snapshot
from dpro.collectors.counters.wrap import delta, effective_width

from .conftest import FAKES

FIXTURES = Path(__file__).resolve().parent / "fixtures"
BEFORE, AFTER = FIXTURES / "sysfs-mlx5" / "before", FIXTURES / "sysfs-mlx5" / "after"
ETHTOOL_MLX5 = FIXTURES / "ethtool" / "mlx5.txt"


def fixture_diff(elapsed_s: float = 10.0) -> snapshot.CounterDiff:
    before = take_snapshot(BEFORE, gpu=False, cpu=False)
    after = take_snapshot(AFTER, gpu=False, cpu=False)
    return diff(before, dataclasses.replace(after, monotonic_ns=before.monotonic_ns + int(elapsed_s * 1e9)))


def only(rates: list[snapshot.CounterRate]) -> snapshot.CounterRate:
    assert len(rates) == 1, rates
    return rates[0]


def test_sysfs_root_is_a_filesystem_root_or_a_sysfs_tree(tmp_path: Path, monkeypatch) -> None:
    assert sysfs.sysfs_dir(BEFORE) == BEFORE / "sys"  # a recorded filesystem root
    assert sysfs.sysfs_dir(BEFORE / "sys") == BEFORE / "sys"  # a sysfs tree, as `dpro record --sysfs-root`
    monkeypatch.setenv(sysfs.SYSFS_ROOT_ENV, str(AFTER))
    assert sysfs.sysfs_dir() == AFTER / "sys"
    monkeypatch.delenv(sysfs.SYSFS_ROOT_ENV)
    assert sysfs.sysfs_dir() == Path("/sys")


def test_snapshot_of_a_recorded_mlx5_tree() -> None:
    snap = take_snapshot(BEFORE, gpu=False, cpu=False)
    assert snap.values[CounterKey("rdma", "mlx5_0/1", "port_xmit_data")] == 81234567890123
    assert snap.values[CounterKey("rdma_hw", "mlx5_0/1", "out_of_sequence")] == 4294967290
    assert snap.values[CounterKey("netdev", "ens1f0np0", "rx_bytes")] == 734217001220
    assert CounterKey("rdma_hw", "mlx5_0/1", "lifespan") not in snap.values  # a setting, not a counter
    assert snap.drivers["mlx5_0/1"] == "mlx5_core" and snap.drivers["ens1f0np0"] == "mlx5_core"
    assert snap.notes == ["mlx5_1/1: no hw_counters (none exposed by the driver, or unreadable)"]
    rows = {(r["device"], r["name"]): r for r in snap.rows()}
    xmit = rows["mlx5_0/1", "port_xmit_data"]
    assert (xmit["canonical"], xmit["unit"], xmit["value_in_unit"]) == ("tx_bytes", "bytes", 4 * 81234567890123)
    assert list(snap.to_frame().columns) == ["source", "device", "name", "canonical", "unit", "value", "value_in_unit"]
    assert snapshot.Snapshot.from_dict(json.loads(json.dumps(snap.to_dict()))) == snap


def test_diff_gives_rates_in_bytes_across_a_32bit_wrap() -> None:
    d = fixture_diff(10.0)
    assert d.elapsed_s == 10.0
    tx = only(d.find("tx_bytes", device="mlx5_0/1"))  # 12.5e9 four-byte words in 10 s
    assert (tx.name, tx.delta, tx.per_s) == ("port_xmit_data", 50_000_000_000, 5e9)
    oos = only(d.find("rx_out_of_sequence"))  # 4294967290 -> 10: one 32-bit wrap
    assert (oos.delta, oos.wrapped, oos.per_s) == (16, True, 1.6)
    cnp = only(d.find("cnp_handled"))  # a 64-bit congestion counter: no wrap
    assert (cnp.delta, cnp.wrapped) == (500_000, False)
    assert only(d.find("link_down_events", device="mlx5_0/1")).delta == 1
    assert only(d.find("rx_bytes", source="netdev")).per_s == 5e6
    assert only(d.find("rx_drops")).delta == 4
    assert "rdma_hw mlx5_0/1 out_of_sequence: wrapped around 2^32" in d.notes
    assert "rdma_hw mlx5_0/1 np_cnp_sent: only in the snapshot before" in d.notes
    assert any(n.startswith("rdma mlx5_0/1 symbol_error: saturated at 65535") for n in d.notes)
    assert not d.find("np_cnp_sent") and not d.find("lifespan")
    assert set(d.to_frame()["device"]) == {"mlx5_0/1", "mlx5_1/1", "ens1f0np0"}
    assert json.loads(json.dumps(d.to_dict()))["elapsed_s"] == 10.0


def test_no_rates_without_elapsed_time() -> None:
    d = fixture_diff(0.0)
    assert all(r.per_s is None for r in d.rates) and "elapsed time is 0 s: no per-second rates" in d.notes


def test_wrap_rule() -> None:
    assert (delta(2**32 - 6, 10, 32).value, delta(2**32 - 6, 10, 32).wrapped) == (16, True)
    assert delta(5, 3, 64).value is None and "reset" in delta(5, 3, 64).note  # 64-bit: a reset
    assert delta(500, 3, 16, saturates=True).value is None  # PMA counters saturate, never wrap
    assert "saturated" in delta(65000, 65535, 16, saturates=True).note
    assert delta(10, 20, 16, saturates=True).note is None
    # A reading past 2^32 proves a "32-bit" PMA data counter is the 64-bit extended one.
    assert effective_width(32, 2**32 + 1) == 64 and effective_width(32, 2**32 - 1) == 32
    assert delta(2**40, 5, 32).value is None  # then a decrease is a reset, not a wrap


def test_missing_devices_give_notes_not_errors(tmp_path: Path) -> None:
    empty = take_snapshot(tmp_path, gpu=False, cpu=False)
    assert empty.values == {}
    assert empty.notes == [f"no RDMA devices under {tmp_path / 'sys' / 'class' / 'infiniband'}",
                           f"no network interfaces under {tmp_path / 'sys' / 'class' / 'net'}"]
    snap = take_snapshot(BEFORE, rdma=["mlx5_0", "mlx5_7"], netdev=["eth9"], gpu=False, cpu=False)
    assert {k.device for k in snap.values} == {"mlx5_0/1"}
    assert f"RDMA device mlx5_7 not found under {BEFORE / 'sys' / 'class' / 'infiniband'}" in snap.notes
    assert f"interface eth9 not found under {BEFORE / 'sys' / 'class' / 'net'}" in snap.notes
    assert take_snapshot(BEFORE, rdma=[], netdev=[], gpu=False, cpu=False).values == {}


def test_cpu_time_is_read_from_this_hosts_proc_stat_and_its_stolen_share_computed(tmp_path: Path) -> None:
    before = take_snapshot(tmp_path, rdma=[], netdev=[], gpu=False)  # a recorded tree: CPU time is still this host's
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:  # CPU time the host's CPUs wanted
        pass
    after = take_snapshot(tmp_path, rdma=[], netdev=[], gpu=False)
    assert set(after.cpu_times) == set(procstat.CPU_STATES) and after.values == {}
    assert after.cpu_times["user"] + after.cpu_times["system"] > before.cpu_times["user"] + before.cpu_times["system"]
    share = procstat.steal_share(before.cpu_times, after.cpu_times)
    assert share is not None and 0 <= share <= 1
    assert snapshot.Snapshot.from_dict(json.loads(json.dumps(after.to_dict()))) == after
    assert take_snapshot(tmp_path, rdma=[], netdev=[], gpu=False, cpu=False).cpu_times == {}
    written_by_1_4 = {k: v for k, v in after.to_dict().items() if k != "cpu_times"}
    assert snapshot.Snapshot.from_dict(written_by_1_4).cpu_times == {}
    # 60 ticks busy and 40 stolen, however the idle time went
    start = dict.fromkeys(procstat.CPU_STATES, 100)
    end = {**start, "user": 130, "system": 130, "steal": 140, "idle": 900}
    assert procstat.steal_share(start, end) == pytest.approx(0.4)
    assert procstat.steal_share(start, start) is None and procstat.steal_share({}, end) is None
    old = tmp_path / "stat"
    old.write_text("cpu  2891232 4824 309980 2755240 9217 0 40425\ncpu0 1 2 3 4 5 6 7\n")  # before Linux 2.6.11
    assert procstat.read_cpu_times(old) == ({}, f"no steal time in {old} (its first line: "
                                                "'cpu 2891232 4824 309980 2755240 9217 0 40425')")
    assert procstat.read_cpu_times(tmp_path / "none")[1] == f"no CPU times in {tmp_path / 'none'}"
    (tmp_path / "blank").write_text("\n")
    assert procstat.read_cpu_times(tmp_path / "blank")[1].startswith("no steal time in")


def test_vendor_names_map_to_one_canonical_name() -> None:
    cases = {
        "rx_pause_frames": [("mlx5_core", "rx_pause_ctrl_phy"), ("bnxt_en", "rx_pause_frames"), ("ice", "link_xoff_rx.nic")],
        "tx_pause_frames": [("mlx5_core", "tx_pause_ctrl_phy"), ("bnxt_en", "tx_pause_frames"), ("ice", "link_xoff_tx")],
        "rx_pfc_frames_prio3": [("mlx5_core", "rx_prio3_pause"), ("bnxt_en", "rx_pfc_ena_frames_pri3"),
                                ("ice", "rx_priority_3_xoff.nic")],
        "rx_port_discards": [("mlx5_core", "rx_discards_phy"), ("ice", "rx_dropped.nic")],
        "rx_crc_errors": [("mlx5_core", "rx_crc_errors_phy"), ("bnxt_en", "rx_fcs_err_frames")],
    }
    for canonical, names in cases.items():
        for driver, name in names:
            assert catalog.describe("ethtool", name, driver).canonical == canonical, (driver, name)
            assert catalog.describe("ethtool", name, None).canonical == canonical, name  # driver unknown
    assert catalog.describe("ethtool", "rx_prio3_pause_duration", "mlx5_core").canonical == "rx_pfc_pause_us_prio3"
    assert catalog.describe("ethtool", "rx_pause_ctrl_phy", "bnxt_en").canonical is None  # another driver's name
    assert catalog.describe("ethtool", "rx_bytes", "virtio_net").canonical == "rx_bytes"
    # The same RDMA and Ethernet concepts meet under one name.
    assert catalog.describe("rdma_hw", "out_of_buffer", "mlx5_core").canonical == \
        catalog.describe("ethtool", "rx_out_of_buffer", "mlx5_core").canonical == "rx_no_buffer_drops"
    assert catalog.describe("rdma_hw", "out_of_buffer", "mlx5_core").width == 32
    assert catalog.describe("rdma_hw", "out_of_buffer", "irdma").width == 64
    with pytest.raises(ValueError):
        catalog.describe("snmp", "x")


def test_ethtool_output_of_an_mlx5_port_is_parsed() -> None:
    stats = ethtool.parse_ethtool_stats(ETHTOOL_MLX5.read_text())
    assert len(stats) == 169  # every line but the "NIC statistics:" header
    assert stats["rx_pause_ctrl_phy"] == 184291 and stats["rx_prio3_pause_duration"] == 91442
    assert stats["rx_vport_rdma_unicast_bytes"] == 323950617243234
    assert ethtool.parse_ethtool_stats("NIC statistics:\n     rx_bytes.nic: 7\n     tx_queue_0_packets: 3\n"
                                       "     bogus: n/a\n") == {"rx_bytes.nic": 7, "tx_queue_0_packets": 3}


def test_ethtool_recorded_outputs_diff_with_canonical_names(tmp_path: Path) -> None:
    text = ETHTOOL_MLX5.read_text()
    later = tmp_path / "later.txt"
    later.write_text(text.replace("rx_out_of_buffer: 4294967000", "rx_out_of_buffer: 100")
                         .replace("rx_prio3_pause: 184291", "rx_prio3_pause: 194291"))
    root = tmp_path / "no-sysfs"
    before = take_snapshot(root, rdma=[], netdev=[], ethtool_files={"ens1f0np0": ETHTOOL_MLX5}, gpu=False)
    after = take_snapshot(root, rdma=[], netdev=[], ethtool_files={"ens1f0np0": later}, gpu=False)
    d = diff(before, dataclasses.replace(after, monotonic_ns=before.monotonic_ns + 2_000_000_000))
    assert only(d.find("rx_pfc_frames_prio3")).per_s == 5000.0
    drops = only(d.find("rx_no_buffer_drops"))  # a 32-bit Q counter behind ethtool: it wraps
    assert (drops.name, drops.delta, drops.wrapped) == ("rx_out_of_buffer", 396, True)
    _, note = ethtool.read_ethtool_file(tmp_path / "missing.txt")
    assert note.startswith(f"recorded ethtool output {tmp_path / 'missing.txt'}: ")


def test_ethtool_live_reports_what_it_cannot_read(monkeypatch) -> None:
    if shutil.which("ethtool"):
        stats, note = ethtool.run_ethtool_stats("lo")  # lo has no NIC statistics
        assert stats == {} and note == "ethtool -S lo: no stats available"
        stats, note = ethtool.run_ethtool_stats("dpro-no-such-if")
        assert stats == {} and note.startswith("ethtool -S dpro-no-such-if: ")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    snap = take_snapshot(BEFORE, rdma=[], netdev=[], ethtool=["eth0"], gpu=False, cpu=False)
    assert snap.values == {} and snap.notes == ["ethtool -S eth0: ethtool is not installed"]


def test_live_netdev_counters_of_loopback_move() -> None:
    before = take_snapshot(rdma=[], netdev=["lo"], gpu=False)
    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname(), timeout=10) as a:
        b, _ = server.accept()
        with b:
            a.sendall(b"x" * 100_000)
            received = 0
            while received < 100_000:
                received += len(b.recv(65536))
    d = diff(before, take_snapshot(rdma=[], netdev=["lo"], gpu=False))
    assert only(d.find("tx_bytes", device="lo")).delta >= 100_000 and d.elapsed_s > 0


def test_missing_gpu_gives_a_note() -> None:
    snap = take_snapshot(BEFORE, rdma=[], netdev=[], gpu=True, cpu=False)
    if not any(k.source == "gpu" for k in snap.values):  # no GPU here: a note says why
        assert len(snap.notes) == 1 and snap.notes[0].startswith("GPU counters not read: NVML"), snap.notes


def test_gpu_counters_through_nvml(tmp_path: Path) -> None:
    # No GPU here: the driver library is replaced by the stand-in with the real NVML C signatures
    # (tests/fakes/fake_nvml.c: two GPUs, field values 5000 + position); pynvml runs unchanged.
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is needed to build the stand-in NVML library")
    lib = tmp_path / "libnvidia-ml.so.1"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", lib, FAKES / "fake_nvml.c"], check=True)
    code = "import json; from dpro.collectors.counters.nvml import read_gpu_counters; print(json.dumps(read_gpu_counters()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"LD_LIBRARY_PATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, check=True)
    gpus, notes = json.loads(out.stdout)
    assert notes == [] and set(gpus) == {"gpu0", "gpu1"}
    assert gpus["gpu1"] == {name: 5000 + i for i, name in enumerate(catalog.GPU_FIELDS)}
    assert catalog.describe("gpu", "nvlink_throughput_data_tx").scale == 1024
