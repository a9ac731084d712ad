"""One rank's typical step: its top-level ops, kernels and edges, as medians over its profiled steps.

The profiled steps of a rank are cut into nodes (the top-level ops of each CPU thread, the
kernels, copies and memsets of each GPU stream) and the calls that carry dependencies
(launches, syncs, collective enqueues). The steps whose sequence of nodes is the most common
(the fuller one among ties) give the typical step: the first of them is its template, and each
node's duration and start (``offset_ns``, from the step's start) are the medians over them
(robust to a step the shared machine slowed). Edges within the rank (see :mod:`dpro.graph.dataflow`) are
measured in the template's own step. The rank's collective instances are numbered as
:mod:`dpro.graph.matching` matches them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dpro.run_format import BACKWARD_EVENT_PREFIX

from dpro.graph.kineto import TraceTables
from dpro.graph.matching import does_work, has_collective_kernels, is_p2p, number
from dpro.graph.vocabulary import (CPU_CATEGORIES, GPU_OP_CATEGORIES, GRADIENT_FAMILIES, SYNC_NAMES, is_enqueue_call,
                                   collective_family)

__all__ = ["NESTED_CALL_EDGES", "NODE_COLUMNS", "RankStep", "typical_step"]

NESTED_CALL_EDGES = ("launch", "enqueue")
"""Edges from a top-level op to what a call nested in it started: their lag runs from the op's
end to the nested call's end (negative: the call returned before the op ended)."""
NODE_COLUMNS = ["name", "kind", "resource", "dur_ns", "offset_ns", "coll_name", "pg_name", "peer", "occurrence",
                "nbytes", "events", "hooks", "resumed"]
HOOK_PATTERN = (r"FSDP::(?:pre_forward|pre_backward|forward_prefetch for |backward_prefetch for |post_backward_reduce"
                r"|all_gather(?= \(|$))")
"""The FSDP ranges a top-level op runs (itself or nested in it), kept as its ``hooks``: where a
unit's parameters are gathered (``FSDP::all_gather (unit)``, not its copies) and needed and its
gradients reduced, for the what-ifs that change FSDP's settings."""


@dataclass
class RankStep:
    """One rank's typical step: ``nodes`` (:data:`NODE_COLUMNS`: ``occurrence`` numbers the
    collective instances, -1 elsewhere; ``nbytes`` their sizes), ``edges`` within the rank
    (``src``, ``dst``, ``lag_ns``, ``kind``, over node positions), the median ``step_ns``, when the
    typical step starts (``start_ns``, the rank's clock), the ``steps`` it is made of, and per
    queue the measured gap from one step's last op to the next step's first (``wrap_gaps``)."""

    rank: int
    nodes: pd.DataFrame
    edges: pd.DataFrame
    step_ns: float
    start_ns: int
    steps: list[int] = field(default_factory=list)
    wrap_gaps: dict[str, float] = field(default_factory=dict)


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
    ev = ev.assign(event=ev.index)
    if "peer" not in ev:  # not labelled from a collective log
        ev = ev.assign(peer=np.nan, logged=False)
    cpu = ev[ev["cat"].isin(CPU_CATEGORIES) & (ev["stream"] < 0)]
    gpu = ev[ev["cat"].isin(GPU_OP_CATEGORIES)]
    parts, inner = [], []
    # gloo's sends and receives: their work spans the wait on the thread that issued them,
    # overlapping its next ops, so they queue apart, as other collectives' worker threads do;
    # sends and receives apart (a pipeline's batched send and receive run at once)
    p2p = cpu[is_p2p(cpu) & ~cpu["name"].astype(str).map(is_enqueue_call).to_numpy(bool)]
    cpu = cpu.drop(index=p2p.index)
    receives = p2p["name"].astype(str).str.contains("recv").to_numpy()
    for (tid, receive), queue in p2p.groupby([p2p["tid"], receives], sort=True):
        parts.append(queue.sort_values("start_ns").assign(kind="cpu", resource=f"cpu/{tid}/p2p{'/recv' if receive else ''}"))
    awaited = _awaited_ends(ev)
    for tid, thread in cpu.groupby("tid", sort=True):
        thread = thread.sort_values(["start_ns", "dur_ns"], ascending=[True, False])
        top = _top_level(thread)
        tops = _split_at_waits(thread[top].assign(resumed=False), thread[~top],
                               awaited.get(int(tid), np.empty(0, np.int64)))
        tops = tops.assign(kind="cpu", resource=f"cpu/{tid}")
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

