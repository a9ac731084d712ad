"""The Kineto trace loader, on the real traces in ``tests/data`` (see its NOTICE) and on small made-up ones."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import stat
from decimal import Decimal
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd
import pytest

from dpro.graph import kineto
from dpro.graph.kineto import TraceFormatError, TraceTables, decode, load_trace

from .conftest import DATA

# file: (rank, rank_source, steps, events named ProfilerStep#N as counted in the README)
EXPECTED = {
    "gpu/a100-2rank-ddp-rank0.json.gz": (0, "distributedInfo", 3, 3),
    "gpu/sampled-128rank-rank0.json.gz": (0, "distributedInfo", 2, 2),
    "gpu/sampled-128rank-rank1.json.gz": (1, "distributedInfo", 2, 2),
    "gpu/v100-1rank-ns-timestamps.json.gz": (0, "distributedInfo", 5, 5),
    "gpu/v100-resnet50-worker0.json.gz": (0, "file name", 6, 6),
    "gpu/a100-alexnet-sync-events.json.gz": (0, "distributedInfo", 0, 0),
    # 2 steps on the CPU; the third ProfilerStep#1 of the README is its GPU-side annotation
    "gpu/mi250-rocm-toy-train.json.gz": (0, "default", 2, 3),
    "gpu/simple-add-kineto.json.gz": (0, "distributedInfo", 0, 0),
    "cpu/gloo-300rank-rank34.json.gz": (34, "distributedInfo", 1, 1),
}
EVENT_DTYPES = {
    "rank": "int32", "cat": "category", "name": "category", "pid": "int64", "tid": "int64",
    "stream": "int32", "device": "int32", "start_ns": "int64", "dur_ns": "int64", "step": "int32",
    "correlation": "int64", "external_id": "int64", "coll_name": "category", "pg_name": "category",
    "pg_desc": "category", "in_nelems": "int64", "out_nelems": "int64", "group_size": "int32",
    "dtype": "category", "seq": "int64",
}
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"}


@pytest.fixture(scope="module")
def traces() -> Path:
    return DATA


@pytest.fixture(scope="module")
def loaded(traces: Path) -> dict[str, TraceTables]:
    return {name: load_trace(traces / name, cache=False) for name in EXPECTED}


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Caches of the tests go to a temporary folder, never to ~/.cache."""
    folder = tmp_path / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    return folder


def reference_ns(trace: Path, phases: tuple[str, ...]) -> np.ndarray:
    """Sorted epoch ns of the ``ts`` of the events of these phases, computed with Decimal."""
    data = json.loads(gzip.decompress(trace.read_bytes()), parse_float=Decimal)
    base = data.get("baseTimeNanoseconds", 0)
    return np.sort(np.array([int(Decimal(e["ts"]) * 1000) + base for e in data["traceEvents"]
                             if e["ph"] in phases and e.get("cat") != "Trace"], np.int64))


def write_trace(path: Path, events: list[dict], **header) -> Path:
    text = json.dumps({**header, "traceEvents": events}).encode()
    path.write_bytes(gzip.compress(text) if path.suffix == ".gz" else text)
    return path


def cpu_op(name: str, ts: float, dur: float = 1.0, **args) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


# --- real traces -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", EXPECTED)
def test_events_have_the_documented_columns_and_dtypes(loaded, name):
    events = loaded[name].events
    assert {c: str(t) for c, t in events.dtypes.items()} == EVENT_DTYPES
    assert len(events) > 0 and (events["rank"] == EXPECTED[name][0]).all()


@pytest.mark.parametrize("name", EXPECTED)
def test_rank(loaded, name):
    meta = loaded[name].meta
    assert (meta["rank"], meta["rank_source"]) == EXPECTED[name][:2]


@pytest.mark.parametrize("name", EXPECTED)
def test_steps_come_from_the_cpu_profiler_step_events(loaded, name):
    tables = loaded[name]
    steps, events = tables.steps, tables.events
    assert len(steps) == EXPECTED[name][2]
    assert events["name"].astype(str).str.startswith("ProfilerStep#").sum() == EXPECTED[name][3]
    assert list(steps.columns) == ["step", "start_ns", "end_ns"] and (steps.dtypes == "int64").all()
    assert steps["step"].is_unique and steps["start_ns"].is_monotonic_increasing
    assert (steps["start_ns"] < steps["end_ns"]).all()
    inside = events[events["step"] >= 0]
    assert set(inside["step"]) <= set(steps["step"])
    cpu = events[events["device"] < 0]
    for step, start, end in steps.itertuples(index=False):  # the CPU events starting in a step, and only them
        within = (cpu["start_ns"] >= start) & (cpu["start_ns"] < end)
        assert within.any() and (within == (cpu["step"] == step)).all()


