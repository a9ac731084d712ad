"""Collective algorithms as the point-to-point transfers they are made of.

A collective over ``n`` ranks runs as a sequence of steps; in each step some ranks send a part of
the data to others. :func:`schedule` lists those transfers for the algorithms NCCL and gloo use:

========================  =====================================  ====================================
collective                algorithm                              steps (transfers per step)
========================  =====================================  ====================================
all_reduce                ``ring``: reduce-scatter + all-gather  2(n-1) (n, each 1/n of the data)
all_reduce                ``tree``: reduce up, broadcast down    2 * depth (one per tree edge, all)
all_gather                ``ring``                               n-1 (n, each 1/n of the output)
reduce_scatter            ``ring``                               n-1 (n, each 1/n of the input)
all_to_all                ``pairwise``: rank r sends to r+s      n-1 (n, each 1/n)
broadcast, reduce         ``tree``: binomial from/to the root    ceil(log2 n)
gather, scatter           ``tree``: binomial, halves per level   ceil(log2 n)
send, recv, send_recv     ``direct``                             1 (1, all)
========================  =====================================  ====================================

The algorithm of a collective comes from NCCL (its kernel's name, ``ncclKernel_AllReduce_RING_LL``,
or the tuning lines of its log, :func:`nccl_log_algorithms`), else the backend's default
(:func:`default_algorithm`).

    >>> [(t.step, t.src, t.dst) for t in schedule("all_reduce", 2, "ring")]
    [(0, 0, 1), (0, 1, 0), (1, 0, 1), (1, 1, 0)]
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

RING, TREE, PAIRWISE, DIRECT = "ring", "tree", "pairwise", "direct"
_TREE_ROOTED = {"broadcast", "reduce", "gather", "scatter"}
_P2P = {"send", "recv", "send_recv", "recv_any_source"}
# NCCL's algorithm numbers in its tuning log (src/include/device.h: NCCL_ALGO_TREE = 0, ...)
_NCCL_ALGORITHMS = {0: TREE, 1: RING, 2: "collnet_direct", 3: "collnet_chain", 4: "nvls", 5: "nvls_tree", 6: "pat"}
# NCCL >= 2.19: "NCCL INFO AllReduce: 4194304 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..1}";
# older: "NCCL INFO 4194304 Bytes -> Algo 1 proto 2 time 47.160000" (no collective: any matches)
_NCCL_TUNING = re.compile(r"NCCL INFO (?:(?P<coll>\w+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)")
_NCCL_KERNEL = re.compile(r"nccl(?:Dev)?Kernel_\w+?_(?P<algo>RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|NVLS|NVLS_TREE|PAT)_")


@dataclass(frozen=True)
class Transfer:
    """One send in a collective: at ``step``, group member ``src`` sends ``fraction`` of the
    collective's bytes to ``dst`` (positions in the group, not global ranks)."""

    step: int
    src: int
    dst: int
    fraction: float


def _canonical(coll: str) -> str:
    coll = coll.lstrip("_")
    for prefix in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        if coll.startswith(prefix):
            return prefix
    return coll


def default_algorithm(coll: str) -> str:
    """The algorithm gloo and NCCL use by default for ``coll`` (NCCL picks tree for small
    all-reduces across nodes; its logs or kernel names say so when it does)."""
    coll = _canonical(coll)
    if coll in _P2P:
        return DIRECT
    if coll in _TREE_ROOTED:
        return TREE
    if coll == "all_to_all":
        return PAIRWISE
    return RING


def schedule(coll: str, n: int, algorithm: str | None = None, root: int = 0) -> list[Transfer]:
    """The transfers of collective ``coll`` over ``n`` group members with ``algorithm``.

    Algorithms dpro cannot decompose (NCCL's collnet and NVLS, which run inside switches) and
    groups of one rank give no transfers; a barrier is treated as an all-reduce of no data.
    """
    coll = _canonical(coll)
    algorithm = (algorithm or default_algorithm(coll)).lower()
    if n < 2:
        return []
    if coll in _P2P:
        return [Transfer(0, 0, 1, 1.0)]
    if coll in ("all_reduce", "barrier"):
        if algorithm == TREE:
            up = _binomial(n, root, toward_root=True, halving=False)
            depth = max((t.step for t in up), default=-1) + 1
            return up + [Transfer(2 * depth - 1 - t.step, t.dst, t.src, t.fraction) for t in up]
        return _ring(n, 2 * (n - 1))
    if coll in ("all_gather", "reduce_scatter"):
        return _ring(n, n - 1)
    if coll == "all_to_all":
        return [Transfer(s - 1, r, (r + s) % n, 1.0 / n) for s in range(1, n) for r in range(n)]
    if coll in _TREE_ROOTED:
        return _binomial(n, root, toward_root=coll in ("reduce", "gather"), halving=coll in ("gather", "scatter"))
    return _ring(n, 2 * (n - 1))


def _ring(n: int, steps: int) -> list[Transfer]:
    return [Transfer(s, r, (r + 1) % n, 1.0 / n) for s in range(steps) for r in range(n)]


def _binomial(n: int, root: int, toward_root: bool, halving: bool) -> list[Transfer]:
    """A binomial tree rooted at ``root``: away from the root, in step ``s`` every member that
    has the data sends to the one ``2**s`` places further; toward the root, the same reversed."""
    levels = math.ceil(math.log2(n))
    out = []
    for s in range(levels):
        for i in range(2 ** s):
            j = i + 2 ** s
            if j < n:
                share = (min(2 ** s, n - j) / n) if halving else 1.0
                out.append(Transfer(s, (i + root) % n, (j + root) % n, share))
    if toward_root:
        out = [Transfer(levels - 1 - t.step, t.dst, t.src, t.fraction) for t in out]
    return sorted(out, key=lambda t: t.step)


def steps_of(transfers: list[Transfer]) -> int:
    """How many sequential steps a schedule has."""
    return max((t.step for t in transfers), default=-1) + 1


def kernel_algorithm(kernel_name: str) -> str | None:
    """The algorithm in an NCCL kernel's name (``ncclKernel_AllReduce_RING_LL_Sum_float`` → ring)."""
    m = _NCCL_KERNEL.search(kernel_name)
    return m["algo"].lower() if m else None


def nccl_log_algorithms(paths: list[Path]) -> dict[tuple[str, int], str]:
    """``(collective, bytes) -> algorithm`` from NCCL's tuning lines, which rank 0 writes with
    ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING`` (``dpro record`` sets both). Older NCCL names
    no collective in them: those are keyed ``("*", bytes)``."""
    from .kineto import _canonical_collective

    found: dict[tuple[str, int], str] = {}
    for path in paths:
        with open(path, errors="replace") as lines:
            for line in lines:
                m = _NCCL_TUNING.search(line)
                if m:
                    algo = m["algo"]
                    algo = _NCCL_ALGORITHMS.get(int(algo), algo) if algo.isdigit() else algo.lower()
                    coll = _canonical_collective(m["coll"]) if m["coll"] else "*"
                    found[(coll, int(m["bytes"]))] = algo
    return found
