"""What operator fusion (``torch.compile``) would leave of a rank's forward and backward passes.

TorchInductor keeps the heavy ops (matrix products, convolutions, attention) as library calls
and fuses the rest (pointwise ops, reductions, norms, views) into loops that read their inputs
once. It runs the captured graph without the Python interpreter between ops, and the backward
pass as a few compiled functions. The model here:

- a pass's ops are taken in time order: a **heavy** op (:data:`HEAVY_OPS`, or a custom op of
  a namespace not torch's own, with the ops nested in it) keeps its time; every other op contributes its own time (outside the ops nested in
  it) beyond an op's fixed cost (what an op that does no work takes on the rank, the median of
  its view ops) as its **work**;
- the ops between two heavy ones (within one step and thread) are a **chain**, fused into one
  kernel: it takes one op's fixed cost plus its largest op's work (each op of a chain is a
  pass over tensors of about the same size; fused, the chain makes one);
- everything else of the pass (the interpreter between ops, each op's dispatch) is gone.

On the CPU the ops come from the rank's trace (the graph holds top-level ops only). On a GPU
the kernels are the ops, with no fixed cost of their own (the launches are the CPU's): each run
of fusable kernels on one stream, in the forward or in the backward pass, shrinks to its
longest kernel (:func:`fused_kernel_durations`). autograd's ``AccumulateGrad`` (DDP's hooks run
in it), its kernels, and the time autograd's engine spends between backward ops stay as
recorded: the gain errs low there.
Compilation time, graph breaks and the CUDA graphs of ``mode="reduce-overhead"`` are not
modelled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from dpro.run_format import BACKWARD_EVENT_PREFIX

from dpro.analysis.cpu_ops import (ACCUMULATE_GRAD_EVENT, cpu_ops, forward_marks, once_per_rank, parents, self_ns,
                                   top_level, view_op_ns)
from dpro.analysis.run import RunAnalysis

__all__ = ["COMPILED_MARKS", "HEAVY_KERNELS", "HEAVY_OPS", "FusedShares", "compiled_events", "fused_kernel_durations",
           "fused_shares", "fused_time", "heavy_kernel", "heavy_op"]

HEAVY_OPS = re.compile(r"^aten::(_?mm|addmm|bmm|baddbmm|addbmm|\w*conv\w*|mkldnn_\w+|"
                       r"_scaled_dot_product\w*|_flash_attention\w*|_efficient_attention\w*|"
                       r"embedding_dense_backward|_embedding_bag\w*|lstm\w*|gru\w*|_thnn_fused\w*)$")
"""CPU ops TorchInductor leaves to a library (matrix products, convolutions, attention, ...)."""
TORCH_NAMESPACES = frozenset({"aten", "prim", "prims", "autograd", "torch", "profiler"})
"""Namespaces of torch's own ops; an op of any other (a custom op) is opaque to the compiler."""
COMPILED_MARKS = ("Torch-Compiled Region", "CompiledFunction", "CompiledFunctionBackward")
"""Events a compiled module leaves in a trace (dynamo's region, AOTAutograd's functions)."""
HEAVY_KERNELS = re.compile(r"gemm|gemv|conv|cutlass|cublas|cudnn|flash|fmha|attention|xmma|wgrad|dgrad|"
                           r"^sm\d+_|ampere|hopper|volta|turing|memcpy|memset|nccl", re.IGNORECASE)
"""Kernels fusion leaves alone: the libraries' (and copies, memsets, collectives)."""


def compiled_events(analysis: RunAnalysis, rank: int) -> str | None:
    """The first of :data:`COMPILED_MARKS` in ``rank``'s trace (the job runs compiled), or None."""
    names = analysis.tables(rank).events["name"].astype(str)
    for mark in COMPILED_MARKS:
        if names.str.startswith(mark).any():
            return mark
    return None


def heavy_op(name: str) -> bool:
    """Whether a CPU op (with the ops nested in it) stays as it is under ``torch.compile``: a
    library call (:data:`HEAVY_OPS`), or an op of a namespace not torch's own (a custom op,
    ``mylib::attention``, or a collective, ``c10d::allreduce_``: opaque to the compiler)."""
    namespace = name.split("::", 1)[0] if "::" in name else None
    return bool(HEAVY_OPS.match(name)) or (namespace is not None and namespace not in TORCH_NAMESPACES)


def heavy_kernel(name: str) -> bool:
    """Whether a GPU kernel stays as it is under ``torch.compile``."""
    return bool(HEAVY_KERNELS.search(name))


@dataclass(frozen=True)
class FusedShares:
    """Of one rank's CPU passes, what fusion leaves: ``forward`` and ``backward`` as shares of
    their recorded time (the backward's without ``AccumulateGrad``); of that, the share of the
    calls' fixed cost (what does not shrink with the batch: gradient accumulation's fixed part
    once fused); and the ops and chains seen."""

    forward: float
    backward: float
    forward_fixed: float  # of the fused forward, the share its calls' fixed cost takes
    backward_fixed: float
    ops: int
    chains: int