@pytest.mark.parametrize("name", EXPECTED)
def test_times_are_sorted_non_negative_and_inside_the_profiling_window(loaded, name):
    tables = loaded[name]
    start, dur = tables.events["start_ns"], tables.events["dur_ns"]
    assert start.is_monotonic_increasing and (dur >= 0).all()
    assert tables.meta["span_start_ns"] <= start.min() and (start + dur).max() <= tables.meta["span_end_ns"]
    assert pd.Timestamp("2021-01-01").value < start.min() < pd.Timestamp("2026-01-01").value  # epoch ns
    assert tables.flows["ts_ns"].is_monotonic_increasing


@pytest.mark.parametrize("name", ["gpu/a100-2rank-ddp-rank0.json.gz",  # relative to baseTimeNanoseconds
                                  "gpu/v100-1rank-ns-timestamps.json.gz",  # epoch µs with ns decimals
                                  "gpu/sampled-128rank-rank1.json.gz",  # epoch µs, integers
                                  "gpu/mi250-rocm-toy-train.json.gz"])
def test_timestamps_are_exact_to_the_nanosecond(loaded, traces, name):
    tables = loaded[name]
    assert np.array_equal(np.sort(tables.events["start_ns"].to_numpy()), reference_ns(traces / name, ("X",)))
    assert np.array_equal(tables.flows["ts_ns"].to_numpy(), reference_ns(traces / name, ("s", "f", "t")))


def test_nanosecond_trace_keeps_sub_microsecond_digits(loaded):
    tables = loaded["gpu/v100-1rank-ns-timestamps.json.gz"]
    assert tables.meta["time_unit"] == "ns" and tables.meta["base_time_ns"] is None
    assert (tables.events["start_ns"] % 1000 != 0).mean() > 0.9
    first = tables.steps.iloc[0]  # "ts": 1712195495502094.565 in the file
    assert (first["step"], first["start_ns"]) == (101, 1712195495502094565)


@pytest.mark.parametrize("name", [n for n in EXPECTED if n.startswith("gpu/")])
def test_gpu_kernels_link_to_their_launch(loaded, name):
    events = loaded[name].events
    kernels, launches = events[events["cat"] == "kernel"], events[events["cat"] == "cuda_runtime"]
    assert len(kernels) > 0
    assert (kernels["stream"] >= 0).all() and (kernels["device"] >= 0).all()
    matched = kernels.merge(launches[["correlation", "step"]], on="correlation", suffixes=("", "_launch"))
    assert len(matched) == len(kernels)  # every kernel has exactly one launch
    assert (matched["step"] == matched["step_launch"]).all()


@pytest.mark.parametrize("name", EXPECTED)
def test_cpu_events_have_no_stream_or_device(loaded, name):
    events = loaded[name].events
    cpu = events[~events["cat"].isin(GPU_CATEGORIES)]
    assert (cpu["stream"] == -1).all() and (cpu["device"] == -1).all()


def test_kernels_inside_steps_take_the_step_of_their_launch(loaded):
    events = loaded["gpu/a100-2rank-ddp-rank0.json.gz"].events
    assert events.loc[events["cat"] == "kernel", "step"].value_counts().to_dict() == {4: 900, 5: 900, 6: 900}


def test_2021_schema_categories_get_their_modern_names(loaded):
    tables = loaded["gpu/v100-resnet50-worker0.json.gz"]
    assert set(tables.events["cat"].cat.categories) == {"cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset"}
    kernels = tables.events[tables.events["cat"] == "kernel"]
    assert (kernels["external_id"] >= 0).all()  # spelt "external id" in that schema
    assert (kernels["tid"] == kernels["stream"]).all()  # tid "stream 7" read as 7


