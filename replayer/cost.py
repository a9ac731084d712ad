"""The alpha-beta cost of a send, fitted per collective and link class from a recorded run.

A send of ``b`` bytes over a link takes ``alpha + b / beta``: ``alpha`` the per-message latency
(ns), ``beta`` the bandwidth (bytes/ns = GB/s). Each matched collective of the graph gives one
point per algorithm step (the bytes each member sends in that step, the step's measured time);
points are pooled per collective and link class (``intra`` within a host, ``inter`` across
hosts: a ring that crosses hosts is paced by its slowest link) and fitted by least squares.
With a single message size the latency cannot be told from the bandwidth, so ``alpha`` is 0.

    >>> model = fit_link_model(graph)                                    # doctest: +SKIP
    >>> model[("all_reduce", "inter")].time_ns(25 * 2**20)              # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpro.graph.dataflow import DataflowGraph


LINK_BOUND = 1.5
"""A send's time per byte within this many times the wire's is all the link's: what TCP loses
beyond the wire's rate on a link it nearly fills (a shaped link's drops and recovery, 0-24% over
300 Mb/s from 1 to 16 MiB) scales with the link. Beyond, the rest is the host's: gloo on an
unthrottled veth link ran at 7.1 Gbit/s beside its stream's 17.7 (2.5 times the wire's time)."""


@dataclass(frozen=True)
class AlphaBeta:
    """``alpha_ns + bytes / beta_bytes_per_ns``, fitted on ``points`` sends. ``wire_bytes_per_ns``:
    the link's own rate, where it was measured; of the time per byte, the wire takes at most
    ``1 / wire_bytes_per_ns`` and the host (copies, the backend's threads) the rest, unless the
    send nearly fills the link (:data:`LINK_BOUND`): then all of it is the link's."""

    alpha_ns: float
    beta_bytes_per_ns: float
    points: int
    wire_bytes_per_ns: float | None = None

    def time_ns(self, nbytes: float | np.ndarray, bandwidth_factor: float | np.ndarray = 1.0,
                messages: float | np.ndarray = 1.0) -> float | np.ndarray:
        """The time of a send of ``nbytes`` as ``messages`` messages (each pays the latency) on
        a link ``bandwidth_factor`` times as fast: only the wire's share of the time per byte
        scales (all of it where the link's rate is unknown or the send nearly fills it)."""
        per_byte = 1 / self.beta_bytes_per_ns
        wire = per_byte if self.wire_bytes_per_ns is None or per_byte <= LINK_BOUND / self.wire_bytes_per_ns \
            else 1 / self.wire_bytes_per_ns
        return messages * self.alpha_ns + nbytes * (per_byte - wire + wire / bandwidth_factor)


def link_class(graph: DataflowGraph, ranks: list[int]) -> str:
    """``intra`` when all ``ranks`` share a host, else ``inter``."""
    return "intra" if len({graph.hosts.get(r, "") for r in ranks}) == 1 else "inter"


def send_points(graph: DataflowGraph) -> pd.DataFrame:
    """One row per send of a sized collective: ``node``, ``coll``, ``link_class``, ``bytes``,
    ``dur_ns`` (its share of the measured transfer time)."""
    table = graph.collectives
    columns = ["node", "coll", "link_class", "bytes", "dur_ns"]
    if table.empty:
        return pd.DataFrame(columns=columns)
    sized = table[table["bytes"].notna() & (table["sends"].map(len) > 0)]
    if sized.empty:
        return pd.DataFrame(columns=columns)
    classes = [link_class(graph, ranks) for ranks in sized["ranks"]]
    points = sized.assign(link_class=classes)[["coll", "link_class", "sends"]].explode("sends")
    nodes = points["sends"].to_numpy(np.int64)
    return pd.DataFrame({"node": nodes, "coll": points["coll"].to_numpy(), "link_class": points["link_class"].to_numpy(),
                         "bytes": graph.nodes["bytes"].to_numpy(np.float64)[nodes],
                         "dur_ns": graph.nodes["dur_ns"].to_numpy(np.float64)[nodes]})


def fit_link_model(graph: DataflowGraph) -> dict[tuple[str, str], AlphaBeta]:
    """Alpha-beta per (collective, link class) from the graph's sized collectives."""
    model = {}
    for (coll, cls), pts in send_points(graph).groupby(["coll", "link_class"]):
        model[(coll, cls)] = fit_alpha_beta(pts["bytes"].to_numpy(), pts["dur_ns"].to_numpy())
    return model


def fit_alpha_beta(nbytes: np.ndarray, dur_ns: np.ndarray) -> AlphaBeta:
    """Least squares ``dur = alpha + bytes / beta`` with ``alpha >= 0`` and ``beta > 0``."""
    nbytes, dur_ns = np.asarray(nbytes, np.float64), np.asarray(dur_ns, np.float64)
    if len(np.unique(nbytes)) >= 2:
        slope, alpha = np.polyfit(nbytes, dur_ns, 1)
        if slope > 0 and alpha >= 0:
            return AlphaBeta(float(alpha), float(1 / slope), len(nbytes))
    # one size, or a fit that needs a negative latency: bandwidth only, through the origin
    slope = float(np.sum(nbytes * dur_ns) / np.sum(nbytes * nbytes))
    return AlphaBeta(0.0, 1 / slope if slope > 0 else np.inf, len(nbytes))
