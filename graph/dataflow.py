"""The global dataflow graph of one typical training step, across all ranks.

Nodes are the top-level operators of each CPU thread, the kernels, copies and memsets of each
GPU stream, and the sends of the collectives. Every edge ``u -> v`` carries a lag and means
``start(v) >= end(u) + lag``:

- program order on a thread or stream (lag: the gap measured between the two, less any time
  the queue sat idle waiting for another input);
- CPU -> GPU launch (by correlation id; negative lag: the launch ends inside its top-level op);
- GPU -> CPU synchronisation and waits for a collective (the CPU sat idle until it finished);
- collective enqueue (the op that issued it) and per-rank order on the communication thread;
- collectives matched across ranks by order of issue and decomposed into the sends of their
  algorithm (:mod:`dpro.graph.decompose`): arrivals, sends on links, each rank's end.

Durations and gaps are medians over the profiled steps whose op sequence is the same, so the
graph describes a typical step (:mod:`dpro.graph.typical`). The graph
is built from per-rank reductions (:mod:`dpro.graph.reduction`), never from the events
themselves. Ranks are aligned with the clock offsets recorded by ``dpro record``, refined with
the collectives (:mod:`dpro.graph.alignment`; ``align=False`` ignores both, to measure what
alignment buys).

    >>> g = RunAnalysis.open("run1").graph          # doctest: +SKIP  (the run model caches it)
    >>> g = graph_from_traces({0: load_trace("rank0.json.gz")})   # doctest: +SKIP
    >>> g.to_networkx().number_of_nodes()           # doctest: +SKIP
"""


from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from dpro.errors import DproError
from dpro.graph.alignment import refine_offsets
from dpro.graph.collectives import kernel_algorithm
from dpro.graph.decompose import EDGE_COLUMNS, Matched, decompose
from dpro.graph.kineto import TraceTables
from dpro.graph.matching import match, pair_p2p
from dpro.graph.reduction import RankReduction, reduce_tables
from dpro.graph.typical import NESTED_CALL_EDGES
from dpro.graph.vocabulary import collective_family
from dpro.run_format import BACKWARD_EVENT_PREFIX

__all__ = ["DataflowGraph", "GraphError", "build_graph", "common_steps", "graph_from_traces", "text_as_categories"]


class GraphError(DproError):
    """The traces cannot make a graph (no common profiled step, no trace...)."""


@dataclass
class DataflowGraph:
    """Nodes and lag edges of one typical step; see the module docstring.

    ``nodes``: ``rank`` (a send's is its sender's), ``kind`` (``cpu``, ``gpu``, ``transfer``, or
    ``collective`` for a rank's end of a matched collective), ``resource`` (``"r0/cpu/1234"``,
    ``"r0/gpu/7"``, ``"link/0->1"``), ``name``, ``dur_ns``, ``offset_ns`` (typical start relative
    to the earliest rank's step start), ``coll`` (collective name), ``bytes`` (of a send or a
    collective, NaN if unknown), ``events`` (profiler events a CPU node spans: itself and the
    calls nested in it; 0 elsewhere), ``resumed`` (a CPU op's piece after a ``wait_tensor`` it was
    cut at: it waits for the collective that ended then), ``unclosed`` (a collective's instance
    that no other rank of the graph closed, a peer's trace missing: it keeps its recorded
    time). ``edges``: ``src``, ``dst``, ``lag_ns``, ``kind``
    (``order``, ``launch``, ``sync``, ``enqueue``, ``wait``, ``arrive``, ``transfer``; ``call`` and
    ``return`` join a backward pass on autograd's device thread to the thread that called it).
    ``wraps``: ``src``, ``dst``, ``lag_ns``: from the last op of each thread or stream to its
    first op, with the gap measured between consecutive profiled steps (one step to the next;
    see :mod:`dpro.graph.typical`). ``step_ns``: the profiled window's median step time per rank
    (what was measured, for comparison only: the replay never reads it); ``start_ns``: when
    each rank's step starts, relative to the earliest; ``collectives``: the matched
    collectives (:func:`dpro.graph.decompose.decompose`); ``clock_offsets_ns``: the offsets
    applied; ``hosts``: rank -> host.
    """

    nodes: pd.DataFrame
    edges: pd.DataFrame
    step_ns: dict[int, float]
    start_ns: dict[int, float] = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)
    collectives: pd.DataFrame = field(default_factory=pd.DataFrame)
    clock_offsets_ns: dict[int, int] = field(default_factory=dict)
    hosts: dict[int, str] = field(default_factory=dict)
    wraps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"src": pd.Series(dtype="int64"),
                                                                      "dst": pd.Series(dtype="int64"),
                                                                      "lag_ns": pd.Series(dtype="float64")}))

    def unclosed(self) -> pd.DataFrame:
        """The collectives no other rank closed (:attr:`nodes`' ``unclosed``), counted: ``rank``,
        ``coll``, ``pg_name``, ``count``; empty where every one was matched."""
        columns = ["rank", "coll", "pg_name"]
        if "unclosed" not in self.nodes:
            return pd.DataFrame(columns=[*columns, "count"])
        open_ = self.nodes.loc[self.nodes["unclosed"].to_numpy(), columns].astype({"coll": str, "pg_name": str})
        return open_.groupby(columns).size().rename("count").reset_index()

    def to_networkx(self) -> Any:
        """The graph as a ``networkx.DiGraph`` (node and edge attributes from the tables)."""
        import networkx as nx

        g = nx.DiGraph()
        g.add_nodes_from((i, row) for i, row in enumerate(self.nodes.to_dict("records")))
        g.add_edges_from((int(s), int(d), {"lag_ns": int(l), "kind": k}) for s, d, l, k in
                         self.edges[["src", "dst", "lag_ns", "kind"]].itertuples(index=False))
        return g