@once_per_rank
def fused_shares(analysis: RunAnalysis, rank: int) -> FusedShares:
    """:class:`FusedShares` of ``rank``'s CPU ops over its profiled steps (measured once per run
    and rank)."""
    cpu = cpu_ops(analysis, rank)
    profiled = (cpu["step"] >= 0).to_numpy()
    top, owner = top_level(cpu)
    parent = parents(cpu)
    own = self_ns(cpu, parent)
    names = cpu["name"].astype(str).to_numpy()
    tid, start, end, dur = (cpu[c].to_numpy() for c in ("tid", "start_ns", "end_ns", "dur_ns"))
    heavy = np.fromiter((heavy_op(n) for n in names), bool, len(names))
    under_heavy = np.zeros(len(cpu), bool)  # parents come before the ops nested in them
    for i in np.flatnonzero(parent >= 0):
        under_heavy[i] = heavy[parent[i]] or under_heavy[parent[i]]
    per_op = view_op_ns(cpu)
    backward_top = top & profiled & np.char.startswith(names.astype(str), BACKWARD_EVENT_PREFIX) & \
        (names != ACCUMULATE_GRAD_EVENT)
    units = profiled & ~under_heavy
    in_backward = backward_top[owner] & units
    in_forward = np.zeros(len(cpu), bool)
    forward_ns = 0.0
    for s0, d0, t, step in forward_marks(analysis, rank).itertuples(index=False):
        if step >= 0:
            in_forward |= (tid == t) & (start >= s0) & (end <= s0 + d0)
            forward_ns += d0
    group = cpu["step"].to_numpy() * (int(tid.max()) + 1 if len(tid) else 1) + tid  # a chain ends with its step and thread
    forward = in_forward & units
    fused_f, chains_f, calls_f = fused_time(heavy[forward], dur[forward], own[forward], per_op, group[forward])
    fused_b, chains_b, calls_b = fused_time(heavy[in_backward], dur[in_backward], own[in_backward], per_op,
                                            group[in_backward])
    backward_ns = float(dur[backward_top].sum())
    return FusedShares(forward=min(fused_f / forward_ns, 1.0) if forward_ns > 0 else 1.0,
                       backward=min(fused_b / backward_ns, 1.0) if backward_ns > 0 else 1.0,
                       forward_fixed=min(calls_f * per_op / fused_f, 1.0) if fused_f > 0 else 0.0,
                       backward_fixed=min(calls_b * per_op / fused_b, 1.0) if fused_b > 0 else 0.0,
                       ops=int(forward.sum() + in_backward.sum()), chains=chains_f + chains_b)


def fused_time(heavy: np.ndarray, dur: np.ndarray, own: np.ndarray, per_op: float,
               group: np.ndarray) -> tuple[float, int, int]:
    """The fused time of ops in time order (``heavy``: library calls; the others outside any,
    ``own`` their time outside the ops nested in them; a chain never spans two ``group`` values):
    heavy ops as recorded, each chain of the others one op's fixed cost ``per_op`` plus its
    largest own time beyond it. Also the chains, and the calls left (heavy ops and chains)."""
    total, chains, largest, open_chain, previous = 0.0, 0, 0.0, False, None
    for is_heavy, d, o, g in zip(heavy, dur, own, group):
        if open_chain and (is_heavy or g != previous):
            total, chains, largest, open_chain = total + per_op + largest, chains + 1, 0.0, False
        if is_heavy:
            total += d
        else:
            largest, open_chain = max(largest, o - per_op), True
        previous = g
    if open_chain:
        total, chains = total + per_op + largest, chains + 1
    return float(total), chains, chains + int(np.count_nonzero(heavy))


def fused_kernel_durations(names: np.ndarray, streams: np.ndarray, start: np.ndarray, dur: np.ndarray,
                           members: np.ndarray) -> np.ndarray:
    """The kernels' durations once fused: each run of fusable kernels among ``members``, in start
    order on one stream, shrinks to its longest kernel's time, every kernel of it scaled alike; a
    heavy kernel or any other node on the stream ends a run. Other nodes as given."""
    fused = dur.astype(np.float64).copy()
    queues = np.unique(streams[members])
    order = np.flatnonzero(np.isin(streams, queues))
    order = order[np.lexsort((start[order], streams[order]))]
    chain: list[int] = []

    def close() -> None:
        if len(chain) > 1 and fused[chain].sum() > 0:
            fused[chain] *= fused[chain].max() / fused[chain].sum()
        chain.clear()

    previous_stream = None
    for v in order:
        fusable = bool(members[v]) and not heavy_kernel(str(names[v]))
        if streams[v] != previous_stream or not fusable:
            close()
            previous_stream = streams[v]
        if fusable:
            chain.append(int(v))
    close()
    return fused