NESTED_WAIT_NS = 20_000
"""How long an op must have sat without a nested call, up to when a transfer it issued ended,
for :func:`_split_at_waits` to cut it there."""
AWAITED_FAMILIES = frozenset({"recv", "all_gather"})
"""Collectives whose result the issuing thread takes at once, inside one of its ops: a pipeline
stage's receive, FSDP's all-gather before a unit's forward and backward."""


FSDP_REDUCE_PREFIX = "FSDP::post_backward_reduce"
"""FSDP's reduce-scatter of a unit's gradients: issued and, on gloo, waited for inside this range."""
WAIT_CALLS = frozenset({"_c10d_functional::wait_tensor"})
"""Nested calls that are a wait, not work (:func:`_split_at_waits` looks past them)."""
FUNCTIONAL_PREFIX = "_c10d_functional::"
"""Functional collectives (DTensor's: tensor parallel's all-reduces): issued inside such a call,
waited for (``wait_tensor``) by the issuing thread inside the op that first uses the result."""


def _awaited_ends(ev: pd.DataFrame) -> dict[int, np.ndarray]:
    """Per thread, when the step's instances of :data:`AWAITED_FAMILIES` it issued ended, sorted,
    of the reduce-scatters (all-reduces, on gloo) FSDP issued in its post-backward reduce, and
    of the functional collectives (:data:`FUNCTIONAL_PREFIX`); only those the collective log
    labelled (it pairs each with its enqueue call)."""
    if "logged" not in ev:
        return {}
    logged = ev[ev["logged"].to_numpy(bool) & ev["coll_name"].notna().to_numpy()]
    is_call = logged["name"].astype(str).str.startswith("c10d::").to_numpy()
    calls, work = logged[is_call], logged[~is_call]
    family = calls["coll_name"].astype(str).map(collective_family)
    names = ev["name"].astype(str)
    reduces = ev[names.str.startswith(FSDP_REDUCE_PREFIX)]
    calls = calls[family.isin(AWAITED_FAMILIES).to_numpy()
                  | (family.isin(GRADIENT_FAMILIES).to_numpy() & _inside(calls, reduces))
                  | _inside(calls, ev[names.str.startswith(FUNCTIONAL_PREFIX)])]
    issuer = dict(zip(zip(calls["pg_name"].astype(str), calls["seq"]), calls["tid"]))
    ends: dict[int, list[int]] = {}
    for g, q, start, dur in zip(work["pg_name"].astype(str), work["seq"], work["start_ns"], work["dur_ns"]):
        tid = issuer.get((g, q))
        if tid is not None:
            ends.setdefault(int(tid), []).append(int(start + dur))
    return {tid: np.sort(np.array(e, np.int64)) for tid, e in ends.items()}


def _inside(events: pd.DataFrame, ranges: pd.DataFrame) -> np.ndarray:
    """Mask of ``events`` whose start lies inside one of ``ranges`` on the same thread."""
    out = np.zeros(len(events), bool)
    if ranges.empty:
        return out
    for tid, spans in ranges.groupby("tid"):
        mine = (events["tid"] == tid).to_numpy()
        start = events["start_ns"].to_numpy()[mine]
        a = spans["start_ns"].to_numpy()
        b = a + spans["dur_ns"].to_numpy()
        i = np.searchsorted(np.sort(a), start, "right") - 1
        order = np.argsort(a)
        out[np.flatnonzero(mine)] = (i >= 0) & (start <= b[order][np.maximum(i, 0)])
    return out