def text_as_categories(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its text columns as categoricals, as the graph holds them: a few distinct
    names repeated over millions of rows (a 256-rank graph has over a million nodes) take a code
    each, and ``to_numpy()`` is a cheap take, not the copy pandas' string dtypes make."""
    text = [c for c in frame if pd.api.types.is_string_dtype(frame[c]) or frame[c].dtype == object
            or isinstance(frame[c].dtype, pd.CategoricalDtype)]
    return frame.assign(**{c: _object_categories(frame[c]) for c in text}) if text else frame


def _object_categories(column: pd.Series) -> pd.Categorical:
    """A text column as a categorical whose categories are Python strings (pandas' own string
    dtype would make every ``to_numpy()`` a conversion)."""
    values = column.array if isinstance(column.dtype, pd.CategoricalDtype) else pd.Categorical(column)
    if values.categories.dtype == object:
        return values
    return pd.Categorical.from_codes(values.codes, dtype=pd.CategoricalDtype(pd.Index(values.categories, dtype=object)))


def common_steps(steps_by_rank: dict[int, list[int]]) -> list[int]:
    """The profiled steps every rank has; a one-line error when there is none."""
    common = sorted(set.intersection(*(set(s) for s in steps_by_rank.values()))) if steps_by_rank else []
    if not common:
        raise GraphError("the traces share no profiled step (ProfilerStep#N)")
    return common


def graph_from_traces(traces: dict[int, TraceTables], **options: Any) -> DataflowGraph:
    """The graph of in-memory traces (rank -> tables): each reduced over the steps they share,
    then :func:`build_graph` with ``options``."""
    common = common_steps({r: list(t.steps["step"]) for r, t in traces.items()})
    return build_graph({r: reduce_tables(t, r, common) for r, t in traces.items()}, **options)


def build_graph(reductions: dict[int, RankReduction], offsets: dict[int, int] | None = None,
                align: bool = True, bucket_bytes: list[int] | None = None,
                algorithms: dict[tuple[str, int], str] | None = None,
                hosts: dict[int, str] | None = None,
                profiler_ns: dict[int, dict[str, float]] | None = None) -> DataflowGraph:
    """The global dataflow graph of the ranks' typical steps, which must be made of the same
    steps (:func:`common_steps`).

    ``offsets``: each rank's recorded clock offset against the first; with ``align`` they are
    applied and refined with the collectives (:func:`~dpro.graph.alignment.refine_offsets`),
    without it ranks are taken as they were recorded. ``bucket_bytes`` (DDP's buckets, in
    reduction order) sizes the all-reduces whose size the trace does not give; ``algorithms``
    (:func:`~dpro.graph.collectives.nccl_log_algorithms`) names the algorithm NCCL chose per
    collective and size, else the backend's default is assumed. ``hosts`` (rank -> host name)
    tells links within a host from links between hosts.
    """
    steps = [rd.step.steps for rd in reductions.values()]
    common = common_steps({r: rd.steps for r, rd in reductions.items()})
    if any(s != steps[0] for s in steps) or not set(steps[0]) <= set(common):
        raise GraphError("the ranks' typical steps are made of different steps; reduce them over the common ones")
    clocks = {r: (offsets or {}).get(r, 0) if align else 0 for r in reductions}
    if align:
        clocks = refine_offsets(match(pd.concat([rd.instances for rd in reductions.values()], ignore_index=True)),
                                clocks)
    starts = {r: rd.step.start_ns - clocks[r] for r, rd in reductions.items()}
    first = min(starts.values())
    frames, edge_frames, wrap_frames, base = [], [], [], 0
    for r, rd in sorted(reductions.items()):
        n = rd.step.nodes.assign(rank=r, resource=f"r{r}/" + rd.step.nodes["resource"])
        n["offset_ns"] = n["offset_ns"] + (starts[r] - first)
        wrap_frames.append(_wraps(rd.step.nodes, rd.step.wrap_gaps, base))
        step_edges = rd.step.edges
        if profiler_ns and r in profiler_ns:
            n["dur_ns"] = _without_profiler(rd.step.nodes, profiler_ns[r])
            step_edges = _nested_lags_rescaled(step_edges, rd.step.nodes["dur_ns"].to_numpy(np.float64),
                                               n["dur_ns"].to_numpy(np.float64))
        frames.append(n)
        edge_frames.append(step_edges.assign(src=step_edges["src"] + base, dst=step_edges["dst"] + base))
        base += len(n)
    nodes = pd.concat(frames, ignore_index=True)
    edges = pd.concat(edge_frames, ignore_index=True)
    matched = []
    instances = nodes[nodes["occurrence"] >= 0].assign(node=lambda f: f.index)
    key = ["pg_name", "coll_name", "occurrence"]
    for (_, coll, k), group in match(instances, key=key).groupby(key, sort=False):
        ids = dict(zip(group["rank"], group["node"]))
        matched.append(Matched(coll, int(k), ids, *_size_and_algorithm(nodes, coll, int(k), ids, bucket_bytes,
                                                                       algorithms), group=str(group["pg_name"].iloc[0])))
    matched = _numbered_across_groups(matched)
    for send, recv in pair_p2p(instances.set_index("node")):
        a, b = int(nodes.at[send, "rank"]), int(nodes.at[recv, "rank"])
        sizes = nodes.loc[[send, recv], "nbytes"].dropna()
        matched.append(Matched("send", int(nodes.at[send, "occurrence"]), {a: send, b: recv},
                               float(sizes.iloc[0]) if len(sizes) else float("nan"), group=str(nodes.at[send, "pg_name"]),
                               root=0 if a < b else 1))
    closed = [i for m in matched for i in m.instances.values()]
    nodes["unclosed"] = nodes.index.isin(instances.index) & ~nodes.index.isin(closed)
    nodes, edges, table = decompose(nodes, edges, matched)
    keep = ["rank", "kind", "resource", "name", "dur_ns", "offset_ns", "coll_name", "pg_name", "bytes", "events",
            "hooks", "resumed", "unclosed"]
    nodes = nodes.reindex(columns=keep).assign(resumed=lambda n: n["resumed"].eq(True),
                                               unclosed=lambda n: n["unclosed"].eq(True))
    return DataflowGraph(text_as_categories(nodes.rename(columns={"coll_name": "coll"})
                                         .reset_index(drop=True)),
                         text_as_categories(edges[EDGE_COLUMNS].reset_index(drop=True)),
                         step_ns={r: rd.step.step_ns for r, rd in reductions.items()},
                         start_ns={r: starts[r] - first for r in reductions}, steps=steps[0],
                         collectives=table, clock_offsets_ns=clocks,
                         hosts=dict(hosts) if hosts else {r: "" for r in reductions},
                         wraps=pd.concat(wrap_frames, ignore_index=True))


def _numbered_across_groups(matched: list[Matched]) -> list[Matched]:
    """The collectives with each kind's occurrences numbered across process groups: a group's
    own numbers (its sequence) follow those of the groups met before it, so that a kind and an
    occurrence name one collective of the job (FSDP over 2 shard groups makes an all-gather #0
    in each). A job of one group keeps its numbers."""
    counts: dict[tuple[str, str], int] = {}  # (coll, group) -> its numbers, in order of first appearance
    for m in matched:
        counts[m.coll, m.group] = max(counts.get((m.coll, m.group), 0), m.occurrence + 1)
    offsets: dict[tuple[str, str], int] = {}
    ends: dict[str, int] = {}
    for (coll, group), count in counts.items():
        offsets[coll, group] = ends.get(coll, 0)
        ends[coll] = offsets[coll, group] + count
    return [replace(m, occurrence=m.occurrence + offsets[m.coll, m.group]) for m in matched]


def _wraps(nodes: pd.DataFrame, gaps: dict[str, float], base: int) -> pd.DataFrame:
    """One rank's wraps: per queue with a measured gap, from its op that ends last to its op
    that starts first (ties: the earlier node), node ids shifted by ``base``."""
    queues = nodes[nodes["kind"].isin(("cpu", "gpu")) & nodes["resource"].isin(list(gaps))]
    ends = queues["offset_ns"] + queues["dur_ns"]
    tail = ends.groupby(queues["resource"], sort=False).idxmax()
    head = queues["offset_ns"].groupby(queues["resource"], sort=False).idxmin()
    return pd.DataFrame({"src": tail.to_numpy(np.int64) + base, "dst": head[tail.index].to_numpy(np.int64) + base,
                         "lag_ns": [gaps[r] for r in tail.index]})


def _without_profiler(nodes: pd.DataFrame, per_event_ns: dict[str, float]) -> np.ndarray:
    """The nodes' durations less what the profiler cost for the events they span, at the cost
    of their class: autograd's backward functions (with everything nested in them) or the others."""
    backward = nodes["name"].astype(str).str.startswith(BACKWARD_EVENT_PREFIX).to_numpy()
    cost = np.where(backward, per_event_ns.get("backward", 0.0), per_event_ns.get("forward", 0.0))
    return np.maximum(nodes["dur_ns"].to_numpy(np.float64) - cost * nodes["events"].to_numpy(np.float64), 0.0)


def _nested_lags_rescaled(edges: pd.DataFrame, recorded_ns: np.ndarray, compensated_ns: np.ndarray) -> pd.DataFrame:
    """Edges whose nested calls end at the same share of their op's compensated duration as of
    its recorded one (a lag kept whole would start a call early in a long op before the op)."""
    nested = edges["kind"].isin(NESTED_CALL_EDGES).to_numpy()
    src = edges["src"].to_numpy(np.int64)
    ratio = np.divide(compensated_ns, recorded_ns, out=np.ones_like(recorded_ns), where=recorded_ns > 0)
    lag = edges["lag_ns"].to_numpy(np.float64)
    return edges.assign(lag_ns=np.where(nested, np.round(lag * ratio[src]), lag).astype(np.int64))


def _size_and_algorithm(nodes: pd.DataFrame, coll: str, k: int, ids: dict[int, int], bucket_bytes: list[int] | None,
                        algorithms: dict[tuple[str, int], str] | None) -> tuple[float, str | None]:
    """A matched collective's bytes (from the trace, else the DDP bucket it reduces) and the
    algorithm NCCL chose for it (its kernel's name, else its log), None when not known. The
    bytes are those its algorithm's schedule divides (:func:`dpro.graph.collectives.schedule`):
    the input's, but an all-gather's output (each rank's input times the ranks), as NCCL counts
    them too."""
    known = nodes.loc[list(ids.values()), "nbytes"].dropna()
    first = nodes.loc[next(iter(ids.values()))]
    size = float(known.iloc[0]) if len(known) else float("nan")
    if collective_family(coll) == "all_gather":
        size *= len(ids)
    if size != size and coll == "all_reduce" and bucket_bytes and k < len(bucket_bytes):
        size = float(bucket_bytes[k])
    algorithm = kernel_algorithm(str(first["name"]))
    if algorithm is None and algorithms and size == size:
        algorithm = algorithms.get((coll, int(size))) or algorithms.get(("*", int(size)))
    return size, algorithm
