"""One rank's ops in a typical step, as a timeline draws them: measured (the graph's offsets and
durations) or predicted (a replay's start and end times)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpro.graph.dataflow import DataflowGraph
from dpro.replayer.result import Replay

__all__ = ["measured_ops", "predicted_ops", "rank_ops"]


def rank_ops(nodes: pd.DataFrame, start_ns: np.ndarray, end_ns: np.ndarray, rank: int) -> pd.DataFrame:
    """``rank``'s ops (and its sends): ``lane``, ``kind``, ``name``, ``start_ms`` and ``dur_ms``
    from the earliest op of any rank."""
    mine = (nodes["rank"] == rank).to_numpy() & (end_ns > start_ns)
    origin = float(np.min(start_ns))
    return pd.DataFrame({"lane": nodes["resource"].astype(str).to_numpy()[mine],
                         "kind": nodes["kind"].astype(str).to_numpy()[mine],
                         "name": nodes["name"].astype(str).to_numpy()[mine],
                         "start_ms": (start_ns[mine] - origin) / 1e6, "dur_ms": (end_ns[mine] - start_ns[mine]) / 1e6})


def measured_ops(graph: DataflowGraph, rank: int) -> pd.DataFrame:
    """``rank``'s typical step as the profiled window measured it."""
    nodes = graph.nodes
    start = nodes["offset_ns"].to_numpy(np.float64)
    return rank_ops(nodes, start, start + nodes["dur_ns"].to_numpy(np.float64), rank)


def predicted_ops(graph: DataflowGraph, result: Replay, rank: int) -> pd.DataFrame:
    """``rank``'s typical step as the replay ``result`` of ``graph`` predicts it."""
    return rank_ops(graph.nodes, result.start_ns, result.end_ns, rank)
