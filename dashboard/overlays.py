"""What the timeline draws over the ops: collectives linked across ranks, and the critical path.

Both are computed once per run and kept as rows of :class:`~dpro.dashboard.timeline_data.Lanes`:

- :func:`collective_links`: each matched collective instance
  (:attr:`dpro.analysis.RunAnalysis.collectives`) is the op of its rank that starts when the
  instance does; the instances of one collective call (process group, name, occurrence, step)
  are linked across ranks.
- :func:`critical_ops`: the critical path of the replay of the typical step
  (:attr:`dpro.replayer.result.Replay.critical_path`) shown on every profiled step. A graph node
  is the k-th op of its name on its thread or stream in the typical step, so it stands for the
  k-th such op of each step; a rank's end of a collective stands for its matched instance.
  Sends have no op of their own and are not drawn.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpro.analysis.run import RunAnalysis

from dpro.dashboard.timeline_data import COLLECTIVE, KINDS, Lanes

__all__ = ["collective_links", "critical_ops", "occurrences"]

_GPU_OPS = [KINDS.index("kernel"), KINDS.index("memory"), COLLECTIVE]
_NONE = pd.DataFrame({"op": pd.Series(dtype="int64"), "position": pd.Series(dtype="int64")})


def occurrences(lanes: Lanes) -> np.ndarray:
    """Per op, how many ops of its name came before it on its lane in its step."""
    frame = pd.DataFrame({"lane": lanes.lane, "step": lanes.step, "name": lanes.name})
    return frame.groupby(["lane", "step", "name"], sort=False).cumcount().to_numpy(np.int64)


def collective_links(analysis: RunAnalysis, lanes: Lanes) -> pd.DataFrame:
    """Each matched collective instance with its op: ``call`` (one id per collective call, all
    its ranks), ``rank``, ``step``, ``coll_name``, ``occurrence``, ``op`` (row in ``lanes``)."""
    instances = analysis.collectives if analysis.has_traces else pd.DataFrame()
    if instances.empty:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in ("call", "rank", "step", "occurrence", "op")})
    mine = np.flatnonzero(lanes.kind == COLLECTIVE)
    ops = pd.DataFrame({"rank": lanes.rank[mine].astype(np.int64), "start": lanes.start[mine], "op": mine})
    ops = ops.drop_duplicates(["rank", "start"])  # a c10d op and its gloo span may start together: keep the outer
    found = instances.assign(rank=instances["rank"].astype(np.int64), start=instances["start_ns"] - lanes.origin_ns)
    found = found.merge(ops, on=["rank", "start"], how="inner")
    found["call"] = found.groupby(["pg_name", "coll_name", "occurrence", "step"], dropna=False, sort=False).ngroup()
    return found[["call", "rank", "step", "coll_name", "occurrence", "op"]].reset_index(drop=True)


def critical_ops(analysis: RunAnalysis, lanes: Lanes, links: pd.DataFrame) -> pd.DataFrame:
    """The ops that stand for the replay's critical path in each profiled step: ``op`` (row in
    ``lanes``) and ``position`` (its node's place on the path, from 0), and ``length`` of the path."""
    graph = analysis.graph
    path = np.asarray(analysis.replay().critical_path, np.int64)
    nodes = graph.nodes.iloc[path]
    on_path = pd.DataFrame({"position": np.arange(len(path)), "node": path, "rank": nodes["rank"].to_numpy(np.int64),
                            "kind": nodes["kind"].astype(str).to_numpy(), "name": nodes["name"].astype(str).to_numpy(),
                            "resource": nodes["resource"].astype(str).to_numpy()})
    found = [_ops_of_ops(graph.nodes, on_path[on_path["kind"].isin(["cpu", "gpu"])], lanes),
             _ops_of_collectives(on_path[on_path["kind"] == "collective"], links)]
    out = pd.concat(found, ignore_index=True).drop_duplicates("op")
    return out.assign(length=len(path)).sort_values("op", ignore_index=True)


def _ops_of_ops(nodes: pd.DataFrame, on_path: pd.DataFrame, lanes: Lanes) -> pd.DataFrame:
    """CPU and GPU nodes: the k-th op of their name on their lane, in every step."""
    if on_path.empty:
        return _NONE
    ordered = nodes.sort_values("offset_ns", kind="stable")
    k = ordered.groupby([ordered["resource"].astype(str), ordered["name"].astype(str)], sort=False).cumcount()
    on_path = on_path.assign(k=k.reindex(on_path["node"]).to_numpy(np.int64), lane=_lane_of(on_path["resource"], lanes),
                             name=pd.Index(lanes.names).get_indexer(on_path["name"]))
    on_path = on_path[(on_path["lane"] >= 0) & (on_path["name"] >= 0)]
    # the graph's ops: a thread's outermost ops (below ProfilerStep#N), a stream's kernels and copies
    op_like = np.where(lanes.lane_gpu[lanes.lane], np.isin(lanes.kind, _GPU_OPS), lanes.depth == 0)
    rows = np.flatnonzero(np.isin(lanes.lane, on_path["lane"].unique()) & op_like)
    ops = pd.DataFrame({"lane": lanes.lane[rows], "name": lanes.name[rows], "op": rows})
    ops["k"] = ops.assign(step=lanes.step[rows]).groupby(["lane", "step", "name"], sort=False).cumcount()
    return on_path.merge(ops, on=["lane", "name", "k"])[["op", "position"]]


def _ops_of_collectives(on_path: pd.DataFrame, links: pd.DataFrame) -> pd.DataFrame:
    """A rank's end of a collective (``all_reduce#3``): its matched instance's op in every step."""
    if on_path.empty or links.empty:
        return _NONE
    coll, _, k = on_path["name"].str.rpartition("#").T.to_numpy()
    wanted = pd.DataFrame({"rank": on_path["rank"].to_numpy(), "coll_name": coll,
                           "occurrence": pd.to_numeric(pd.Series(k), errors="coerce").to_numpy(),
                           "position": on_path["position"].to_numpy()}).dropna()
    wanted["occurrence"] = wanted["occurrence"].astype(np.int64)
    return wanted.merge(links, on=["rank", "coll_name", "occurrence"])[["op", "position"]]


def _lane_of(resources: pd.Series, lanes: Lanes) -> np.ndarray:
    """The lane of each graph resource (``r0/cpu/5793``, ``r0/gpu/7``; a thread's sends and
    receives, ``r0/cpu/5793/p2p``, are on its lane); -1 where none."""
    index = {(int(r), "gpu" if g else "cpu", int(t)): i
             for i, (r, g, t) in enumerate(zip(lanes.lane_rank, lanes.lane_gpu, lanes.lane_thread))}
    out = []
    for resource in resources:
        rank, device, thread = resource.split("/")[:3]
        out.append(index.get((int(rank.lstrip("r")), device, int(thread)), -1))
    return np.asarray(out, np.int64)
