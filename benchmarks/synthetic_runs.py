"""Many-rank runs synthesized from one real trace: every rank a copy of it, its rank rewritten.

The trace (``tests/data/gpu/a100-2rank-ddp-rank0.json.gz``, rank 0 of a real 2-rank NCCL DDP
job on A100s) becomes rank ``r`` of an ``n``-rank job: ``distributedInfo`` says rank ``r`` of
``n`` and its process group holds ranks ``0..n-1``; the events are the real ones. Each rank's
directory holds its trace, a ``meta.json`` (host ``node<r // 8>``: eight GPUs per node) and an
empty ``steps.csv``; the run has a manifest, so the whole dpro analysis reads it like a recorded run.

    >>> make_run(Path("/tmp/run256"), 256)                 # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from isal import igzip

from dpro.run_format import create_manifest, new_manifest, rank_dir, write_json_atomic

SOURCE = Path(__file__).resolve().parents[1] / "tests" / "data" / "gpu" / "a100-2rank-ddp-rank0.json.gz"
GPUS_PER_NODE = 8
_RANK, _WORLD = 987_654_321, 987_654_322  # placeholders, replaced in the text per rank


def make_run(root: Path, n_ranks: int, source: Path = SOURCE) -> Path:
    """Write an ``n_ranks`` run of copies of ``source`` at ``root`` (kept if already complete)."""
    if (root / "ranks" / str(n_ranks - 1) / "trace.json.gz").is_file():
        return root
    trace = json.loads(igzip.decompress(source.read_bytes()))
    info = trace["distributedInfo"]
    info.update(rank=_RANK, world_size=_WORLD)
    for group in info.get("pg_config") or []:
        group.update(ranks=[_RANK, _WORLD], pg_size=_WORLD)
    text = json.dumps(trace)
    create_manifest(root, new_manifest(["synthetic", source.name, str(n_ranks)], {}, 0))
    everyone = json.dumps(list(range(n_ranks)))
    for r in range(n_ranks):
        own = rank_dir(root, r)
        own.mkdir(parents=True, exist_ok=True)
        body = text.replace(f"[{_RANK}, {_WORLD}]", everyone).replace(str(_RANK), str(r)).replace(str(_WORLD), str(n_ranks))
        (own / "trace.json.gz").write_bytes(igzip.compress(body.encode(), compresslevel=1))
        write_json_atomic(own / "meta.json", {"rank": r, "world_size": n_ranks, "host": f"node{r // GPUS_PER_NODE}"})
        (own / "steps.csv").write_text("step,start_ns,end_ns,phase\n")  # the trace's steps are all there is
    os.sync()
    return root
