"""One vocabulary for collective names, categories and dtype sizes, checked on real traces."""

from __future__ import annotations

import pytest

from dpro.graph.kineto import load_trace
from dpro.graph.matching import rank_instances
from dpro.graph.vocabulary import (canonical_collective, collective_family, collective_in_name, dtype_bytes,
                                   modern_category, step_number)

from .conftest import DATA


def test_every_dtype_in_the_real_traces_has_its_size() -> None:
    for trace in sorted(DATA.glob("*/*.json.gz")):
        if trace.name.startswith("simple-add-execution"):
            continue  # not a Kineto trace
        dtypes = load_trace(trace, cache=False).events["dtype"].dropna().astype(str).unique()
        assert all(dtype_bytes(d) is not None for d in dtypes), (trace.name, list(dtypes))


def test_long_and_byte_tensors_of_a_real_nccl_trace_are_sized_by_their_dtype() -> None:
    events = load_trace(DATA / "gpu" / "a100-2rank-ddp-rank0.json.gz", cache=False).events
    calls = events[events["name"] == "record_param_comms"]
    assert {"Long", "Byte", "Float"} <= set(calls["dtype"].dropna().astype(str))
    instances = rank_instances(events, 0)
    small = instances[(instances["coll_name"] == "broadcast") & (instances["occurrence"] == 1)]
    # DDP broadcasts 53 int64 buffers: 424 bytes, not the 212 a 4-byte guess would give
    assert list(small["nbytes"]) == [53 * 8] * 3
    floats = instances[instances["coll_name"] == "all_reduce"]
    assert floats["nbytes"].iloc[0] == 2049000 * 4


@pytest.mark.parametrize(("name", "size"), [
    ("Long", 8), ("long int", 8), ("int64", 8), ("Byte", 1), ("unsigned char", 1), ("uint8", 1), ("Float", 4),
    ("float", 4), ("BFloat16", 2), ("c10::BFloat16", 2), ("Half", 2), ("c10::Half", 2), ("Double", 8), ("Bool", 1),
    ("Float8_e4m3fn", 1), ("torch.float16", 2), ("ComplexFloat", 8), ("no such type", None), (None, None),
])
def test_dtype_sizes(name, size) -> None:
    assert dtype_bytes(name) == size


def test_collective_names_and_families() -> None:
    assert canonical_collective("AllReduce") == canonical_collective("allreduce") == "all_reduce"
    assert canonical_collective("_allgather_base") == "_all_gather_base"
    assert collective_in_name("ncclKernel_AllReduce_RING_LL_Sum_float") == "all_reduce"
    assert collective_in_name("nccl:all_reduce") == collective_in_name("c10d::allreduce_") == "all_reduce"
    assert collective_in_name("ncclDevKernel_Generic") is None and collective_in_name("aten::mm") is None
    assert [collective_family(c) for c in ("_all_gather_base", "all_gather_into_tensor_coalesced",
                                           "_reduce_scatter_base", "all_reduce_coalesced", "broadcast")] == \
        ["all_gather", "all_gather", "reduce_scatter", "all_reduce", "broadcast"]
    assert modern_category("Kernel") == "kernel" and modern_category("Operator") == "cpu_op"
    assert step_number("ProfilerStep#12") == 12 and step_number("ProfilerStep#x") == -1