def test_a100_all_reduce_has_sizes_and_process_group(loaded):
    tables = loaded["gpu/a100-2rank-ddp-rank0.json.gz"]
    events = tables.events
    all_reduce = events[(events["coll_name"] == "all_reduce") & (events["in_nelems"] > 0)]
    assert set(all_reduce["name"]) >= {"record_param_comms",
                                       "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"}
    assert (all_reduce["pg_name"] == "0").all() and (all_reduce["group_size"] == 2).all()
    assert (all_reduce["dtype"] == "Float").all()
    names = events.groupby("coll_name", observed=True)["name"].agg(set)
    assert {"nccl:all_reduce", "c10d::allreduce_"} <= names["all_reduce"]
    groups = tables.process_groups
    assert groups[["pg_name", "pg_desc", "backend", "size"]].values.tolist() == [["0", "default_pg", "nccl", 2]]
    assert groups["ranks"].tolist() == [[0, 1]]
    assert (tables.meta["world_size"], tables.meta["backend"], tables.meta["nccl_version"]) == (2, "nccl", "2.17.1")


def test_sampled_trace_names_its_collectives(loaded):
    events = loaded["gpu/sampled-128rank-rank0.json.gz"].events
    assert {"all_reduce", "all_to_all", "_all_gather_base"} <= set(events["coll_name"].dropna())
    kernels = events[events["name"].astype(str).str.startswith("ncclKernel_SendRecv")]
    assert len(kernels) and (kernels["coll_name"] == "send_recv").all()


def test_v100_process_group_id_is_read_as_its_name(loaded):
    events = loaded["gpu/v100-1rank-ns-timestamps.json.gz"].events
    comms = events[events["name"] == "record_param_comms"]
    assert len(comms) and (comms["pg_name"] == "0").all()


def test_gloo_process_groups_come_whole_from_pg_config(loaded):
    tables = loaded["cpu/gloo-300rank-rank34.json.gz"]
    groups = tables.process_groups.set_index("pg_name")
    assert tables.meta["pg_count"] == 10 and tables.meta["world_size"] == 300
    # pg_config lists the 10 groups "0".."9" and once more group "0" under its hashed name
    assert [str(i) for i in range(10)] == list(groups.index[:10]) and len(groups) == 11
    assert all(ranks == list(range(300)) for ranks in groups["ranks"])
    assert (groups["size"] == 300).all() and (groups["backend"] == "gloo").all()
    assert groups.loc["0", "pg_desc"] == "default_pg"
    assert (tables.events["coll_name"] == "all_reduce").sum() == 10  # gloo:all_reduce annotations


def test_rocm_trace_links_hip_launches_to_kernels(loaded):
    events = loaded["gpu/mi250-rocm-toy-train.json.gz"].events
    runtime = set(events.loc[events["cat"] == "cuda_runtime", "name"])
    assert {"hipLaunchKernel", "hipExtModuleLaunchKernel"} <= runtime
    gpu = events[events["cat"].isin(["kernel", "gpu_memcpy"])]
    assert (gpu["device"] == 2).all() and (gpu["stream"] == 0).all()


def test_cuda_sync_events_are_on_the_gpu(loaded):
    events = loaded["gpu/a100-alexnet-sync-events.json.gz"].events
    sync = events[events["cat"] == "cuda_sync"]
    assert len(sync) == 41 and (sync["device"] == 0).all()


def test_launch_flows_join_runtime_calls(loaded):
    tables = loaded["gpu/a100-2rank-ddp-rank0.json.gz"]
    flows, events = tables.flows, tables.events
    assert set(flows["cat"]) == {"ac2g", "fwdbwd"} and set(flows["phase"]) == {"s", "f"}
    ac2g = flows[flows["cat"] == "ac2g"]
    assert set(ac2g["flow_id"]) <= set(events.loc[events["correlation"] >= 0, "correlation"])


def test_plain_json_loads_like_gzip(traces, tmp_path):
    trace = traces / "gpu/mi250-rocm-toy-train.json.gz"
    plain = tmp_path / "mi250-rocm-toy-train.json"
    plain.write_bytes(gzip.decompress(trace.read_bytes()))
    assert_same_tables(load_trace(plain, cache=False), load_trace(trace, cache=False), source=False)


