"""A synthetic data-parallel training job as a :class:`~dpro.graph.dataflow.DataflowGraph`.

Every rank runs the same step, shaped like a recorded DDP trace: on one CPU thread, each layer's
forward ops, then its backward ops in reverse layer order, then the optimizer; each op launches
one kernel on one GPU stream. Gradients go into buckets (fp32, filled in reverse layer order as
DDP does, cut at exactly the cap: ``ceil(4 P / cap)`` buckets, where DDP would keep each tensor
whole); a bucket is all-reduced once its last gradient is ready, one bucket after another on
the rank's communication thread, and the optimizer waits for every bucket. A bucket's
all-reduce is one node shared by the ranks, as :func:`dpro.graph.dataflow.build_graph` makes it:
each rank's arrival (duration 0) feeds it by an ``arrive`` edge and it feeds the optimizer by a
``wait`` edge. Its duration is the ring all-reduce's alpha-beta model.

    >>> graph = data_parallel_graph(DataParallelJob(ranks=1024, params=100_000_000))  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpro.graph.dataflow import DataflowGraph

from dpro.replayer.kernels import longest_path

GRAD_BYTES = 4  # fp32
RESOURCES = ("cpu/main", "gpu/7", "cpu/comm")
EDGE_KINDS = ("order", "launch", "enqueue", "arrive", "wait")


@dataclass(frozen=True)
class DataParallelJob:
    """The job: ``params`` parameters in ``layers`` equal layers, trained on ``ranks`` ranks."""

    ranks: int = 8
    params: int = 100_000_000
    layers: int = 24
    kernels_per_layer: int = 4  # in the forward pass; the backward pass launches twice as many
    tokens: int = 4096  # per rank and step: forward FLOPs are 2 * params * tokens
    gpu_flops: float = 100e12  # sustained by the kernels
    gpu_bytes_per_s: float = 1.5e12  # memory bandwidth, which bounds the optimizer
    optimizer_bytes_per_param: int = 28  # Adam in fp32: reads p, g, m, v and writes p, m, v
    cpu_op_ns: float = 20_000.0  # each op on the CPU thread
    launch_lag_ns: float = -5_000.0  # a launch returns this long before its op ends
    cpu_gap_ns: float = 2_000.0  # idle time between two ops on the CPU thread
    bucket_bytes: int = 25 * 2**20  # DDP's bucket_cap_mb=25
    alpha_s: float = 5e-6  # latency of one ring step
    beta_bytes_per_s: float = 12.5e9  # per-link bandwidth: 100 Gb/s


def bucket_sizes(params: int, bucket_bytes: int) -> np.ndarray:
    """Bytes of each gradient bucket, in the order they are reduced (the last may be smaller)."""
    total = params * GRAD_BYTES
    edges = np.minimum(np.arange(1, -(-total // bucket_bytes) + 1, dtype=np.int64) * bucket_bytes, total)
    return np.diff(edges, prepend=0)


def ring_all_reduce_ns(nbytes: np.ndarray, ranks: int, alpha_s: float, beta_bytes_per_s: float) -> np.ndarray:
    """Ring all-reduce time: ``2 (N - 1) (alpha + (B / N) / beta)``, in ns."""
    return 2 * (ranks - 1) * (alpha_s + np.asarray(nbytes, np.float64) / ranks / beta_bytes_per_s) * 1e9


@dataclass
class _Template:
    """One rank's nodes (local ids ``0..k-1``) and the shared collectives (ids ``k..``), and the
    rank's edges over those ids."""

    names: list[str]
    resource: np.ndarray  # index into RESOURCES
    dur: np.ndarray
    collectives: np.ndarray  # durations of the shared nodes
    src: np.ndarray
    dst: np.ndarray
    lag: np.ndarray
    kind: np.ndarray  # index into EDGE_KINDS


