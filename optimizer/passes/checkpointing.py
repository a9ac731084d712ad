"""Activation checkpointing: each block of the model's longest list of blocks (found in the
parameters' names: ``blocks.0.``, ``blocks.1.``, ...; on an FSDP2 job, in its units' module
names: ``blocks.0``, ``blocks.1``, ...) runs under ``checkpoint``, and the
backward pass recomputes their forward (:func:`dpro.analysis.whatif.predict`,
``recompute_forward``). It costs time and saves memory (:mod:`dpro.optimizer.memory_estimate`): it wins
only under a memory budget. A change to the model's code: ``--apply`` cannot make it.
"""

from __future__ import annotations

import re
from typing import Any

from dpro.analysis.run import RunAnalysis
from dpro.run_records import DdpLayout

from dpro.optimizer.passes.base import Proposals

__all__ = ["block_lists", "checkpointing", "job_block_lists", "unit_block_lists"]

INDEXED = re.compile(r"(?:^|\.)\d+(?:\.|$)")  # a name inside a list's block: its list is not outermost


def checkpointing(analysis: RunAnalysis) -> Proposals:
    """Checkpointing of the longest list of at least two blocks."""
    layout = analysis.ddp_layout
    lists = job_block_lists(layout, [] if layout and layout.buckets else analysis.parallelism.fsdp)
    if lists is None:
        return Proposals(why="the job used no DistributedDataParallel or FSDP2 (its parameters' names were not "
                             "recorded)")
    longest = max(lists, key=lambda name: lists[name], default=None)  # the most blocks, then the most parameters
    if longest is None or lists[longest][0] < 2:
        return Proposals(why="the model has no list of two blocks or more to checkpoint")
    return Proposals([{"activation_checkpointing": longest}])


def block_lists(layout: DdpLayout) -> dict[str, tuple[int, int]]:
    """The outermost lists of blocks in the DDP module's parameter names (lists inside a block of
    another are left out; a model that is itself a list is not found), each with its number of
    blocks (its highest index + 1) and of parameters:
    ``{"blocks": (12, 85_000_000)}`` for ``blocks.0.attn.weight`` ... ``blocks.11.mlp.bias``."""
    indices: dict[str, set[int]] = {}
    numel: dict[str, int] = {}
    for bucket in layout.buckets:
        for param in bucket.params:
            name = param.name
            match = re.search(r"\.(\d+)\.", name)
            if match and not INDEXED.search(name[:match.start()]):
                prefix = name[:match.start()]
                indices.setdefault(prefix, set()).add(int(match.group(1)))
                numel[prefix] = numel.get(prefix, 0) + param.numel
    # blocks without parameters of their own (an activation between two layers) count too
    return {prefix: (max(found) + 1, numel[prefix]) for prefix, found in indices.items()}


def job_block_lists(layout: DdpLayout | None, units: list[dict[str, Any]]) -> dict[str, tuple[int, int]] | None:
    """The job's lists of blocks: from its DDP layout (:func:`block_lists`), else from its FSDP2
    units (:func:`unit_block_lists`); None where it recorded neither."""
    if layout and layout.buckets:
        return block_lists(layout)
    return unit_block_lists(units) if units else None


def unit_block_lists(units: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """The lists of blocks FSDP2's units were made of (``blocks.3``, or ``blocks.2, blocks.3``
    for a unit of two), each with its number of blocks (its highest index + 1) and its units'
    unsharded bytes."""
    indices: dict[str, set[int]] = {}
    size: dict[str, int] = {}
    for unit in units:
        names = [n for n in str(unit.get("module") or "").split(", ") if n]
        for name in names:
            match = re.fullmatch(r"(.+?)\.(\d+)", name)
            if match and not INDEXED.search(match.group(1)):
                indices.setdefault(match.group(1), set()).add(int(match.group(2)))
                size[match.group(1)] = size.get(match.group(1), 0) + int(unit.get("unsharded_bytes") or 0) // len(names)
    return {prefix: (max(found) + 1, size[prefix]) for prefix, found in indices.items()}
