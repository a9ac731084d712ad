"""The typed records of a run's JSON files (:mod:`dpro.run_records`): read from a real H100 run,
older forms upgraded, damaged entries left out rather than raised."""

from __future__ import annotations

import json

import pytest

from dpro.comm_hooks import CAST_HOOKS, POWERSGD_MATMUL, compress_flag, parse_compress
from dpro.run_format import open_run
from dpro.run_records import DDP_FIRST_BUCKET_BYTES, Calibration, DdpLayout, RankMeta

from .conftest import ROOT

H100_RUN = ROOT / "tests" / "data" / "runs" / "h100-ddp-1rank"


def test_a_real_runs_metadata_and_calibration_are_typed() -> None:
    run = open_run(H100_RUN)
    raw = json.loads((H100_RUN / "ranks" / "0" / "meta.json").read_text())
    meta = run.rank_meta(0)
    assert meta.present and (meta.rank, meta.world_size, meta.host, meta.backend) == (0, 1, raw["host"], "nccl")
    assert meta.ddp[0].bucket_bytes == [b["bytes"] for b in raw["ddp"][0]["buckets"]]
    assert meta.memory is not None and meta.memory.parameters_bytes == raw["memory"]["parameters_bytes"]
    assert meta.versions["torch"] == raw["versions"]["torch"]

    calibration = run.calibration(0)
    assert calibration.device == "cuda:0" and not calibration.problems
    assert set(calibration.event_costs) == {"forward", "backward"} and calibration.event_counts["forward"] > 0
    assert {c.coll for c in calibration.collectives} >= {"all_reduce", "all_gather"}
    assert all(c.group_size == 1 and c.median_ns > 0 for c in calibration.collectives)
    assert set(calibration.compression) == {*CAST_HOOKS, POWERSGD_MATMUL}
    assert calibration.interference is not None and calibration.interference.comm_alone_ns > 0


def test_a_rank_without_files_reads_as_empty_records(tmp_path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"format": "dpro-run", "format_version": "1.2"}))
    (tmp_path / "ranks" / "0").mkdir(parents=True)
    run = open_run(tmp_path)
    assert run.rank_meta(0) == RankMeta() and not run.rank_meta(0).present
    assert run.calibration(0) == Calibration()


def test_older_forms_are_upgraded_where_they_are_read() -> None:
    # format 1.0/1.1: one profiler price for every event; a DDP entry without its first cap
    assert Calibration.from_json({"profiler": {"main": {"per_event_ns": 550.0}}}).event_costs == \
        {"forward": 550.0, "backward": 550.0}
    [layout] = DdpLayout.all_in({"ddp": [{"bucket_cap_bytes": 25 << 20}, {"error": "RuntimeError: x"}]})
    assert layout.first_bucket_bytes_cap == DDP_FIRST_BUCKET_BYTES and layout.buckets == ()
    # a stream without the port it listened on (before dpro kept it), one that was never timed
    # (kept: its port still marks dpro's own traffic; the link model gives it no rate)
    links = Calibration.from_json({"collectives": {"links": [
        {"src": 1, "dst": 0, "window_ns": 5e7, "window_bytes": [1, 2]}, {"src": 0, "dst": 1}]}}).links
    assert [(s.listen_port, s.window_bytes) for s in links] == [(None, (1.0, 2.0)), (None, ())]
    from dpro.replayer.linkmodel import wire_rates

    untimed = Calibration.from_json({"collectives": {"links": [{"src": 0, "dst": 1, "window_bytes": [5, 5, 1]}]}})
    assert wire_rates({0: untimed}, {0: "a", 1: "b"}) == {}


def test_damaged_entries_are_left_out_and_failed_parts_said() -> None:
    meta = RankMeta.from_json({"rank": 3, "host": "h", "process_groups": [{"pg_name": "0"}, "junk", {"x": 1}],
                               "parallel": {"meshes": "junk", "pipeline": [{"stage_index": [2]}]}, "memory": {}})
    assert [g["pg_name"] for g in meta.process_groups] == ["0"] and meta.parallel.meshes == ()
    assert meta.parallel.stage == 2 and meta.memory is None and meta.parallel.dtensor_parameters is None
    calibration = Calibration.from_json({"profiler": {"error": "RuntimeError: x"},
                                         "collectives": {"skipped": "not every rank reached the calibration",
                                                         "collectives": [{"coll": "all_reduce"}]}})
    assert calibration.collectives == () and calibration.problems == {
        "profiler": "RuntimeError: x", "collectives": "not every rank reached the calibration"}


@pytest.mark.parametrize("value", ["fp16", "bf16", "powersgd:4"])
def test_compress_values_round_trip(value: str) -> None:
    assert compress_flag(*parse_compress(value)) == value


@pytest.mark.parametrize("value", ["powersgd", "powersgd:0", "int8"])
def test_unknown_compress_values_say_what_is_known(value: str) -> None:
    with pytest.raises(ValueError, match="powersgd"):
        parse_compress(value)
