"""Tensor fusion and partition: DDP's gradient bucket cap and its first bucket's.

Fewer, larger buckets pay the all-reduce's fixed cost fewer times; smaller ones start
reducing earlier in the backward pass and overlap more of it. The caps proposed run from
well below the recorded one to one bucket for all gradients, on a ×2–2.5 ladder; the cost model
rebuilds DDP's buckets for each exactly as DDP would (:mod:`dpro.replayer.buckets`).

The first bucket holds the gradients ready first (the model's last layers); a small one starts
the first all-reduce early in the backward pass without making every bucket small. DDP caps it
at 1 MiB by default but at the cap itself once the script gives ``bucket_cap_mb`` (torch 2.13),
so a job that raised its cap lost its early start; :func:`first_bucket` proposes first caps
below the job's cap.
"""

from __future__ import annotations

from dpro.analysis.run import RunAnalysis

from dpro.optimizer.passes.base import Proposals

LADDER_MB = (0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000)
FIRST_LADDER_MB = (0.25, 1, 5)
NO_BUCKETS = "the job used no DistributedDataParallel (or its buckets were not recorded)"


def tensor_fusion(analysis: RunAnalysis) -> Proposals:
    """Bucket caps from a quarter of a MB up to the first that holds every gradient, except the
    recorded cap."""
    layout = analysis.ddp_layout
    if not layout or not layout.buckets:
        return Proposals(why=NO_BUCKETS)
    recorded_mb = layout.bucket_cap_mb
    total_mb = sum(analysis.bucket_bytes()) / 2 ** 20
    caps = []
    for mb in LADDER_MB:
        if abs(mb - recorded_mb) > 1e-9 * mb:
            caps.append(mb)
        if mb >= total_mb:
            break
    return Proposals([{"bucket_cap_mb": mb} for mb in caps])


def first_bucket(analysis: RunAnalysis) -> Proposals:
    """First-bucket caps below the job's bucket cap and below its gradients' total, except the
    recorded first cap."""
    layout = analysis.ddp_layout
    if not layout or not layout.buckets:
        return Proposals(why=NO_BUCKETS)
    cap_mb, first_mb = layout.bucket_cap_mb, layout.first_bucket_mb
    total_mb = sum(analysis.bucket_bytes()) / 2 ** 20
    firsts = [mb for mb in FIRST_LADDER_MB if mb < min(cap_mb, total_mb) and abs(mb - first_mb) > 1e-9 * mb]
    if not firsts:
        return Proposals(why=f"no first cap below the bucket cap ({cap_mb:.3g} MB) and the gradients' "
                             f"{total_mb:.3g} MB other than the recorded {first_mb:.3g} MB")
    return Proposals([{"first_bucket_mb": mb} for mb in firsts])
