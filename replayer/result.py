"""The result of a replay (kept apart from the simulation, so that reading a stored replay
needs no compiled kernels)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Replay"]


@dataclass
class Replay:
    """The predicted timeline of the last unrolled step.

    ``start_ns``, ``end_ns``: per node of the graph. ``step_ns``: predicted step time per rank.
    ``critical_path``: the nodes, first to last, whose edges bound one another's start up to the
    node that ends last. ``cause_edge``: per node, the row of ``graph.edges`` whose edge bound its
    start (of equally binding edges, the first row); -1 if nothing did (it started at its offset)
    or if it was bound by the previous step (a thread or stream going on from one step to the next).
    """

    start_ns: np.ndarray
    end_ns: np.ndarray
    step_ns: dict[int, float]
    critical_path: list[int]
    cause_edge: np.ndarray