def _split_at_waits(tops: pd.DataFrame, nested: pd.DataFrame, awaited: np.ndarray) -> pd.DataFrame:
    """A thread's top-level ops cut where they sat waiting for a transfer they issued (``awaited``:
    its ends, :func:`_awaited_ends`; ``tops`` with a ``resumed`` column, False):
    an op with no nested call running for :data:`NESTED_WAIT_NS` up to the transfer's end
    becomes its head (to the last call before the wait) and its tail (from the first call
    after, of any depth: a call that works before its own nested calls begin, such as a custom
    op, resumed the op at its start), so that the wait is an edge of the graph, not compute.
    Where the op sat in a :data:`WAIT_CALLS` call over the transfer's end (a functional
    collective's ``wait_tensor``: a wait, not work), it may have waited from its start (no head)
    or to its end (an empty tail). Both pieces keep the op's name; a tail is ``resumed``: the
    first op of its thread after the transfers that ended while it waited, it is their waiter
    (:func:`_rank_edges`)."""
    if not len(awaited) or tops.empty:
        return tops
    is_wait = nested["name"].astype(str).isin(WAIT_CALLS).to_numpy()
    w_start = nested["start_ns"].to_numpy(np.int64)[is_wait]
    w_end = w_start + nested["dur_ns"].to_numpy(np.int64)[is_wait]
    nested = nested[~is_wait]
    n_start = nested["start_ns"].to_numpy(np.int64)
    n_end = (nested["start_ns"] + nested["dur_ns"]).to_numpy(np.int64)
    order = np.argsort(n_start, kind="stable")
    n_start, n_end = n_start[order], n_end[order]
    starts = n_start  # a call of any depth begun after the transfer ended: the op resumed there
    leaf = np.r_[n_start[1:] >= n_end[:-1], True] if len(order) else np.empty(0, bool)
    # the innermost calls end its work before the wait: a range that spans the wait (FSDP's
    # all-gather) is no sign of work
    n_start, n_end = n_start[leaf], n_end[leaf]
    n_end = np.maximum.accumulate(n_end) if len(n_end) else n_end
    rows, changed = [], False
    for _, op in tops.iterrows():
        start, end = int(op["start_ns"]), int(op["start_ns"] + op["dur_ns"])
        cuts: list[tuple[int, int]] = []
        for done in awaited[(awaited > start) & (awaited < end)]:
            i = int(np.searchsorted(n_start, done, "left"))  # the first innermost call after the transfer ended
            since = cuts[-1][1] if cuts else start
            before = i > 0 and n_start[i - 1] >= since  # a call of this op's (piece's) before the wait
            k = int(np.searchsorted(starts, done, "left"))  # the first call of any depth after it
            after = k < len(starts) and starts[k] < end
            waited = bool(((w_start <= done) & (w_end >= done) & (w_start >= start) & (w_end <= end)).any())
            if not (before and after) and not waited:
                continue
            idle_from = int(n_end[i - 1]) if before else since
            if idle_from <= done and done - idle_from >= NESTED_WAIT_NS:
                cuts.append((idle_from, int(starts[k]) if after else end))
        piece_start = start
        for idle_from, resume in cuts:
            if idle_from > piece_start:
                rows.append(_piece(op, piece_start, idle_from, False))
            piece_start = resume
        rows.append(_piece(op, piece_start, end, True) if cuts else op)
        changed |= bool(cuts)
    return pd.DataFrame(rows).astype(tops.dtypes.to_dict()) if changed else tops


def _piece(op: pd.Series, start: int, end: int, resumed: bool) -> pd.Series:
    piece = op.copy()
    piece["start_ns"], piece["dur_ns"], piece["resumed"] = start, end - start, resumed
    return piece


def _signature(nodes: pd.DataFrame) -> tuple:
    """A step's structure: its nodes' queues and names, and which of the step's collectives (by
    their group's sequence numbers, where the collective log gave them) each worker thread ran:
    steps whose worker threads took the collectives in another order are not averaged together."""
    which = np.full(len(nodes), -1, np.int64)
    if "logged" in nodes:
        logged = nodes["logged"].to_numpy(bool) & nodes["coll_name"].notna().to_numpy()
        if logged.any():
            seq = nodes["seq"].to_numpy(np.int64)
            sends = seq < -1  # a send's seq is its log index, negated: numbered apart from the collectives
            keys = nodes["pg_name"].astype(object).fillna("").astype(str).to_numpy() + np.where(sends, "/p2p", "")
            first = pd.Series(np.where(logged, seq, np.iinfo(np.int64).max)).groupby(keys).transform("min")
            which = np.where(logged, np.abs(seq - first.to_numpy()), -1)
    return tuple(zip(nodes["resource"], nodes["name"].astype(str), which.tolist()))