@pytest.mark.parametrize("name", ["gpu/a100-alexnet-sync-events.json.gz", "gpu/v100-1rank-ns-timestamps.json.gz"])
def test_small_pieces_give_the_same_tables(loaded, traces, name, monkeypatch):
    """Cutting the text at many more places changes nothing (nor does the switch to exact ts)."""
    monkeypatch.setattr(decode, "_piece_size", lambda path: 1 << 14)
    assert_same_tables(load_trace(traces / name, cache=False), loaded[name])


# --- cache -------------------------------------------------------------------------------------


def assert_same_tables(a: TraceTables, b: TraceTables, source: bool = True) -> None:
    for table in ("events", "flows", "steps", "process_groups"):
        pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table))
    assert a.meta == b.meta if source else {**a.meta, "source": None} == {**b.meta, "source": None}


def count_parses(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    parsed: list[Path] = []
    parse = kineto.parse

    def spy(path, rank):
        parsed.append(path)
        return parse(path, rank)

    monkeypatch.setattr(kineto, "parse", spy)
    return parsed


def test_cached_load_equals_fresh_load(traces, tmp_path, monkeypatch):
    trace = tmp_path / "a100-2rank-ddp-rank0.json.gz"
    shutil.copy(traces / "gpu/a100-2rank-ddp-rank0.json.gz", trace)
    parsed = count_parses(monkeypatch)
    fresh = load_trace(trace)
    cache = tmp_path / "a100-2rank-ddp-rank0.json.gz.dpro"
    assert {p.name for p in cache.iterdir()} == {"events.parquet", "flows.parquet", "meta.json"}
    cached = load_trace(trace)
    assert len(parsed) == 1
    assert_same_tables(cached, fresh)
    assert_same_tables(cached, load_trace(trace, cache=False))


def test_cache_is_invalidated_when_the_trace_changes(traces, tmp_path, monkeypatch):
    trace = tmp_path / "trace.json.gz"
    shutil.copy(traces / "gpu/sampled-128rank-rank0.json.gz", trace)
    parsed = count_parses(monkeypatch)
    assert load_trace(trace).meta["rank"] == 0
    shutil.copy(traces / "gpu/sampled-128rank-rank1.json.gz", trace)  # another size
    assert load_trace(trace).meta["rank"] == 1
    os.utime(trace, ns=(trace.stat().st_atime_ns, trace.stat().st_mtime_ns + 10**9))  # same size, new mtime
    load_trace(trace)
    load_trace(trace)
    assert len(parsed) == 3


def test_cache_depends_on_the_rank_argument(tmp_path, monkeypatch):
    trace = write_trace(tmp_path / "job.json.gz", [cpu_op("a", 1.0)])
    parsed = count_parses(monkeypatch)
    assert load_trace(trace, rank=3).meta["rank"] == 3
    assert load_trace(trace).meta["rank"] == 0
    assert load_trace(trace, rank=3).meta["rank"] == 3
    assert len(parsed) == 3


def test_cache_false_neither_reads_nor_writes(tmp_path, monkeypatch, private_cache):
    trace = write_trace(tmp_path / "job.json.gz", [cpu_op("a", 1.0)])
    parsed = count_parses(monkeypatch)
    load_trace(trace, cache=False)
    assert not (tmp_path / "job.json.gz.dpro").exists() and not private_cache.exists()
    load_trace(trace)  # writes the cache
    load_trace(trace, cache=False)  # does not read it
    assert len(parsed) == 3


def test_read_only_folder_caches_in_xdg_cache_home(tmp_path, monkeypatch, private_cache):
    folder = tmp_path / "read-only"
    folder.mkdir()
    trace = write_trace(folder / "job.json.gz", [cpu_op("a", 1.0)])
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    try:
        parsed = count_parses(monkeypatch)
        fresh = load_trace(trace)
        cached = load_trace(trace)
        assert len(parsed) == 1 and list(folder.iterdir()) == [trace]
        cache = private_cache / "dpro" / "traces" / hashlib.sha1(str(trace).encode()).hexdigest()
        assert {p.name for p in cache.iterdir()} == {"events.parquet", "flows.parquet", "meta.json"}
        assert_same_tables(cached, fresh)
    finally:
        folder.chmod(stat.S_IRWXU)


def test_no_writable_cache_folder_still_loads(tmp_path, monkeypatch):
    folder = tmp_path / "read-only"
    folder.mkdir()
    trace = write_trace(folder / "job.json.gz", [cpu_op("a", 1.0)])
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # a file: no cache folder can be made in it
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        assert len(load_trace(trace).events) == 1
        assert list(folder.iterdir()) == [trace]
    finally:
        folder.chmod(stat.S_IRWXU)


# --- made-up traces ----------------------------------------------------------------------------


@pytest.mark.parametrize(("file_name", "argument", "rank", "source"), [
    ("rank-3.json.gz", None, 3, "file name"),
    ("job_rank_12_trace.json", None, 12, "file name"),
    ("worker7.json.gz", None, 7, "file name"),
    ("rank-3.json.gz", 5, 5, "argument"),
    ("trace.json.gz", None, 0, "default"),
])
def test_rank_without_distributed_info(tmp_path, file_name, argument, rank, source):
    trace = write_trace(tmp_path / file_name, [cpu_op("a", 1.0)])
    meta = load_trace(trace, rank=argument, cache=False).meta
    assert (meta["rank"], meta["rank_source"]) == (rank, source)


def test_distributed_info_wins_over_the_file_name_and_the_argument(tmp_path):
    trace = write_trace(tmp_path / "rank3.json.gz", [cpu_op("a", 1.0)], distributedInfo={"rank": 1})
    assert load_trace(trace, cache=False).meta["rank"] == 1
    with pytest.warns(UserWarning, match="rank 1, not 5"):
        assert load_trace(trace, rank=5, cache=False).meta["rank"] == 1


def test_integers_beyond_64_bits_are_tolerated(tmp_path):
    huge = 2**70
    events = [cpu_op("a", 1.0, **{"External id": huge, "Record function id": huge, "Ev Idx": -huge}),
              cpu_op("b", 2.0, **{"External id": 7})]
    trace = write_trace(tmp_path / "big.json", events, baseTimeNanoseconds=10**9, trace_id=huge)
    events = load_trace(trace, cache=False).events
    assert events["external_id"].tolist() == [-1, 7]
    assert events["start_ns"].tolist() == [10**9 + 1000, 10**9 + 2000]


def test_names_of_collectives_are_made_canonical(tmp_path):
    names = ["nccl:all_reduce", "gloo:all_reduce", "c10d::allreduce_", "c10d::_allgather_base_",
             "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
             "ncclDevKernel_Generic(ncclDevComm*, unsigned long, ncclWork*)", "aten::add"]
    events = [cpu_op(name, float(i)) for i, name in enumerate(names)]
    events.append(cpu_op("record_param_comms", 9.0, **{"Collective name": "_allgather_base", "Seq": 4,
                                                       "In msg nelems": 8, "Process Group Name": "1"}))
    table = load_trace(write_trace(tmp_path / "t.json", events), cache=False).events
    assert table["coll_name"].astype(object).where(table["coll_name"].notna(), None).tolist() == [
        "all_reduce", "all_reduce", "all_reduce", "_all_gather_base", "all_gather", None, None, "_all_gather_base"]
    comm = table.iloc[-1]
    assert (comm["seq"], comm["in_nelems"], comm["pg_name"]) == (4, 8, "1")


def test_a_cut_outside_trace_events_falls_back_to_the_whole_file(tmp_path, monkeypatch):
    """A list of objects after traceEvents must not be taken for events when the text is cut."""
    devices = [{"id": i, "name": f"GPU {i}", "totalGlobalMem": 1 << 34} for i in range(64)]
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [cpu_op(f"op{i}", float(i)) for i in range(8)],
                                 "deviceProperties": devices}))
    monkeypatch.setattr(decode, "_piece_size", lambda path: 256)
    monkeypatch.setattr(decode, "_READ", 512)
    cuts = []
    decode_pieces = decode._decode_pieces
    monkeypatch.setattr(decode, "_decode_pieces", lambda path, cut: cuts.append(cut) or decode_pieces(path, cut))
    tables = load_trace(trace, cache=False)
    assert cuts == [True, False]
    assert tables.meta["device_properties"] == devices and len(tables.events) == 8


