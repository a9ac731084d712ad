"""Gradient compression: DDP's fp16 and bf16 hooks and PowerSGD.

Each sends fewer bytes per gradient byte and adds its own compute (the casts; PowerSGD's matrix
products), both timed in the run's calibration. All change the numerics (lossy).
"""

from __future__ import annotations

from dpro.analysis.run import RunAnalysis
from dpro.comm_hooks import CAST_HOOKS, NCCL_ONLY, POWERSGD, POWERSGD_MATMUL

from dpro.optimizer.passes.base import Proposals

POWERSGD_RANKS = (1, 2, 4)
GLOO_POWERSGD = ("DDP's PowerSGD hook on gloo with more than one bucket fails the job: the hook issues its "
                 "all-reduces from gloo's callbacks, in an order the ranks do not share (collective size mismatch "
                 "or a hang, torch 2.13)")


def fails_the_job(analysis: RunAnalysis, settings: dict, buckets: int) -> str | None:
    """Why ``settings`` would make the recorded job fail with ``buckets`` buckets, or None:
    :data:`GLOO_POWERSGD`."""
    backend = analysis.metas[min(analysis.ranks)].backend
    if settings.get("comm_hook") == POWERSGD and backend == "gloo" and buckets > 1:
        return GLOO_POWERSGD
    return None


def compression(analysis: RunAnalysis) -> Proposals:
    """fp16, bf16 (on NCCL only) and PowerSGD of ranks :data:`POWERSGD_RANKS`, those the
    calibration timed the compute of; none when the job already compresses."""
    layout = analysis.ddp_layout
    if not layout:
        return Proposals(why="the job used no DistributedDataParallel")
    if layout.comm_hook:
        return Proposals(why=f"the job already runs the communication hook {layout.comm_hook}")
    timed = {part for c in analysis.calibrations.values() for part in c.compression}
    backend = analysis.metas[min(analysis.ranks)].backend
    hooks = [h for h in CAST_HOOKS if backend == "nccl" or h not in NCCL_ONLY]
    proposals = [{"comm_hook": hook} for hook in hooks if hook in timed]
    if POWERSGD_MATMUL in timed:
        proposals += [{"comm_hook": POWERSGD, "powersgd_rank": r} for r in POWERSGD_RANKS]
    if not proposals:
        return Proposals(why="the run's calibration did not time the hooks' compute (recorded with --no-calibrate)")
    return Proposals(proposals)