def typical_step(tables: TraceTables, rank: int, steps: list[int], instances: pd.DataFrame) -> RankStep:
    """One rank's typical step over ``steps``: medians over the steps that share a structure.

    ``instances``: the rank's collective instances (:func:`dpro.graph.matching.rank_instances`),
    which give the template's collectives their sizes.
    """
    per_step = []
    windows = tables.steps.set_index("step")
    kernels = has_collective_kernels(tables.events)
    for s in steps:
        ev = tables.events[tables.events["step"] == s]
        nodes, inner = _step_nodes(ev, int(windows.loc[s, "start_ns"]), int(windows.loc[s, "end_ns"]))
        per_step.append((s, nodes, inner))
    signatures = [_signature(n) for _, n, _ in per_step]
    # the most common structure; ties: the fuller step, then the one whose steps took the
    # median time the closest (where no structure repeats, as where gloo's worker threads take
    # the collectives in turn, one step stands for all: of those as full, not one the machine
    # slowed), then the earlier (never the set's hash order)
    took = {s: float(windows.loc[s, "end_ns"] - windows.loc[s, "start_ns"]) for s in steps}
    typical = float(np.median(list(took.values())))

    def distance(sig: tuple) -> int:  # in µs: two steps as far from their median are a tie, not float noise
        return round(abs(float(np.median([took[s] for (s, _, _), g in zip(per_step, signatures) if g == sig]))
                         - typical) / 1e3)

    common = min(dict.fromkeys(signatures), key=lambda sig: (-signatures.count(sig), -len(sig), distance(sig)))
    chosen = [(s, n, i) for (s, n, i), sig in zip(per_step, signatures) if sig == common]
    template_step, template, inner = chosen[0]
    template["measured_end_ns"] = template["start_ns"] + template["dur_ns"]  # in the template's own step
    for column in ("dur_ns", "offset_ns"):  # medians: a step slowed by the machine's noise moves none
        template[column] = np.median(np.stack([n[column].to_numpy() for _, n, _ in chosen]), axis=0)
    step_durations = [windows.loc[s, "end_ns"] - windows.loc[s, "start_ns"] for s, _, _ in chosen]
    step_ns = float(np.median(step_durations))
    _mark_instances(template, kernels, instances[instances["step"] == template_step])
    template["events"] = _events_inside(template, inner)
    template["hooks"] = _hooks_inside(template, inner)
    template["resumed"] = template["resumed"].eq(True) if "resumed" in template else False
    edges = _rank_edges(template, inner, kernels)
    # Where the typical step starts: the mean over every step used by any rank, so that the
    # ranks' starts compare even when each rank's typical steps are a different subset.
    starts = windows.loc[steps, "start_ns"].to_numpy(np.int64)
    return RankStep(rank, template[NODE_COLUMNS].reset_index(drop=True),
                    pd.DataFrame(edges, columns=["src", "dst", "lag_ns", "kind"]).astype({"lag_ns": "int64"}), step_ns,
                    start_ns=int(starts[0] + np.mean(starts - starts[0])), steps=list(steps),
                    wrap_gaps=_wrap_gaps(per_step, template, windows.loc[template_step, "end_ns"] - windows.loc[
                        template_step, "start_ns"]))


def _events_inside(nodes: pd.DataFrame, inner: pd.DataFrame) -> np.ndarray:
    """Per node, the profiler events it spans on the CPU: itself and the calls nested in it (each
    paid the profiler's per-event cost inside the node's measured time); 0 on a GPU."""
    nested = inner.loc[inner["key"].isna(), "parent_key"].value_counts()  # top-level calls carry their own key
    return np.where(nodes["kind"] == "cpu", 1 + nodes["key"].map(nested).fillna(0).to_numpy(np.int64), 0)


def _hooks_inside(nodes: pd.DataFrame, inner: pd.DataFrame) -> list[str]:
    """Per node, the names of the :data:`HOOK_PATTERN` events it is or holds, in order,
    ``;``-joined (``""`` for none)."""
    def hooks(names: pd.Series) -> pd.Series:
        return names.astype(str)[names.astype(str).str.match(HOOK_PATTERN)]

    nested = inner[inner["key"].isna()] if "key" in inner else inner
    found = hooks(nested["name"]).groupby(nested.loc[hooks(nested["name"]).index, "parent_key"]).agg(list)
    own = hooks(nodes["name"])
    out = []
    for i, key in zip(nodes.index, nodes["key"]):
        names = ([str(nodes.at[i, "name"])] if i in own.index else []) + list(found.get(key, []))
        out.append(";".join(names))
    return out