def _template(job: DataParallelJob) -> _Template:
    """One rank's step; see the module docstring."""
    L, K = job.layers, job.kernels_per_layer
    sizes = bucket_sizes(job.params, job.bucket_bytes)
    n_cpu, n_buckets = 3 * L * K + 1, len(sizes)
    gpu, arrival, shared = n_cpu, 2 * n_cpu, 2 * n_cpu + n_buckets
    layer_order = np.r_[np.repeat(np.arange(L), K), np.repeat(np.arange(L)[::-1], 2 * K)]
    passes = ["forward"] * (L * K) + ["backward"] * (2 * L * K)
    ops = [f"layer{l}.{p}" for l, p in zip(layer_order, passes)] + ["optimizer.step"]
    names = ops + [f"{op}:kernel" for op in ops] + ["nccl:all_reduce"] * n_buckets
    kernel_ns = 2 * job.params / L * job.tokens / job.gpu_flops / K * 1e9  # backward: 2x FLOPs, 2x kernels
    optimizer_ns = job.params * job.optimizer_bytes_per_param / job.gpu_bytes_per_s * 1e9
    dur = np.r_[np.full(n_cpu, job.cpu_op_ns), np.full(n_cpu - 1, kernel_ns), optimizer_ns, np.zeros(n_buckets)]
    # The bucket's last byte (gradients in reverse layer order) is in layer ``ready``, whose
    # gradients are ready when its last backward kernel ends.
    last_byte = np.cumsum(sizes) - 1
    ready = L - 1 - last_byte * L // (job.params * GRAD_BYTES)
    last_backward = L * K + (L - 1 - ready) * 2 * K + 2 * K - 1
    cpu, b = np.arange(n_cpu), np.arange(n_buckets)
    optimizer = np.full(n_buckets, n_cpu - 1)
    parts = [  # (src, dst, lag, kind)
        (cpu[:-1], cpu[1:], job.cpu_gap_ns, "order"),
        (gpu + cpu[:-1], gpu + cpu[1:], 0.0, "order"),
        (cpu, gpu + cpu, job.launch_lag_ns, "launch"),
        (gpu + last_backward, arrival + b, 0.0, "enqueue"),
        (arrival + b, shared + b, 0.0, "arrive"),
        (shared + b[:-1], arrival + b[1:], 0.0, "order"),
        (shared + b, optimizer, 0.0, "wait"),
    ]
    return _Template(
        names=names,
        resource=np.r_[np.zeros(n_cpu, np.int64), np.ones(n_cpu, np.int64), np.full(n_buckets, 2)],
        dur=dur,
        collectives=ring_all_reduce_ns(sizes, job.ranks, job.alpha_s, job.beta_bytes_per_s),
        src=np.concatenate([p[0] for p in parts]).astype(np.int64),
        dst=np.concatenate([p[1] for p in parts]).astype(np.int64),
        lag=np.concatenate([np.broadcast_to(np.float64(p[2]), p[0].shape) for p in parts]),
        kind=np.concatenate([np.full(len(p[0]), EDGE_KINDS.index(p[3])) for p in parts]),
    )


def data_parallel_graph(job: DataParallelJob) -> DataflowGraph:
    """The dataflow graph of ``job``'s step; its offsets are the step's own schedule (replayed once).

    Rank ``r``'s nodes are ``r * k .. r * k + k - 1`` and the collectives come last; rank ``r``'s
    edges are ``r * m .. r * m + m - 1``. Text columns are categorical (a million rows build fast).
    """
    t = _template(job)
    n, k, c = job.ranks, len(t.dur), len(t.collectives)
    has_input = np.bincount(t.dst, minlength=k + c) > 0  # one rank and the collectives, from 0
    start, end, _ = longest_path(np.where(has_input, -np.inf, 0.0), np.r_[t.dur, t.collectives], t.src, t.dst, t.lag)
    period = float(end.max()) + job.cpu_gap_ns
    rank_base = np.arange(n, dtype=np.int64)[:, None] * k
    to_global = n * k - k  # template id ``k + i`` is collective ``i``: global id ``n * k + i``
    src = np.where(t.src >= k, t.src + to_global, t.src + rank_base).ravel()
    dst = np.where(t.dst >= k, t.dst + to_global, t.dst + rank_base).ravel()
    resource = (np.arange(n)[:, None] * len(RESOURCES) + t.resource).ravel()
    names, name_codes = np.unique(np.asarray(t.names + [f"all_reduce#{b}" for b in range(c)]), return_inverse=True)
    nodes = pd.DataFrame({
        "rank": np.r_[np.repeat(np.arange(n), k), np.full(c, -1)],
        "kind": pd.Categorical.from_codes(np.r_[np.tile((t.resource == 1).astype(np.int64), n), np.full(c, 2)],
                                          ["cpu", "gpu", "collective"]),
        "resource": pd.Categorical.from_codes(
            np.r_[resource, np.full(c, n * len(RESOURCES))],
            [f"r{r}/{name}" for r in range(n) for name in RESOURCES] + ["coll"]),
        "name": pd.Categorical.from_codes(np.r_[np.tile(name_codes[:k], n), name_codes[k:]], names),
        "dur_ns": np.r_[np.tile(t.dur, n), t.collectives],
        "offset_ns": np.r_[np.tile(start[:k], n), start[k:]],
        "coll": pd.Categorical.from_codes(np.r_[np.tile(np.where(t.resource == 2, 0, -1), n), np.zeros(c, np.int64)],
                                          ["all_reduce"]),
    })
    edges = pd.DataFrame({"src": src, "dst": dst, "lag_ns": np.tile(t.lag, n),
                          "kind": pd.Categorical.from_codes(np.tile(t.kind, n), EDGE_KINDS)})
    # Between steps each queue waits until the next step's schedule reaches its first op: the
    # job's steps follow one another every ``period``.
    queues = np.arange(len(RESOURCES))
    head = np.array([np.flatnonzero(t.resource == q)[np.argmin(start[:k][t.resource == q])] for q in queues])
    tail = np.array([np.flatnonzero(t.resource == q)[np.argmax(end[:k][t.resource == q])] for q in queues])
    gap = start[head] + period - end[tail]
    wraps = pd.DataFrame({"src": (tail + rank_base).ravel(), "dst": (head + rank_base).ravel(), "lag_ns": np.tile(gap, n)})
    return DataflowGraph(nodes, edges, step_ns=dict.fromkeys(range(n), period),
                         start_ns=dict.fromkeys(range(n), 0.0), steps=[], wraps=wraps)
