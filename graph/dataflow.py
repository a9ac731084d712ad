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

Durations and gaps are means over the profiled steps whose op sequence is the same (their sum
is the mean step), so the graph describes a typical step. Ranks are aligned with the clock offsets recorded by
``dpro record``, refined with the collectives (``align=False`` ignores both, to measure what
alignment buys).

    >>> g = graph_of_run(open_run("run1"))          # doctest: +SKIP
    >>> g.to_networkx().number_of_nodes()           # doctest: +SKIP
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from dpro.errors import DproError
from dpro.run_format import Run

from .collectives import kernel_algorithm, nccl_log_algorithms
from .decompose import Matched, decompose
from .kineto import TraceTables, load_trace

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
SYMMETRIC_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier")
CPU_CATEGORIES = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver")
SYNC_NAMES = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "hipMemcpy")


class GraphError(DproError):
    """The traces cannot make a graph (no common profiled step, no trace...)."""


@dataclass
class DataflowGraph:
    """Nodes and lag edges of one typical step; see the module docstring.

    ``nodes``: ``rank`` (a send's is its sender's), ``kind`` (``cpu``, ``gpu``, ``transfer``, or
    ``collective`` for a rank's end of a matched collective), ``resource`` (``"r0/cpu/1234"``,
    ``"r0/gpu/7"``, ``"link/0->1"``), ``name``, ``dur_ns``, ``offset_ns`` (typical start relative
    to the earliest rank's step start), ``coll`` (collective name), ``bytes`` (of a send or a
    collective, NaN if unknown). ``edges``: ``src``, ``dst``, ``lag_ns``, ``kind`` (``order``,
    ``launch``, ``sync``, ``enqueue``, ``wait``, ``arrive``, ``transfer``). ``step_ns``:
    measured mean step time per rank; ``start_ns``: when each rank's step starts, relative to
    the earliest; ``collectives``: the matched collectives
    (:func:`dpro.graph.decompose.decompose`); ``clock_offsets_ns``: the offsets applied;
    ``hosts``: rank -> host.
    """

    nodes: pd.DataFrame
    edges: pd.DataFrame
    step_ns: dict[int, float]
    start_ns: dict[int, float] = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)
    collectives: pd.DataFrame = field(default_factory=pd.DataFrame)
    clock_offsets_ns: dict[int, int] = field(default_factory=dict)
    hosts: dict[int, str] = field(default_factory=dict)

    def to_networkx(self) -> Any:
        """The graph as a ``networkx.DiGraph`` (node and edge attributes from the tables)."""
        import networkx as nx

        g = nx.DiGraph()
        g.add_nodes_from((i, row) for i, row in enumerate(self.nodes.to_dict("records")))
        g.add_edges_from((int(s), int(d), {"lag_ns": int(l), "kind": k}) for s, d, l, k in
                         self.edges[["src", "dst", "lag_ns", "kind"]].itertuples(index=False))
        return g


@dataclass
class _RankStep:
    """One rank's typical step: its nodes (as a frame) and its edges within the rank."""

    rank: int
    nodes: pd.DataFrame  # name, kind, resource, dur_ns, offset_ns, coll, gap_ns
    edges: list[tuple[int, int, int, str]]
    step_ns: float
    start_ns: int


def _top_level(events: pd.DataFrame) -> np.ndarray:
    """Mask of the events (of one thread, sorted by start) not nested in an earlier one."""
    ends = (events["start_ns"] + events["dur_ns"]).to_numpy()
    prev_max = np.maximum.accumulate(np.concatenate([[np.iinfo(np.int64).min], ends[:-1]]))
    return events["start_ns"].to_numpy() >= prev_max