def _wrap_gaps(per_step: list[tuple[int, pd.DataFrame, pd.DataFrame]], template: pd.DataFrame,
               template_step_ns: float) -> dict[str, float]:
    """Per queue (thread or stream), the time from its last op in one step to its first op in
    the next, measured across consecutive profiled steps (the median over the pairs): data
    loading, Python and the optimizer's tail between steps, never the step's period. With a
    single profiled step, what the template leaves before its first and after its last op."""
    gaps: dict[str, list[float]] = {}
    for (s0, n0, _), (s1, n1, _) in zip(per_step, per_step[1:]):
        if s1 != s0 + 1:
            continue
        ends = (n0["start_ns"] + n0["dur_ns"]).groupby(n0["resource"]).max()
        starts = n1["start_ns"].groupby(n1["resource"]).min()
        for resource in ends.index.intersection(starts.index):
            gaps.setdefault(resource, []).append(float(starts[resource] - ends[resource]))
    if gaps:
        return {r: float(np.median(g)) for r, g in gaps.items()}
    ends = (template["offset_ns"] + template["dur_ns"]).groupby(template["resource"]).max()
    return {r: float(template_step_ns - end + template.loc[template["resource"] == r, "offset_ns"].min())
            for r, end in ends.items()}


def _mark_instances(nodes: pd.DataFrame, kernels: bool, instances: pd.DataFrame) -> None:
    """Number the template's collective instances (``occurrence``, by order of issue per process
    group, collective and peer: their sequence numbers where the collective log gave them; -1 for
    other nodes) and give them their bytes (NaN if unknown)."""
    nodes["pg_name"] = nodes["pg_name"].astype(object).fillna("").astype(str)
    nodes["peer"] = nodes["peer"].fillna(-1).astype(np.int64)
    mask = does_work(nodes, kernels)
    nodes["occurrence"] = -1
    work = nodes[mask]
    if len(work) and work["logged"].to_numpy(bool).all():  # the log's sequence numbers are the groups' own order
        seq = work["seq"].to_numpy(np.int64)
        work = work.assign(issued=np.where(seq >= 0, seq, -(seq + 2)))
    else:  # the order of issue: by start (the median over the steps)
        work = work.assign(issued=work["offset_ns"])
    nodes.loc[mask, "occurrence"] = number(work, ["pg_name", "coll_name", "peer"], "issued").to_numpy()
    nodes["nbytes"] = nodes["event"].map(instances.set_index("event")["nbytes"]).where(mask).astype("float64")

def _rank_edges(nodes: pd.DataFrame, inner: pd.DataFrame, kernels: bool) -> list[tuple[int, int, int, str]]:
    """Edges within one rank: program order, launches, syncs, collective enqueues and waits
    (collective kernels are launched like any kernel, and waited for through syncs)."""
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
    instances = _issue_order(nodes[nodes["occurrence"] >= 0]) if not kernels else nodes.iloc[:0].assign(issue=0)
    enqueued = _enqueue_ops(inner)
    issued = dict(zip(enqueued["issue"], (row for _, row in enqueued.iterrows())))
    comm_threads = set(instances["resource"])  # their order already sequences the collectives
    names = nodes["name"].astype(str)
    optimizer_steps = nodes.index[(nodes["kind"] == "cpu") & names.str.startswith("Optimizer.step#")
                                  & ~nodes["resource"].isin(comm_threads)].to_numpy()
    optimizer_steps = optimizer_steps[np.argsort(start[optimizer_steps])]
    cpu_threads = [g for resource, g in nodes[nodes["kind"] == "cpu"].groupby("resource", sort=False)
                   if resource not in comm_threads]
    # an op cut at a wait (:func:`_split_at_waits`) resumed after the transfers that ended then
    resumed = nodes["resumed"].eq(True).to_numpy() if "resumed" in nodes else np.zeros(len(nodes), bool)
    for i, name, k in zip(instances.index, instances["coll_name"], instances["issue"]):
        call = issued.get(k)
        if call is not None:
            parent = index.get(call["parent_key"])
            if parent is not None:
                # a call that returns only once its collective is done (FSDP's all-gathers and
                # reduce-scatters over gloo) had enqueued it by the time the comm thread began it
                enqueued_by = min(int(call["start_ns"] + call["dur_ns"]), int(measured_start[i]))
                edges.append((parent, i, lag_after_parent(parent, enqueued_by), "enqueue"))
        for thread in cpu_threads:
            # judged within the template's own step: medians taken op by op need not keep
            # a waiter after the end of the collective it woke up for
            waiter = _resumed_after(thread, measured_end[i], resumed, measured_start, measured_end)
            if waiter is None:
                waiter = _waiter(thread, measured_start[i], measured_end[i], measured_start, measured_end)
            if waiter is not None and waiter != i:
                edges.append((i, waiter, int(measured_start[waiter] - measured_end[i]), "wait"))
        # The optimizer updates with the reduced gradients: DDP waits for every bucket before
        # it, often inside another op, where no idle time shows the wait.
        gradients = collective_family(str(name)) in GRADIENT_FAMILIES
        for step_op in optimizer_steps[start[optimizer_steps] > start[i]][:1] if gradients else []:
            edges.append((i, int(step_op), max(0, int(start[step_op] - end[i])), "wait"))
    _wake_after_the_last(edges)
    edges += _hand_offs(nodes, order, start, end, comm_threads)
    _trim_idle_gaps(order, edges, start, end)
    return edges + [tuple(e) for e in order.values()]


