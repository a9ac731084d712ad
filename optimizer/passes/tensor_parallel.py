"""Tensor parallel's degree: the ``(dp, tp)`` mesh shapes of the same ranks.

Fewer tensor-parallel ranks a layer (a larger ``dp``) trade the activations' all-reduces inside
every block for larger gradient all-reduces after the backward pass and more of each layer's
compute and memory on each rank; more trade back. The pass proposes every other shape the
what-if models from the recording (:func:`dpro.analysis.tensor_parallel.tp_mesh`: from a job
with tensor parallel, and with data parallel unless the shape has none); the search weighs the
predicted step against the memory each needs (:mod:`dpro.optimizer.memory_estimate`).
"""

from __future__ import annotations

from dpro.analysis.run import RunAnalysis
from dpro.analysis.tensor_parallel import layout
from dpro.replayer.graph_edits import WhatIfError

from dpro.optimizer.passes.base import Proposals

__all__ = ["tp_mesh"]


def tp_mesh(analysis: RunAnalysis) -> Proposals:
    """Every other ``(dp, tp)`` shape of the ranks the what-if models from this recording."""
    try:
        was = layout(analysis)
    except WhatIfError as e:
        return Proposals(why=str(e))
    if was.tp < 2:
        return Proposals(why=f"the job was recorded without tensor parallel ({was.dp}x{was.tp})")
    world = was.dp * was.tp
    shapes = [(world // t, t) for t in range(1, world + 1) if world % t == 0 and t != was.tp
              and (was.dp > 1 or world // t == 1)]
    if not shapes:
        return Proposals(why=f"no other shape is modelled from a job recorded without data parallel ({was.dp}x{was.tp})")
    return Proposals([{"tp_mesh": f"{d}x{t}"} for d, t in shapes])
