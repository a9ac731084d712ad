"""Tensor fusion and partition: DDP's gradient bucket cap.

Fewer, larger buckets pay the all-reduce's fixed cost fewer times; smaller ones start
reducing earlier in the backward pass and overlap more of it. The caps proposed run from
well below the recorded one to one bucket for all gradients, on a ×2–2.5 ladder; the cost model
rebuilds DDP's buckets for each exactly as DDP would (:mod:`dpro.replayer.buckets`).
"""

from __future__ import annotations

from dpro.analysis.run import RunAnalysis

from dpro.optimizer.passes.base import Proposals

LADDER_MB = (0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000)


def tensor_fusion(analysis: RunAnalysis) -> Proposals:
    """Bucket caps from a quarter of a MB up to the first that holds every gradient, except the
    recorded cap."""
    layout = analysis.ddp_layout
    if not layout or "buckets" not in layout:
        return Proposals(why="the job used no DistributedDataParallel (or its buckets were not recorded)")
    recorded_mb = float(layout["bucket_cap_bytes"]) / 2 ** 20
    total_mb = sum(analysis.bucket_bytes()) / 2 ** 20
    caps = []
    for mb in LADDER_MB:
        if abs(mb - recorded_mb) > 1e-9 * mb:
            caps.append(mb)
        if mb >= total_mb:
            break
    return Proposals([{"bucket_cap_mb": mb} for mb in caps])