def _wake_after_the_last(edges: list[tuple[int, int, int, str]]) -> None:
    """An op that waited for several collectives resumed after the last of them: every wait
    edge into it keeps the lag from that last end (the wake-up latency), the smallest of their
    lags. An earlier collective's lag was the slack until the last one ended; kept, it would bind
    wherever the replay ends that collective later relative to the others (another rank's
    timing, a what-if), holding the op back by time it never waited (GPipe's wait for its
    forward sends before the first backward). A negative lag (a waiter seen to start before
    the collective's range closed, see :data:`WAKE_SLACK_NS`) is that collective's own: the
    others are cut to no less than 0, never raised."""
    latest: dict[int, int] = {}
    for _, dst, lag, kind in edges:
        if kind == "wait":
            latest[dst] = min(latest.get(dst, lag), lag)
    edges[:] = [(src, dst, min(lag, max(latest[dst], 0)) if kind == "wait" else lag, kind)
                for src, dst, lag, kind in edges]


def _hand_offs(nodes: pd.DataFrame, order: dict[int, list], start: np.ndarray, end: np.ndarray,
               comm_threads: set[str]) -> list[tuple[int, int, int, str]]:
    """Backward passes run on autograd's device thread: on a GPU the engine runs them on a
    thread of its own while the thread that called ``backward()`` sits in the call. Each pass
    (the device thread's ops between two of the caller's) gets an edge from the caller's op
    before it to the pass's first op (``call``) and from the pass's last op to the caller's op
    after it (``return``); the caller's order edge across the pass keeps no lag (its measured
    gap was the pass). An op of the caller's that spans the pass (a ``record_function`` around
    ``backward()``, GPipe's ``Backward i``) stays as recorded: the edges go to the ops on either
    side of it. The caller is the busiest other CPU thread. On a rank with no GPU op the engine
    runs the pass on the calling thread, and there is nothing to join."""
    if not (nodes["kind"] == "gpu").any():
        return []
    cpu = nodes[(nodes["kind"] == "cpu").to_numpy() & ~nodes["resource"].isin(comm_threads).to_numpy()
                & ~nodes["resource"].astype(str).str.contains("/p2p").to_numpy()]
    threads = {r: g.index.to_numpy() for r, g in cpu.groupby("resource", sort=False)}
    if len(threads) < 2:
        return []
    names = nodes["name"].astype(str).to_numpy()
    devices = [r for r, ids in threads.items() if names[ids[np.argmin(start[ids])]].startswith(BACKWARD_EVENT_PREFIX)]
    caller = max((r for r in threads if r not in devices), key=lambda r: len(threads[r]), default=None)
    if caller is None:
        return []
    edges: list[tuple[int, int, int, str]] = []
    for device in devices:
        ops = threads[device][np.argsort(start[threads[device]], kind="stable")]
        calls = threads[caller][np.argsort(start[threads[caller]], kind="stable")]
        after = np.searchsorted(start[calls], start[ops], "right")  # the caller's first op after each
        ends = end[calls]  # top-level ops of one thread: their ends are in order too
        for k in np.unique(after):
            burst = ops[after == k]
            first, last = burst[0], burst[np.argmax(end[burst])]
            before = int(np.searchsorted(ends, start[first], "right")) - 1  # the last op ended before the pass
            resume = k + int(np.searchsorted(start[calls[k:]], end[last], "left"))  # the first begun after it
            if before >= 0:
                edges.append((int(calls[before]), int(first), int(start[first] - ends[before]), "call"))
            if resume < len(calls):
                edges.append((int(last), int(calls[resume]), int(start[calls[resume]] - end[last]), "return"))
                if before >= 0 and order.get(int(calls[resume]), [None])[0] == calls[before]:
                    order[int(calls[resume])][2] = 0
    return edges


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


