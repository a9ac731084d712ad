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

    >>> s = schedule("all_reduce", 2, "ring")
    >>> s.steps, s.pairs()
    (2, [(0, 1), (1, 0), (0, 1), (1, 0)])
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpro.graph.vocabulary import P2P_FAMILIES, ROOTED_FAMILIES, canonical_collective, collective_family

RING, TREE, PAIRWISE, DIRECT = "ring", "tree", "pairwise", "direct"
# NCCL's algorithm numbers in its tuning log (src/include/device.h: NCCL_ALGO_TREE = 0, ...)
_NCCL_ALGORITHMS = {0: TREE, 1: RING, 2: "collnet_direct", 3: "collnet_chain", 4: "nvls", 5: "nvls_tree", 6: "pat"}
# NCCL >= 2.19: "NCCL INFO AllReduce: 4194304 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..1}";
# older: "NCCL INFO 4194304 Bytes -> Algo 1 proto 2 time 47.160000" (no collective: any matches)
_NCCL_TUNING = re.compile(r"NCCL INFO (?:(?P<coll>\w+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)")
_NCCL_KERNEL = re.compile(r"nccl(?:Dev)?Kernel_\w+?_(?P<algo>RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|NVLS|NVLS_TREE|PAT)_")


@dataclass(frozen=True)
class Schedule:
    """The sends of a collective, in order of step: at ``step[i]``, group member ``src[i]`` sends
    ``fraction[i]`` of the collective's bytes to ``dst[i]`` (positions in the group, not ranks)."""

    step: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    fraction: np.ndarray

    def __len__(self) -> int:
        return len(self.step)

    @property
    def steps(self) -> int:
        """How many sequential steps the schedule has."""
        return int(self.step.max()) + 1 if len(self.step) else 0

    def pairs(self) -> list[tuple[int, int]]:
        """``(src, dst)`` of every send, in order."""
        return list(zip(self.src.tolist(), self.dst.tolist()))


def default_algorithm(coll: str) -> str:
    """The algorithm gloo and NCCL use by default for ``coll`` (NCCL picks tree for small
    all-reduces across nodes; its logs or kernel names say so when it does)."""
    coll = collective_family(coll)
    if coll in P2P_FAMILIES:
        return DIRECT
    if coll in ROOTED_FAMILIES:
        return TREE
    if coll == "all_to_all":
        return PAIRWISE
    return RING


def schedule(coll: str, n: int, algorithm: str | None = None, root: int = 0) -> Schedule:
    """The sends of collective ``coll`` over ``n`` group members with ``algorithm``.

    Groups of one rank send nothing; a barrier is an all-reduce of no data; an all-reduce by an
    algorithm that runs inside the switches (NCCL's collnet, NVLS) is taken for a ring.
    """
    coll = collective_family(coll)
    algorithm = (algorithm or default_algorithm(coll)).lower()
    if n < 2:
        return _schedule([], [], [], [])
    if coll in P2P_FAMILIES:  # root: the sender
        return _schedule([0], [root], [1 - root], [1.0])
    if coll in ("all_reduce", "barrier"):
        if algorithm == TREE:
            up = _binomial(n, root, toward_root=True, halving=False)
            down_step = 2 * up.steps - 1 - up.step
            return _schedule(np.r_[up.step, down_step], np.r_[up.src, up.dst], np.r_[up.dst, up.src],
                             np.r_[up.fraction, up.fraction])
        return _ring(n, 2 * (n - 1))
    if coll in ("all_gather", "reduce_scatter"):
        return _ring(n, n - 1)
    if coll == "all_to_all":
        shift, member = np.divmod(np.arange((n - 1) * n), n)
        return _schedule(shift, member, (member + shift + 1) % n, np.full(len(shift), 1.0 / n))
    if coll in ROOTED_FAMILIES:
        return _binomial(n, root, toward_root=coll in ("reduce", "gather"), halving=coll in ("gather", "scatter"))
    return _ring(n, 2 * (n - 1))


def _schedule(step: Any, src: Any, dst: Any, fraction: Any) -> Schedule:
    """A schedule of these sends, put in order of step (stable)."""
    step = np.asarray(step, np.int64)
    order = np.argsort(step, kind="stable")
    return Schedule(step[order], np.asarray(src, np.int64)[order], np.asarray(dst, np.int64)[order],
                    np.asarray(fraction, np.float64)[order])


def _ring(n: int, steps: int) -> Schedule:
    step, member = np.divmod(np.arange(steps * n), n)
    return _schedule(step, member, (member + 1) % n, np.full(steps * n, 1.0 / n))


def _binomial(n: int, root: int, toward_root: bool, halving: bool) -> Schedule:
    """A binomial tree rooted at ``root``: away from the root, in step ``s`` every member that
    has the data sends to the one ``2**s`` places further; toward the root, the same reversed."""
    levels = math.ceil(math.log2(n))
    parts = []
    for s in range(levels):
        i = np.arange(2 ** s)
        i = i[i + 2 ** s < n]
        j = i + 2 ** s
        parts.append((np.full(len(i), s), (i + root) % n, (j + root) % n,
                      np.minimum(2 ** s, n - j) / n if halving else np.ones(len(i))))
    step, src, dst, share = (np.concatenate(column) for column in zip(*parts))
    if toward_root:
        step, src, dst = levels - 1 - step, dst, src
    return _schedule(step, src, dst, share)


def kernel_algorithm(kernel_name: str) -> str | None:
    """The algorithm in an NCCL kernel's name (``ncclKernel_AllReduce_RING_LL_Sum_float`` → ring)."""
    m = _NCCL_KERNEL.search(kernel_name)
    return m["algo"].lower() if m else None


def nccl_log_algorithms(paths: list[Path]) -> dict[tuple[str, int], str]:
    """``(collective, bytes) -> algorithm`` from NCCL's tuning lines, which rank 0 writes with
    ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING`` (``dpro record`` sets both). Older NCCL names
    no collective in them: those are keyed ``("*", bytes)``."""
    found: dict[tuple[str, int], str] = {}
    for path in paths:
        with open(path, errors="replace") as lines:
            for line in lines:
                m = _NCCL_TUNING.search(line)
                if m:
                    algo = m["algo"]
                    algo = _NCCL_ALGORITHMS.get(int(algo), algo) if algo.isdigit() else algo.lower()
                    coll = canonical_collective(m["coll"]) if m["coll"] else "*"
                    found[(coll, int(m["bytes"]))] = algo
    return found