@pytest.mark.parametrize(("content", "suffix", "message"), [
    (b"\x00\x01garbage", ".json", "not valid JSON"),
    (b"\x00\x01garbage", ".json.gz", "not gzip-compressed"),
    (gzip.compress(b"not json at all"), ".json.gz", "not valid JSON"),
    (b'{"schemaVersion": 1, "deviceProperties": []}', ".json", "has no 'traceEvents'"),
    (b'[{"ph": "X"}]', ".json", "not a Kineto trace"),
    (b'{"traceEvents": [{"ph": "X", "ts": "yesterday"}]}', ".json", "not a Kineto trace"),
    (b"", ".json", "not valid JSON"),
])
def test_bad_input_is_a_one_line_trace_format_error(tmp_path, content, suffix, message):
    trace = tmp_path / f"bad{suffix}"
    trace.write_bytes(content)
    with pytest.raises(TraceFormatError, match=message) as error:
        load_trace(trace)
    assert "\n" not in str(error.value) and str(trace) in str(error.value)
    assert isinstance(error.value, ValueError)


def test_truncated_gzip_is_a_trace_format_error(traces, tmp_path):
    data = (traces / "gpu/sampled-128rank-rank0.json.gz").read_bytes()
    trace = tmp_path / "truncated.json.gz"
    trace.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match="truncated gzip") as error:
        load_trace(trace)
    assert "\n" not in str(error.value)


