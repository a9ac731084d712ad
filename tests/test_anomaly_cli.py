"""`dpro anomaly probe` and `dpro anomaly counters` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import assert_one_line_error, dpro

SYSFS = Path(__file__).parent / "fixtures" / "sysfs-mlx5" / "before" / "sys"


def test_probe_measures_every_ordered_pair(tmp_path: Path) -> None:
    # Three "hosts" on this machine (real TCP between real processes over loopback).
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("a: {address: 127.0.0.1}\nb: {address: 127.0.0.1}\nc: {address: 127.0.0.1}\n")
    out = dpro("anomaly", "probe", hosts, "-o", tmp_path / "probes.json", "--seconds", "0.3",
               "--message-size", "65536")
    assert out.returncode == 0, out.stderr
    matrix = json.loads((tmp_path / "probes.json").read_text())
    assert matrix["hosts"] == ["a", "b", "c"] and matrix["unit"] == "Gb/s"
    cells = [v for i, row in enumerate(matrix["bandwidth"]) for j, v in enumerate(row) if i != j]
    assert len(cells) == 6 and all(v > 0 for v in cells)
    assert all(row[i] is None for i, row in enumerate(matrix["bandwidth"]))
    assert_one_line_error(dpro("anomaly", "probe", hosts, "-o", tmp_path / "probes.json"), "not overwritten")
    (tmp_path / "bad.yaml").write_text("a: {address: 127.0.0.1}\n")
    assert_one_line_error(dpro("anomaly", "probe", tmp_path / "bad.yaml", "-o", tmp_path / "x.json"), "at least two hosts")


def test_counters_from_a_recorded_sysfs_tree() -> None:
    # No RDMA NIC here: the fixture is a recorded real-format mlx5 sysfs tree.
    out = dpro("anomaly", "counters", "--sysfs-root", SYSFS, "--interval", "0.05", "--json")
    assert out.returncode == 0, out.stderr
    rates = json.loads(out.stdout)
    names = {r["name"] for r in rates["rates"]}
    assert {"port_xmit_data", "port_rcv_data", "symbol_error"} <= names
    assert all(r["delta"] == 0 for r in rates["rates"] if r["source"] == "rdma"), "the same tree twice: nothing moved"
    table = dpro("anomaly", "counters", "--sysfs-root", SYSFS, "--interval", "0.05", "--all")
    assert table.returncode == 0 and "port_xmit_wait" in table.stdout


def test_diagnose_rejects_a_malformed_topology(recorded_run: Path, tmp_path: Path) -> None:
    for name, text in (("shape.json", '{"switches": 3}'), ("broken.yaml", "links: [")):
        (tmp_path / name).write_text(text)
        assert_one_line_error(dpro("diagnose", recorded_run, "--topology", tmp_path / name), str(tmp_path / name))