def _step_nodes(ev: pd.DataFrame, step_start: int, step_end: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Top-level CPU ops per thread and GPU ops per stream of one step; and the calls that carry
    dependencies (launches, syncs, collective enqueues), nested or top-level, each with the key
    of its top-level parent."""
    ev = ev[~ev["name"].astype(str).str.startswith("ProfilerStep#")]
    cpu = ev[ev["cat"].isin(CPU_CATEGORIES) & (ev["stream"] < 0)]
    gpu = ev[ev["cat"].isin(GPU_CATEGORIES)]
    parts, inner = [], []
    for tid, thread in cpu.groupby("tid", sort=True):
        thread = thread.sort_values(["start_ns", "dur_ns"], ascending=[True, False])
        top = _top_level(thread)
        tops = thread[top].assign(kind="cpu", resource=f"cpu/{tid}")
        parts.append(tops)
        nested = thread[~top]
        parent = np.searchsorted(tops["start_ns"].to_numpy(), nested["start_ns"].to_numpy(), "right") - 1
        inner.append(nested.assign(parent_key=[f"cpu/{tid}#{p}" for p in parent]))
    for stream, s in gpu.groupby("stream", sort=True):
        parts.append(s.sort_values("start_ns").assign(kind="gpu", resource=f"gpu/{stream}"))
    nodes = pd.concat(parts, ignore_index=True) if parts else ev.iloc[:0].assign(kind="", resource="")
    nodes["pos"] = nodes.groupby("resource").cumcount()
    nodes["key"] = nodes["resource"] + "#" + nodes["pos"].astype(str)
    # The step ends in the optimizer step hook, inside the optimizer's own op: what that op does
    # after the boundary (the hook, and the profiler stopping in the window's last step)
    # belongs to no step.
    cpu_rows = nodes["kind"] == "cpu"
    nodes.loc[cpu_rows, "dur_ns"] = np.minimum(nodes.loc[cpu_rows, "dur_ns"],
                                               np.maximum(step_end - nodes.loc[cpu_rows, "start_ns"], 0))
    nodes["offset_ns"] = nodes["start_ns"] - step_start
    inner = pd.concat(inner, ignore_index=True) if inner else ev.iloc[:0].assign(parent_key="")
    # A top-level call (a launch or sync made outside any op) is its own parent.
    calls = pd.concat([nodes[nodes["kind"] == "cpu"].assign(parent_key=nodes["key"]), inner], ignore_index=True)
    return nodes, calls


def _signature(nodes: pd.DataFrame) -> tuple:
    return tuple(zip(nodes["resource"], nodes["name"].astype(str)))


def _rank_step(tables: TraceTables, rank: int, steps: list[int]) -> _RankStep:
    """One rank's typical step over ``steps``: medians over the steps that share a structure."""
    per_step = []
    windows = tables.steps.set_index("step")
    for s in steps:
        ev = tables.events[tables.events["step"] == s]
        nodes, inner = _step_nodes(ev, int(windows.loc[s, "start_ns"]), int(windows.loc[s, "end_ns"]))
        per_step.append((s, nodes, inner))
    signatures = [_signature(n) for _, n, _ in per_step]
    common = max(set(signatures), key=lambda sig: (signatures.count(sig), len(sig)))  # ties: the fuller step
    chosen = [(s, n, i) for (s, n, i), sig in zip(per_step, signatures) if sig == common]
    _, template, inner = chosen[0]
    template["measured_end_ns"] = template["start_ns"] + template["dur_ns"]  # in the template's own step
    for column in ("dur_ns", "offset_ns"):
        template[column] = np.mean(np.stack([n[column].to_numpy() for _, n, _ in chosen]), axis=0)
    step_durations = [windows.loc[s, "end_ns"] - windows.loc[s, "start_ns"] for s, _, _ in chosen]
    step_ns = float(np.mean(step_durations))  # contiguous steps: the window's span over their count
    edges = _rank_edges(template, inner)
    # Where the typical step starts: the mean over every step used by any rank, so that the
    # ranks' starts compare even when each rank's typical steps are a different subset.
    starts = windows.loc[steps, "start_ns"].to_numpy(np.int64)
    return _RankStep(rank, template, edges, step_ns, start_ns=int(starts[0] + np.mean(starts - starts[0])))


def _rank_edges(nodes: pd.DataFrame, inner: pd.DataFrame) -> list[tuple[int, int, int, str]]:
    """Edges within one rank: program order, launches, syncs, collective enqueues and waits."""
    index = {k: i for i, k in enumerate(nodes["key"])}
    start = nodes["offset_ns"].to_numpy()
    end = start + nodes["dur_ns"].to_numpy()
    measured_start = nodes["start_ns"].to_numpy()  # absolute, in the step the template came from
    measured_end = nodes["measured_end_ns"].to_numpy()

    def parent_of(keys: pd.Series) -> list[int | None]:
        return [index.get(k) for k in keys]

    def lag_after_parent(parent: int, done_abs: int) -> int:
        """Lag from the parent's end to a nested call's end (how long before its parent ended
        it returned), both as measured in the template's own step: not mixed with the parent's
        typical duration, which would move a call at the end of an op past the op's end."""
        return int(done_abs - measured_end[parent])

    order: dict[int, list] = {}
    for _, group in nodes.groupby("resource", sort=False):
        ids = group.index.to_numpy()
        for a, b in zip(ids[:-1], ids[1:]):
            order[b] = [a, b, int(start[b] - end[a]), "order"]
    edges: list[tuple[int, int, int, str]] = []
    gpu = nodes[nodes["kind"] == "gpu"]
    by_corr = dict(zip(gpu["correlation"], gpu.index))
    # CPU -> GPU: the launch call, nested in a top-level op, returns before the kernel can start.
    launches = inner[inner["correlation"].isin(by_corr.keys()) & (inner["correlation"] >= 0)]
    launched_by = np.full(len(nodes), -1)
    for parent, corr, done in zip(parent_of(launches["parent_key"]), launches["correlation"],
                                  launches["start_ns"] + launches["dur_ns"]):
        if parent is not None:
            edges.append((parent, by_corr[corr], lag_after_parent(parent, done), "launch"))
            launched_by[by_corr[corr]] = parent
    # GPU -> CPU: a blocking sync returns only after the GPU work it waited for. Work launched
    # by the same top-level op (a blocking copy) is waited for inside that op's own duration.
    gpu_end = (gpu["start_ns"] + gpu["dur_ns"]).to_numpy()
    gpu_launcher = launched_by[gpu.index.to_numpy()]
    syncs = inner[inner["name"].astype(str).isin(SYNC_NAMES)]
    for parent, done in zip(parent_of(syncs["parent_key"]), syncs["start_ns"] + syncs["dur_ns"]):
        finished = np.flatnonzero((gpu_end <= done) & (gpu_launcher != parent))
        if parent is not None and finished.size:
            last = finished[np.argmax(gpu_end[finished])]
            edges.append((int(gpu.index[last]), parent, int(measured_start[parent] - gpu_end[last]), "sync"))
    # Collectives: issued by a c10d::* call on another thread, waited for by idle CPU threads.
    instances = _collectives(nodes)
    issued = _enqueue_ops(inner).set_index(["coll_name", "occurrence"])
    comm_threads = set(instances["resource"])  # their order already sequences the collectives
    names = nodes["name"].astype(str)
    optimizer_steps = nodes.index[(nodes["kind"] == "cpu") & names.str.startswith("Optimizer.step#")
                                  & ~nodes["resource"].isin(comm_threads)].to_numpy()
    optimizer_steps = optimizer_steps[np.argsort(start[optimizer_steps])]
    cpu_threads = [g for resource, g in nodes[nodes["kind"] == "cpu"].groupby("resource", sort=False)
                   if resource not in comm_threads]
    for i, name, k in zip(instances.index, instances["coll_name"], instances["occurrence"]):
        if (name, k) in issued.index:
            call = issued.loc[(name, k)]
            parent = index.get(call["parent_key"])
            if parent is not None:
                edges.append((parent, i, lag_after_parent(parent, call["start_ns"] + call["dur_ns"]), "enqueue"))
        for thread in cpu_threads:
            waiter = _waiter(thread, end[i], start, end)
            if waiter is not None and waiter != i:
                edges.append((i, waiter, int(start[waiter] - end[i]), "wait"))
        # The optimizer updates with the reduced gradients: DDP waits for every bucket before
        # it, often inside another op, where no idle time shows the wait.
        gradients = str(name).lstrip("_").startswith(("all_reduce", "reduce_scatter"))
        for step_op in optimizer_steps[start[optimizer_steps] > start[i]][:1] if gradients else []:
            edges.append((i, int(step_op), max(0, int(start[step_op] - end[i])), "wait"))
    _trim_idle_gaps(order, edges, start, end)
    return edges + [tuple(e) for e in order.values()]


def _trim_idle_gaps(order: dict[int, list], edges: list[tuple[int, int, int, str]],
                    start: np.ndarray, end: np.ndarray) -> None:
    """Keep in an order edge's lag only the gap its queue really needs.

    Where an op's other input (a launch, a wait, an enqueue) became ready only after the
    previous op on its thread or stream had ended, the queue sat idle waiting for that input:
    the measured gap was waiting, and the order edge keeps only the latency from the input's
    arrival to the op's start. Otherwise the queue was busy and the gap is its own. A
    collective that ended while the waiting thread was still busy did not hold the op back, so
    its wait's lag is cut to 0 (the measured one would be slack, and would bind once times
    shift in a what-if).
    """
    ready = np.full(len(start), -np.inf)
    for e, (src, dst, lag, kind) in enumerate(edges):
        prev = order.get(dst)
        if kind == "wait" and prev is not None and end[src] <= end[prev[0]] and lag > 0:
            edges[e] = (src, dst, 0, kind)
            lag = 0
        ready[dst] = max(ready[dst], end[src] + lag)
    for v, edge in order.items():
        if ready[v] > end[edge[0]]:
            edge[2] = int(min(edge[2], max(0.0, start[v] - ready[v])))


def _waiter(thread: pd.DataFrame, done: float, start: np.ndarray, end: np.ndarray) -> int | None:
    """The op of ``thread`` that waited for a collective ``done`` at that time: the first to
    start after it, if the thread was idle when it finished. (A thread still busy then shows no
    sign of needing the result; a wait nested inside a top-level op is part of its duration.)"""
    ids = thread.index.to_numpy()
    j = int(np.searchsorted(start[ids], done, "left"))
    if j >= len(ids) or (j > 0 and end[ids[j - 1]] > done):
        return None
    return int(ids[j])


def _collectives(nodes: pd.DataFrame) -> pd.DataFrame:
    """The rank's collective nodes, numbered by order of issue per collective name."""
    coll = nodes[nodes["coll_name"].notna() & (nodes["kind"] == "cpu")]
    coll = coll[~coll["name"].astype(str).str.startswith("c10d::")]
    # Several communication threads (gloo has two) take work in the order it was issued, so
    # the order of start times across threads is the order of issue.
    coll = coll.sort_values("offset_ns", kind="stable")
    return coll.assign(occurrence=coll.groupby("coll_name", observed=True).cumcount()).sort_index()


def _enqueue_ops(inner: pd.DataFrame) -> pd.DataFrame:
    """Main-thread ``c10d::*`` calls that issue collectives, numbered like :func:`_collectives`."""
    issued = inner[inner["name"].astype(str).str.startswith("c10d::") & inner["coll_name"].notna()]
    issued = issued.sort_values("start_ns")
    return issued.assign(occurrence=issued.groupby("coll_name", observed=True).cumcount())


def load_run_traces(run: Run) -> dict[int, TraceTables]:
    """Every rank's trace of a run; a rank without one is an error."""
    missing = [r for r in run.ranks if run.trace_path(r) is None]
    if not run.ranks or missing:
        raise GraphError(f"{run.root}: no trace for rank(s) {missing or 'any'}; was the profiling window reached?")
    return {r: load_trace(run.trace_path(r), rank=r) for r in run.ranks}


def clock_offsets(run: Run) -> dict[int, int]:
    """Each rank's recorded clock offset against rank 0 (0 where it was not measured)."""
    out = {}
    for r in run.ranks:
        path = run.rank_dir(r) / "clock.json"
        offset = json.loads(path.read_text()).get("offset_ns") if path.exists() else None
        out[r] = int(offset or 0)
    return out


def graph_of_run(run: Run, align: bool = True) -> DataflowGraph:
    """The dataflow graph of a recorded run, with everything the run recorded to size and name
    its collectives (DDP buckets, NCCL's tuning log) and its ranks' hosts."""
    logs = sorted((run.root / "nccl").glob("*.log")) if (run.root / "nccl").is_dir() else []
    return build_graph(load_run_traces(run), clock_offsets(run), align=align, bucket_bytes=ddp_bucket_bytes(run),
                       algorithms=nccl_log_algorithms(logs) if logs else None,
                       hosts={r: str(run.rank_meta(r).get("host", "")) for r in run.ranks})


def ddp_bucket_bytes(run: Run) -> list[int]:
    """Bytes of each DDP gradient bucket, in the order they are all-reduced (from rank 0's
    metadata; empty when the job used no DDP or it was not recorded)."""
    ddp = (run.rank_meta(min(run.ranks)).get("ddp") or []) if run.ranks else []
    return [int(b["bytes"]) for b in ddp[0]["buckets"]] if ddp else []


def build_graph(traces: dict[int, TraceTables], offsets: dict[int, int] | None = None,
                align: bool = True, bucket_bytes: list[int] | None = None,
                algorithms: dict[tuple[str, int], str] | None = None,
                hosts: dict[int, str] | None = None) -> DataflowGraph:
    """The global dataflow graph of the profiled steps common to every rank.

    ``offsets``: each rank's clock offset against the first (from :func:`clock_offsets`);
    with ``align`` they are applied and refined with the collectives (all ranks leave a
    collective together), without it ranks are taken as they were recorded.
    ``bucket_bytes`` (:func:`ddp_bucket_bytes`) sizes the DDP all-reduces where the trace
    does not; ``algorithms`` (:func:`~dpro.graph.collectives.nccl_log_algorithms`) names the
    algorithm NCCL chose per collective and size, else the backend's default is assumed.
    ``hosts`` (rank -> host name) tells links within a host from links between hosts.
    """
    common = sorted(set.intersection(*(set(t.steps["step"]) for t in traces.values())))
    if not common:
        raise GraphError("the traces share no profiled step (ProfilerStep#N)")
    rank_steps = {r: _rank_step(t, r, common) for r, t in sorted(traces.items())}
    clocks = {r: (offsets or {}).get(r, 0) if align else 0 for r in rank_steps}
    if align:
        clocks = refine_offsets(traces, common, clocks)
    starts = {r: rs.start_ns - clocks[r] for r, rs in rank_steps.items()}
    first = min(starts.values())
    frames, edges, base = [], [], 0
    colls: dict[tuple[str, int], dict[int, int]] = {}
    for r, rs in rank_steps.items():
        n = rs.nodes.assign(rank=r, resource=f"r{r}/" + rs.nodes["resource"])
        n["offset_ns"] = n["offset_ns"] + (starts[r] - first)
        frames.append(n)
        edges += [(a + base, b + base, lag, kind) for a, b, lag, kind in rs.edges]
        for row in _collectives(rs.nodes).itertuples():
            colls.setdefault((row.coll_name, row.occurrence), {})[r] = row.Index + base
        base += len(n)
    nodes = pd.concat(frames, ignore_index=True)
    matched = [Matched(name, k, ids, *_size_and_algorithm(nodes, name, k, ids, bucket_bytes, algorithms))
               for (name, k), ids in colls.items() if len(ids) == len(traces)]  # others stay per-rank ops
    nodes, table = decompose(nodes, edges, matched)
    keep = ["rank", "kind", "resource", "name", "dur_ns", "offset_ns", "coll_name", "bytes"]
    return DataflowGraph(nodes.reindex(columns=keep).rename(columns={"coll_name": "coll"}).reset_index(drop=True),
                         pd.DataFrame(edges, columns=["src", "dst", "lag_ns", "kind"]),
                         step_ns={r: rs.step_ns for r, rs in rank_steps.items()},
                         start_ns={r: starts[r] - first for r in rank_steps}, steps=common,
                         collectives=table, clock_offsets_ns=clocks,
                         hosts=dict(hosts) if hosts else {r: "" for r in rank_steps})


def refine_offsets(traces: dict[int, TraceTables], steps: list[int], offsets: dict[int, int]) -> dict[int, int]:
    """Offsets corrected so that no rank leaves a collective before every rank has joined it.

    A rank cannot finish an all-reduce, all-gather, reduce-scatter or all-to-all before the
    last rank has arrived, so each collective of ``steps`` bounds each rank's offset against
    the first rank's: ``end_r - start_first`` from above, ``start_r - end_first`` from below.
    A recorded offset inside every bound is kept (the bounds are only as tight as the
    collectives are short); one outside is moved to the nearest bound. Rooted collectives
    (a broadcast's root may finish first) and point-to-point transfers are not used.
    """
    spans = {r: _symmetric_collective_spans(t, steps) for r, t in traces.items()}
    ref = min(spans)
    out = dict(offsets)
    for r, span in spans.items():
        both = span.join(spans[ref].add_suffix("_ref"), how="inner")
        if r == ref or both.empty:
            continue
        # start(x) - offset(x) <= end(y) - offset(y) for x, y in {r, ref}
        high = offsets[ref] + (both["end_ns"] - both["start_ns_ref"]).min()
        low = offsets[ref] - (both["end_ns_ref"] - both["start_ns"]).min()
        out[r] = int(min(max(offsets[r], low), high)) if low <= high else offsets[r]
    return out


def _symmetric_collective_spans(tables: TraceTables, steps: list[int]) -> pd.DataFrame:
    """Start and end (the rank's own clock) of its symmetric collectives in ``steps``, indexed
    by (step, collective, order of issue within the step)."""
    ev = tables.events
    ev = ev[ev["step"].isin(steps) & ev["coll_name"].notna() & (ev["stream"] < 0) & ev["cat"].isin(CPU_CATEGORIES)]
    ev = ev[~ev["name"].astype(str).str.startswith("c10d::")
            & ev["coll_name"].astype(str).str.lstrip("_").str.startswith(SYMMETRIC_COLLECTIVES)]
    ev = ev.sort_values("start_ns", kind="stable")
    index = pd.MultiIndex.from_arrays([ev["step"], ev["coll_name"].astype(str),
                                       ev.groupby(["step", "coll_name"], observed=True).cumcount()])
    return pd.DataFrame({"start_ns": ev["start_ns"].to_numpy(), "end_ns": (ev["start_ns"] + ev["dur_ns"]).to_numpy()},
                        index=index)


def _size_and_algorithm(nodes: pd.DataFrame, coll: str, k: int, ids: dict[int, int], bucket_bytes: list[int] | None,
                        algorithms: dict[tuple[str, int], str] | None) -> tuple[float, str | None]:
    """A matched collective's bytes (from the trace, else the DDP bucket it reduces) and the
    algorithm NCCL chose for it (its kernel's name, else its log), None when not known."""
    first = nodes.loc[next(iter(ids.values()))]
    size = float("nan")
    if first.get("in_nelems", -1) > 0 and isinstance(first.get("dtype"), str):
        size = float(first["in_nelems"] * _DTYPE_BYTES.get(first["dtype"].lower(), 4))
    elif coll == "all_reduce" and bucket_bytes and k < len(bucket_bytes):
        size = float(bucket_bytes[k])
    algorithm = kernel_algorithm(str(first["name"]))
    if algorithm is None and algorithms and size == size:
        algorithm = algorithms.get((coll, int(size))) or algorithms.get(("*", int(size)))
    return size, algorithm


_DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
                "c10::half": 2, "c10::bfloat16": 2, "int": 4, "int32": 4, "long int": 8, "int64": 8,
                "char": 1, "int8": 1, "unsigned char": 1, "uint8": 1, "bool": 1}