def test_missing_file_and_folder_are_trace_format_errors(tmp_path):
    with pytest.raises(TraceFormatError, match="not found"):
        load_trace(tmp_path / "nowhere.json.gz")
    with pytest.raises(TraceFormatError, match="folder"):
        load_trace(tmp_path)


def test_execution_trace_is_refused_with_a_hint(traces):
    with pytest.raises(TraceFormatError, match="execution trace") as error:
        load_trace(traces / "cpu/simple-add-execution-trace.json.gz")
    assert "\n" not in str(error.value)


def test_switch_to_exact_timestamps_mid_file(tmp_path, monkeypatch):
    """Epoch µs with nanosecond decimals appearing after other events are still exact."""
    early = [json.dumps(cpu_op(f"early{i}", float(i))) for i in range(50)]  # small numbers: floats suffice
    late = [json.dumps(cpu_op(f"late{i}", 0.0)).replace('"ts": 0.0', f'"ts": {1712195495519689 + i}.047')
            for i in range(50)]
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": [' + ", ".join(early + late) + "]}")
    monkeypatch.setattr(decode, "_piece_size", lambda path: 1 << 10)
    monkeypatch.setattr(decode, "_READ", 1 << 10)
    start = load_trace(trace, cache=False).events["start_ns"]
    assert start.iloc[0] == 0 and start.iloc[-1] == 1712195495519689047 + 49_000
    trace.write_text(trace.read_text().replace('"ts": 1712195495519738.047', '"ts": "later"'))
    with pytest.raises(TraceFormatError, match="'ts' is not a number"):
        load_trace(trace, cache=False)


def test_exact_timestamps_written_in_any_style(tmp_path):
    """Epoch µs decimals of varied widths, rounding digits and signs are read to the ns."""
    written = ["1712195495519689.047", "1712195495519689.5", "1712195495519690", "1712195495519690.0004",
               "1712195495519690.0006", "1712195495519691.9996", "-1712195495519691.25"]
    events = [json.dumps(cpu_op(f"e{i}", 0.0)).replace('"ts": 0.0', f'"ts": {ts}') for i, ts in enumerate(written)]
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": [' + ", ".join(events) + "]}")
    start = load_trace(trace, cache=False).events.set_index("name")["start_ns"]
    assert [start[f"e{i}"] for i in range(len(written))] == [
        1712195495519689047, 1712195495519689500, 1712195495519690000, 1712195495519690000,
        1712195495519690001, 1712195495519692000, -1712195495519691250]