WAKE_SLACK_NS = 20_000_000
"""How long before a collective's recorded end its waiter may start: the communication thread
closes the collective's profiler range after it woke the waiter, and on busy cores it may be
descheduled in between (by 7 ms on two shared cores)."""
MIN_WAIT_NS = 1_000_000  # an idle gap shorter than this, ending before the end, is no sign of waiting


def _resumed_after(thread: pd.DataFrame, done: float, resumed: np.ndarray, start: np.ndarray,
                   end: np.ndarray) -> int | None:
    """The piece of ``thread`` that resumed after a wait (:func:`_split_at_waits`) during which a
    collective ended at ``done``: the first op to start after it, if cut so, with the op before
    it ended by then; else None."""
    ids = thread.index.to_numpy()
    k = int(np.searchsorted(start[ids], done, "left"))
    if k < len(ids) and resumed[ids[k]] and (k == 0 or end[ids[k - 1]] <= done):
        return int(ids[k])
    return None


def _waiter(thread: pd.DataFrame, began: float, done: float, start: np.ndarray, end: np.ndarray) -> int | None:
    """The op of ``thread`` that waited for a collective that ran from ``began`` to ``done``.

    The first op to start after its end, if the thread was idle then; or, where the thread woke
    before the recorded end (up to :data:`WAKE_SLACK_NS`, never before the collective began),
    the op after the longest idle gap of the thread that ended in that window, if it lasted
    :data:`MIN_WAIT_NS`. (A thread busy throughout shows no sign of needing the result; a wait
    nested inside a top-level op is part of its duration.)"""
    ids = thread.index.to_numpy()
    first, after = np.searchsorted(start[ids], [max(done - WAKE_SLACK_NS, began), done], "left")
    gaps = start[ids[first:after]] - np.r_[end[ids[first - 1]] if first > 0 else -np.inf, end[ids[first:after - 1]]] \
        if after > first else np.empty(0)
    if len(gaps) and gaps.max() >= MIN_WAIT_NS:
        return int(ids[first + int(np.argmax(gaps))])
    if after >= len(ids) or (after > 0 and end[ids[after - 1]] > done):
        return None
    return int(ids[after])

def _issue_order(instances: pd.DataFrame) -> pd.DataFrame:
    """The rank's CPU-side collective instances, each with ``issue``, what its enqueue call has
    too: its group and sequence number where the collective log gave them, else its order of
    issue among the rank's collectives of the same name."""
    return instances.assign(issue=_issue_keys(instances, number(instances, ["coll_name"], "offset_ns")))


def _enqueue_ops(inner: pd.DataFrame) -> pd.DataFrame:
    """``c10d::*`` calls that issue collectives, keyed like :func:`_issue_order`."""
    issued = inner[inner["name"].astype(str).str.startswith("c10d::") & inner["coll_name"].notna()]
    return issued.assign(issue=_issue_keys(issued, number(issued, ["coll_name"])))


def _issue_keys(frame: pd.DataFrame, order: pd.Series) -> list:
    """``(group, sequence number)`` where the collective log gave them, else ``(collective, order
    of issue)``."""
    seq = np.where(frame["logged"].to_numpy(bool), frame["seq"].to_numpy(np.int64), -1) if "logged" in frame \
        else np.full(len(frame), -1, np.int64)
    groups = frame["pg_name"].astype(object).fillna("").astype(str).to_numpy()
    names = frame["coll_name"].astype(str).to_numpy()
    return [("seq", g, int(q)) if q != -1 else ("order", n, int(k))
            for g, q, n, k in zip(groups, seq, names, order.to_numpy())]
