"""DDP's buckets rebuilt for another cap, checked against the buckets real DDP built."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from itertools import product

import pytest

from dpro.replayer.buckets import FIRST_BUCKET_BYTES, Param, first_bucket_bytes, ready_order, rebuilt_buckets
from dpro.run_records import DdpLayout

from .conftest import JOBS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def real_layouts() -> list[dict]:
    """The layouts real DDP built for three models at six caps (tests/jobs/ddp_layouts.py)."""
    out = subprocess.run([sys.executable, JOBS / "ddp_layouts.py", str(free_port())], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def names(buckets: list) -> list[list[str]]:
    return [[p.name if isinstance(p, Param) else p["name"] for p in (b if isinstance(b, list) else b["params"])]
            for b in buckets]


def test_buckets_rebuilt_from_one_cap_are_those_ddp_built_at_another(real_layouts: list[dict]) -> None:
    for arch in ("gpt", "mlp", "cnn"):
        runs = [e for e in real_layouts if e["arch"] == arch]
        assert len({json.dumps(names(e["layout"]["buckets"])) for e in runs}) >= 3, "the caps give different layouts"
        for source, target in product(runs, runs):
            layout = target["layout"]
            emulated = rebuilt_buckets(ready_order(DdpLayout.from_meta(source["layout"])), layout["bucket_cap_bytes"],
                                       layout["first_bucket_bytes_cap"])
            assert names(emulated) == names(layout["buckets"]), (arch, source["cap_mb"], target["cap_mb"])
            assert [sum(p.nbytes for p in b) for b in emulated] == [b["bytes"] for b in layout["buckets"]]


def test_the_first_bucket_cap_follows_ddps_rule(real_layouts: list[dict]) -> None:
    default = next(e["layout"] for e in real_layouts if e["cap_mb"] is None)
    explicit = [e["layout"] for e in real_layouts if e["cap_mb"] is not None]
    assert default["first_bucket_bytes_cap"] == FIRST_BUCKET_BYTES
    for layout in explicit:  # torch 2.13: an explicit bucket_cap_mb caps the first bucket too
        assert layout["first_bucket_bytes_cap"] == layout["bucket_cap_bytes"]
        assert first_bucket_bytes(DdpLayout.from_meta(explicit[0]), layout["bucket_cap_bytes"]) == layout["bucket_cap_bytes"]
    assert first_bucket_bytes(DdpLayout.from_meta(default), 5 * 2**20) == FIRST_BUCKET_BYTES
    older = {k: v for k, v in default.items() if k != "first_bucket_bytes_cap"}  # format 1.0 recorded no first cap
    assert DdpLayout.from_meta(older).first_bucket_bytes_cap == FIRST_BUCKET_BYTES


@pytest.mark.parametrize(("seed", "mixed"), [(s, m) for s in range(3) for m in (False, True)])
def test_the_assignment_is_torchs_own(seed: int, mixed: bool) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 400_000, 40).tolist()
    dtypes = rng.choice([torch.float32, torch.float16] if mixed else [torch.float32], 40).tolist()
    tensors = [torch.empty(n, dtype=d) for n, d in zip(sizes, dtypes)]
    order = rng.permutation(40).tolist()  # the order gradients became ready
    limits = [int(rng.integers(1, 4)) * 2**20, int(rng.integers(1, 8)) * 2**20]
    theirs, _ = dist._compute_bucket_assignment_by_size([tensors[i] for i in order], limits, [False] * 40,
                                                        list(range(40)))
    params = [Param(str(i), sizes[i], tensors[i].element_size(), str(dtypes[i])) for i in order]
    ours = names(rebuilt_buckets(params, limits[1], limits[0]))
    theirs = [[params[i].name for i in bucket] for bucket in theirs]
    if not mixed:
        assert theirs == ours
        return
    # With several dtypes, the buckets still open at the end come in the order of torch's hash
    # map of dtypes: the same buckets, in an order of its own.
    closed = len(ours) - len({str(d) for d in dtypes})
    assert theirs[:closed] == ours[:closed] and sorted(theirs[closed:]) == sorted(ours[closed:])