def test_a_shapes_step_is_decoded_once_then_read_from_its_cache(tmp_path: Path) -> None:
    """The shapes step of a real 1-rank H100 run (tests/data/NOTICE): its input shapes and memory
    events as the one-purpose decoders read them; then cached, read back, and decoded again
    once the trace changes."""
    from dpro.graph.kineto import shapes_step
    from dpro.graph.kineto.allocator import MemoryTrace
    from dpro.graph.kineto.shapes import input_shapes

    trace = tmp_path / "trace-shapes.json.gz"
    shutil.copy(DATA / "runs" / "h100-ddp-1rank" / "ranks" / "0" / "trace-shapes.json.gz", trace)
    cache = tmp_path / "cache"
    step = shapes_step.load_shapes_step(trace, cache)
    assert step.input_shapes() == input_shapes(trace) and len(step.shapes) > 100
    assert step.memory == MemoryTrace.read(trace) and step.memory.peaks()
    assert (cache / shapes_step.CACHE_FILE).exists()

    marked = shapes_step.ShapesStep([(1, "marker", 0, "[]")], step.memory)  # what a read from the cache would give
    saved = msgspec.msgpack.decode((cache / shapes_step.CACHE_FILE).read_bytes())
    (cache / shapes_step.CACHE_FILE).write_bytes(msgspec.msgpack.encode({"key": saved["key"], "step": marked}))
    assert shapes_step.load_shapes_step(trace, cache).shapes == [(1, "marker", 0, "[]")]
    assert shapes_step.load_shapes_step(trace, None) == step  # no cache: decoded
    os.utime(trace, ns=(trace.stat().st_atime_ns, trace.stat().st_mtime_ns + 1))
    assert shapes_step.load_shapes_step(trace, cache) == step  # the trace changed: decoded again
    trace.write_bytes(b"\x1f\x8b truncated")
    with pytest.raises(TraceFormatError, match="cannot read"):
        shapes_step.load_shapes_step(trace, cache)


def test_frees_the_profiler_missed_are_taken_from_the_totals_where_the_address_is_reused(tmp_path: Path) -> None:
    """A real FSDP2 shapes step on gloo (tests/data/NOTICE): two all-gather outputs were freed on
    gloo's worker thread, unseen, and torch's CPU total kept counting them. Their addresses,
    handed out again with no free between, prove the frees; the reader's totals drop there, and
    the peak says how much of it such blocks may be."""
    from dpro.graph.kineto.allocator import MemoryTrace

    trace = DATA / "cpu" / "fsdp2-gloo-2rank-shapes-rank0.json.gz"
    events = [e for e in json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"] if e.get("name") == "[memory]"]
    events.sort(key=lambda e: e["ts"])
    reported = [e["args"]["Total Allocated"] for e in events]
    before = reported[0] - events[0]["args"]["Bytes"]
    (peak,) = MemoryTrace.read(trace).peaks()
    assert max(reported) - before == 3_454_792, "torch's own total, never dropping for the unseen frees"
    assert peak.added_bytes == 3_390_536, "after the root's gathered block (139,776 B) is reused, counted once"
    assert peak.unseen_free_bytes == 139_776 + 199_936, "both still unproven at the peak: freed by then, or not"

    def memory(ts: int, nbytes: int, addr: int, total: int, device: int) -> str:
        return json.dumps({"name": "[memory]", "ph": "i", "ts": ts, "args": {
            "Bytes": nbytes, "Addr": addr, "Total Allocated": total, "Device Type": device, "Device Id": device - 1}})

    small = tmp_path / "t.json"  # 100 B at address 1 freed unseen, its address reused at ts 3 and the peak after
    small.write_text('{"traceEvents": [' + ", ".join([  # on the CPU, torch's total keeps the unseen-freed block
        *(memory(ts, nbytes, addr, total, 0) for ts, nbytes, addr, total in
          [(1, 100, 1, 100), (2, 50, 2, 150), (3, 100, 1, 250), (4, 10, 3, 260)]),  # on a GPU, the total dropped
        *(memory(ts, nbytes, addr, total, 1) for ts, nbytes, addr, total in
          [(1, 100, 1, 100), (2, 50, 2, 150), (3, 100, 1, 150), (4, 10, 3, 160)])]) + "]}")
    cpu, gpu = MemoryTrace.read(small).peaks()
    assert (cpu.device, cpu.added_bytes, cpu.unseen_free_bytes, cpu.allocations) == ("cpu", 160, 0, [100, 50, 10])
    assert (gpu.device, gpu.added_bytes, gpu.unseen_free_bytes) == ("cuda:0", 160, 0), "not taken out twice"
