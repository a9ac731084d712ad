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


def test_probe_keeps_the_pairs_of_a_round_apart_on_a_topology(tmp_path: Path) -> None:
    """Two hosts on each of two leaves: one round may send one pair across the spine, not two
    (the schedule ``dpro health`` probes in); without the topology the first round holds two."""
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("".join(f"{h}: {{address: 127.0.0.1}}\n" for h in "abcd"))
    topology = tmp_path / "fabric.yaml"
    topology.write_text("switches: [leaf0, leaf1, spine]\nhosts: {a: [], b: [], c: [], d: []}\n"
                        "links: [[a, leaf0], [b, leaf0], [c, leaf1], [d, leaf1], [leaf0, spine], [leaf1, spine]]\n")

    def first_round(*extra: object) -> list[tuple[str, str]]:
        out = tmp_path / f"probes{len(extra)}.json"
        ran = dpro("anomaly", "probe", hosts, "-o", out, "--seconds", "0.1", "--message-size", "65536",
                   "--rounds", "1", *extra)
        assert ran.returncode == 0, ran.stderr
        matrix = json.loads(out.read_text())
        return sorted((matrix["hosts"][i], matrix["hosts"][j]) for i, row in enumerate(matrix["bandwidth"])
                      for j, v in enumerate(row) if v is not None and i < j)

    assert len(first_round()) == 2
    [(a, b)] = first_round("--topology", topology)
    assert {a, b} & {"a", "b"} and {a, b} & {"c", "d"}, "the round's one pair crosses the spine"
    topology.write_text("switches: [leaf0]\nhosts: {a: [], b: []}\nlinks: [[a, leaf0], [b, leaf0]]\n")
    assert_one_line_error(dpro("anomaly", "probe", hosts, "-o", tmp_path / "y.json", "--topology", topology),
                          "'c' is not in the topology")


def test_counters_from_a_recorded_sysfs_tree() -> None:
    # No RDMA NIC here: the fixture is a recorded real-format mlx5 sysfs tree.
    out = dpro("anomaly", "counters", "--sysfs-root", SYSFS, "--interval", "0.05", "--json")
    assert out.returncode == 0, out.stderr
    rates = json.loads(out.stdout)
    names = {r["name"] for r in rates["rates"]}
    assert {"port_xmit_data", "port_rcv_data", "symbol_error"} <= names
    assert all(r["delta"] == 0 for r in rates["rates"] if r["source"] == "rdma"), "the same tree twice: nothing moved"
    assert "cpu_steal_share" in rates, "this host's own CPU time (None where its CPUs wanted none)"
    table = dpro("anomaly", "counters", "--sysfs-root", SYSFS, "--interval", "0.05", "--all")
    assert table.returncode == 0 and "port_xmit_wait" in table.stdout


def test_diagnose_rejects_a_malformed_topology(recorded_run: Path, tmp_path: Path) -> None:
    for name, text in (("shape.json", '{"switches": 3}'), ("broken.yaml", "links: [")):
        (tmp_path / name).write_text(text)
        assert_one_line_error(dpro("diagnose", recorded_run, "--topology", tmp_path / name), str(tmp_path / name))
