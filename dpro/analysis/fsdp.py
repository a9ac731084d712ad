"""FSDP2's settings as graph edits (``dpro whatif --[no-]reshard-after-forward``,
``--forward-prefetch``, ``--merge-units``).

A unit's place in the graph is read from the FSDP ranges its ops ran (the graph's ``hooks``:
``FSDP::pre_forward (unit)``, ``FSDP::pre_backward (unit)``, ``FSDP::backward_prefetch for
unit``, ``FSDP::post_backward_reduce (unit)``), and its collectives from the ranges they were
issued in (``FSDP::all_gather (unit)``; its reduce-scatter, the op's post-backward reduce).

- ``reshard_after_forward`` off: the all-gathers a rank issues after its first backward op send
  nothing; on: each unit's forward all-gather is copied, issued where its backward prefetch runs
  and needed by the op that runs its pre-backward hook (on gloo, by the op after the one that
  issued it: FSDP2 waits for it there).
- ``forward prefetch K`` (FSDP2's ``set_modules_to_forward_prefetch``, each unit the next K):
  each unit's forward all-gather is issued at the end of the pre-forward hook of the unit K
  before it (the first unit prefetches the first K). FSDP2 unshards with ``async_op=False``
  unless told otherwise, so on gloo the prefetching thread waits for each gather it issues: the
  gathers a unit prefetches run one after the other, and the unit's own ops wait for them.
- ``merge units G``: every ``G`` consecutive units but the root as one (``fully_shard([...])``):
  one call of each kind for the group, of the group's bytes; the other units' calls not made.
- ``mesh R×S`` (FSDP2 over a ``(replicate, shard)`` device mesh of the same ranks: HSDP, or
  ``1×N`` sharded over all): each unit's all-gathers and reduce-scatter over the ``S``
  consecutive ranks of a shard group, of the same unsharded bytes; after each reduce-scatter,
  the all-reduce of its ``1/S`` shard over the ``R`` ranks holding the same shard (added where
  the job had none, on gloo: FSDP2 waits for it there, in the unit's post-backward reduce;
  dropped where the new mesh has one replica). Each call over the links its new group crosses:
  where the run measured none of that class, its recorded class's model with its time per
  byte re-timed at the class's calibrated rate. The ops around the calls keep their time (FSDP's
  copies in and out of the buffers, whose bytes the shard size changes: an error toward the
  recorded mesh).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from dpro.graph.dataflow import DataflowGraph
from dpro.graph.vocabulary import collective_family
from dpro.run_format import BACKWARD_EVENT_PREFIX
from dpro.replayer.linkmodel import wire_rates
from dpro.replayer.graph_edits import WhatIf, WhatIfError

from dpro.analysis.mesh_groups import regroup_over, runs, strides
from dpro.analysis.run import RunAnalysis

__all__ = ["forward_prefetch", "merge_units", "mesh", "parse_mesh", "recorded_mesh", "reshard"]

HOOKS = (("FSDP::pre_forward", "forward"), ("FSDP::pre_backward", "backward"),
         ("FSDP::backward_prefetch for ", "prefetch"))
"""Of the graph's FSDP ranges (:data:`dpro.graph.typical.HOOK_PATTERN`), those that say where a
unit is needed and prefetched (torch 2.13's names), and what each marks."""
GATHER = re.compile(r"FSDP::all_gather(?: \((.*)\))?")  # a unit's all-gather (the root's names no unit)
REDUCE = "FSDP::post_backward_reduce"
REPLICAS = "hsdp replicas"  # the group label of an all-reduce over a shard's replicas that the what-if added

Gather = tuple[str, int]  # a collective's name and occurrence


def reshard(w: WhatIf, analysis: RunAnalysis, value: bool) -> dict[str, Any]:
    """FSDP2's ``reshard_after_forward`` for every unit. Kept unsharded after the forward pass,
    a unit needs no all-gather before its backward: the all-gathers a rank issues after its
    first backward op send nothing (each keeps its call's fixed cost; the copy out of the
    gathered buffer, inside the unit's ops, stays too: the gain errs low)."""
    if analysis.parallelism.fsdp and value == analysis.parallelism.fsdp_reshard:
        return {"backward_all_gathers": 0, "note": "as recorded"}
    groups = _shard_groups(analysis, "--reshard-after-forward")
    if value:
        added = _regather_in_backward(w, groups)
        if not added:
            raise WhatIfError("no FSDP unit's forward all-gather and pre-backward hook were found in this run's graph")
        return {"backward_all_gathers": added}
    gone = _backward_all_gathers(w.graph, groups)
    for coll, k in gone:
        w.set_collective_bytes(coll, k, 0.0)
    return {"backward_all_gathers": len(gone)}


def forward_prefetch(w: WhatIf, analysis: RunAnalysis, depth: int) -> dict[str, Any]:
    """Each unit's forward all-gather issued by the unit ``depth`` before it (see the module
    docstring); how many moved. Modelled from FSDP2's default (no forward prefetch) and where
    each gather is waited right after the op that issued it (``async_op=False`` on gloo)."""
    groups = _shard_groups(analysis, "--forward-prefetch")
    recorded = analysis.parallelism.fsdp_forward_prefetch
    if recorded:
        raise WhatIfError(f"--forward-prefetch is modelled from FSDP2's default (no forward prefetch); this job's "
                          f"units prefetch {recorded} ahead")
    if depth == 0:
        return {"forward_prefetch": 0, "moved_all_gathers": 0, "note": "as recorded"}
    moved = 0
    for group in sorted(groups):  # HSDP: each shard group's gathers, over its own ranks
        moved += _prefetch_group(w, _forward_gathers(w, _calls_by_unit(w, {group})["forward"]), depth)
    return {"forward_prefetch": depth, "moved_all_gathers": moved}


def _prefetch_group(w: WhatIf, units: list[tuple[str, Gather, dict[int, int]]], depth: int) -> int:
    """:func:`forward_prefetch` of one shard group's units (:func:`_forward_gathers`); how many moved."""
    if len(units) < 2:
        raise WhatIfError("no two FSDP units' forward all-gathers were found in this run's graph")
    after, waiter = _next_on_queue(w), {}
    for unit, gather, by_rank in units:
        waiter[unit] = _waited_by(w, gather)
        if not _synchronous(w, gather, waiter[unit], by_rank, after):
            raise WhatIfError(f"unit {unit or 'root'!r}'s forward all-gather is not waited right after it is issued "
                              "(FSDP2's async unshard, or a GPU's streams): --forward-prefetch is not modelled for it")
    moved = 0
    for j, (unit, _, _) in enumerate(units):
        prefetched = [units[i] for i in range(1, len(units)) if max(0, i - depth) == j]
        issuers = dict(waiter[unit])  # the end of the unit's own pre-forward hook, per rank
        for _, gather, _ in prefetched:
            if not w.reissue(*gather, issuers):
                raise WhatIfError(f"the all-gather {gather[0]}#{gather[1]} could not be issued elsewhere")
            done = _done_by_rank(w, gather)
            w.add_waits({r: done[r] for r in issuers}, {r: after[v] for r, v in waiter[unit].items()})
            issuers = done  # synchronous: the next gather starts when this one is done
            moved += 1
    return moved


def merge_units(w: WhatIf, analysis: RunAnalysis, size: int) -> dict[str, Any]:
    """Every ``size`` consecutive units (in forward order, the root apart) wrapped as one
    (``fully_shard([block_i, block_i+1, ...])``): one all-gather for the group where its first
    unit gathered, one before its backward where its first unit in the backward pass gathered
    (resharded after forward), one reduce-scatter where its last did; each of the size of the
    group's (as changed so far). The other units' calls are not made
    (:meth:`~dpro.replayer.graph_edits.WhatIf.drop_collective`); their copies in and out of the
    gathered buffer stay where they were (in FSDP they are the group's, taking as long for the
    same bytes)."""
    groups = _shard_groups(analysis, "--merge-units")
    if len(groups) > 1:
        raise WhatIfError(f"--merge-units is modelled for FSDP over one shard group; this job has {len(groups)} "
                          "(HSDP: the replicas' all-reduces would merge too, which is not modelled)")
    by_unit = _calls_by_unit(w, groups)
    order = [unit for unit, _, _ in _forward_gathers(w, by_unit["forward"]) if unit]  # the root apart
    if len(order) < 2:
        raise WhatIfError("--merge-units needs two or more FSDP units besides the root; this job has "
                          f"{len(order)}")
    groups = [order[i:i + size] for i in range(0, len(order), size)]
    dropped: list[str] = []
    resized: list[dict[str, Any]] = []
    for kind, pick in (("forward", 0), ("regather", -1), ("reduce", 0)):
        found = by_unit.get(kind, {})
        for group in groups:
            calls = [found[u] for u in group if u in found]
            if len(group) < 2 or not calls:
                continue
            if len(calls) != len(group):
                raise WhatIfError(f"the FSDP units {', '.join(group)} do not all show their {kind} collective "
                                  "in this run's graph")
            kept = calls[pick]
            nbytes = sum(w.collective_bytes(*c) for c in calls)
            w.set_collective_bytes(*kept, nbytes)
            resized.append({"collective": f"{kept[0]}#{kept[1]}", "kind": kind, "units": group, "bytes": nbytes})
            for call in calls:
                if call != kept:
                    w.drop_collective(*call)
                    dropped.append(f"{call[0]}#{call[1]}")
    return {"merge_units": size, "units": len(order), "groups": len(groups), "calls_dropped": len(dropped),
            "dropped": dropped, "resized": resized}


def parse_mesh(text: str) -> tuple[int, int]:
    """``"2x2"`` (or ``2×2``, ``"4"`` for ``1x4``) as ``(replicate, shard)``; a one-line error otherwise."""
    m = re.fullmatch(r"\s*([0-9]+)(?:\s*[x×]\s*([0-9]+))?\s*", text.lower(), re.ASCII)
    if not m or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < 1):
        raise WhatIfError(f"--fsdp-mesh takes REPLICATExSHARD (e.g. 2x2, 1x4), not {text!r}")
    return (1, int(m.group(1))) if m.group(2) is None else (int(m.group(1)), int(m.group(2)))


def recorded_mesh(analysis: RunAnalysis) -> tuple[int, int]:
    """The ``(replicate, shard)`` shape of the mesh the job's FSDP units ran on (``(1, N)`` for
    a 1-D mesh)."""
    shape = analysis.parallelism.fsdp_mesh_shape or (analysis.parallelism.world_size,)
    if len(shape) > 2:
        raise WhatIfError(f"--fsdp-mesh models FSDP on a 1-D or 2-D (replicate, shard) mesh; this job's is "
                          f"{'×'.join(map(str, shape))}")
    return (1, shape[0]) if len(shape) == 1 else (shape[0], shape[1])


def mesh(w: WhatIf, analysis: RunAnalysis, shape: str) -> dict[str, Any]:
    """FSDP2 over a ``(replicate, shard)`` mesh of the recorded ranks (see the module docstring);
    shard groups are runs of consecutive ranks, as ``init_device_mesh`` lays them out. Only
    FSDP's calls move: on the shard groups those issued in its all-gather and post-backward
    reduce ranges, and every call of the mesh's replicate groups (which FSDP2 alone uses)."""
    groups = _shard_groups(analysis, "--fsdp-mesh")
    replicate, shard = parse_mesh(shape)
    was = recorded_mesh(analysis)
    world = was[0] * was[1]
    if replicate * shard != world:
        raise WhatIfError(f"--fsdp-mesh {replicate}x{shard} has {replicate * shard} ranks; FSDP runs over {world} "
                          "here (the mesh changes its shape, not its size: --world-size changes that)")
    details: dict[str, Any] = {"fsdp_mesh": f"{replicate}x{shard}", "recorded": f"{was[0]}x{was[1]}"}
    if (replicate, shard) == was:
        return {**details, "note": "as recorded"}
    fsdp_calls, replicas = _fsdp_issued(w), _replicate_groups(analysis)
    calls = [(str(r.coll), int(r.occurrence), str(r.group)) for r in w.graph.collectives.itertuples()
             if (str(r.coll), int(r.occurrence)) not in w.dropped]
    sharded = [(c, k) for c, k, g in calls if g in groups and (c, k) in fsdp_calls]
    reduces = [(c, k) for c, k in sharded if collective_family(c) != "all_gather"]
    all_reduces = [(c, k) for c, k, g in calls if g in replicas]  # the replicate dimension's group: HSDP's only
    if not reduces or len(reduces) == len(sharded):
        raise WhatIfError("FSDP's all-gathers and reduce-scatters were not found in this run's graph (issued in its "
                          "FSDP::all_gather and post_backward_reduce ranges)")
    if was[0] > 1 and not all_reduces:
        raise WhatIfError("the HSDP replicas' all-reduces were not found in this run's graph")
    foreign = [c for c, _ in reduces if collective_family(c) != "all_reduce"]
    if was[0] == 1 and replicate > 1 and foreign:
        raise WhatIfError("adding HSDP's all-reduce is modelled on gloo (whose reduce-scatter is an all-reduce); "
                          f"this job's reduce-scatter is {foreign[0]}")
    added = 0
    if was[0] == 1 and replicate > 1:  # each shard all-reduced over its replicas once reduce-scattered
        for call in reduces:
            new = w.add_collective(*call, issuers=_done_by_rank(w, call), users=_waited_by(w, call),
                                   group=REPLICAS)
            w.set_collective_bytes(call[0], new, w.collective_bytes(*call) / shard)
            all_reduces.append((call[0], new))
            added += 1
    elif replicate == 1:
        for call in all_reduces:
            w.drop_collective(*call)
    else:
        for call in all_reduces:
            w.set_collective_bytes(*call, w.collective_bytes(*call) * was[1] / shard)
    wires = wire_rates(analysis.calibrations, analysis.hosts)
    old_shards = runs(world, was[1])
    old_replicas = strides(world, was[1]) if was[0] > 1 else old_shards  # an added one copies a reduce-scatter
    shard_link = regroup_over(w, sharded, shard, runs(world, shard), old_shards, wires)
    replica_link = (regroup_over(w, all_reduces, replicate, strides(world, shard), old_replicas, wires)
                    if replicate > 1 else None)
    return {**details, "shard_links": shard_link if shard > 1 else None,
            "replicate_links": replica_link, "all_reduces_added": added,
            "all_reduces_dropped": len(all_reduces) if replicate == 1 else 0}


def _fsdp_issued(w: WhatIf) -> set[Gather]:
    """The collectives issued inside FSDP's all-gather or post-backward reduce ranges (FSDP's own
    calls, not the script's: a loss's all-reduce, a barrier)."""
    nodes = w.graph.nodes
    if "hooks" not in nodes:
        return set()
    hooks = nodes["hooks"].astype(object).fillna("").astype(str).to_numpy()
    issuer_of = w.issuers()
    found = set()
    for _, c in w.graph.collectives.iterrows():
        issuers = [issuer_of.get(int(a)) for a in w._arrivals(c)]
        if any(v is not None and any(GATHER.fullmatch(n) or n.startswith(REDUCE) for n in hooks[v].split(";"))
               for v in issuers):
            found.add((str(c["coll"]), int(c["occurrence"])))
    return found


def _replicate_groups(analysis: RunAnalysis) -> set[str]:
    """The process groups of the replicate dimension of each rank's FSDP mesh (HSDP's), if any."""
    found = set()
    for meta in analysis.metas.values():
        units = [u for u in meta.parallel.fsdp if u.get("parameters")]
        shape = units[0].get("mesh_shape") if units else None
        for m in meta.parallel.meshes:
            if shape and len(shape) == 2 and list(m.get("shape") or []) == list(shape) and m.get("groups") \
                    and m["groups"][0] is not None:
                found.add(str(m["groups"][0]))
    return found


def _forward_gathers(w: WhatIf, gathers: dict[str, Gather]) -> list[tuple[str, Gather, dict[int, int]]]:
    """Each unit's forward all-gather still called (``gathers``: unit -> its forward all-gather,
    :func:`_calls_by_unit`), in forward order: ``(unit, gather, rank -> the first op that ran its
    pre-forward hook)``; the root unit is ``""``."""
    where = _hook_nodes(w)
    offsets = w.graph.nodes["offset_ns"].to_numpy()
    heads = sorted((min(offsets[list(by_rank.values())]), unit, by_rank)
                   for (kind, unit), by_rank in where.items() if kind == "forward")
    return [(unit, gathers[unit], by_rank) for _, unit, by_rank in heads
            if unit in gathers and gathers[unit] not in w.dropped]


def _calls_by_unit(w: WhatIf, groups: set[str]) -> dict[str, dict[str, Gather]]:
    """``{"forward": unit -> all-gather, "regather": unit -> all-gather, "reduce": unit ->
    reduce-scatter}``: each collective of the shard ``groups`` (HSDP's all-reduce over the
    replicas left out) by the op that issued it, the k-th of an op's all-gathers
    the unit of its k-th ``FSDP::all_gather (unit)`` range (forward where the op ran a
    pre-forward hook), the k-th of its other collectives that of its k-th post-backward reduce
    (gloo reduces with an all-reduce). An op whose ranges and calls do not pair up is left out."""
    nodes = w.graph.nodes
    found: dict[str, dict[str, Gather]] = {"forward": {}, "regather": {}, "reduce": {}}
    if "hooks" not in nodes:
        return found
    hooks = nodes["hooks"].astype(object).fillna("").astype(str)
    issuer_of = w.issuers()
    offsets = nodes["offset_ns"].to_numpy()
    issued: dict[int, list[tuple[float, bool, Gather]]] = {}  # op -> (when, an all-gather, which)
    for row in w.graph.collectives.itertuples():
        if str(row.group) not in groups:
            continue
        gather = collective_family(str(row.coll)) == "all_gather"
        for arrival in w._arrivals(w.graph.collectives.loc[row.Index]):
            if int(arrival) in issuer_of:
                issued.setdefault(issuer_of[int(arrival)], []).append(
                    (float(offsets[arrival]), gather, (str(row.coll), int(row.occurrence))))
    for op, calls in issued.items():
        names = [n for n in hooks.iat[op].split(";") if n]
        calls.sort()
        gathered = [m.group(1) or "" for n in names if (m := GATHER.fullmatch(n))]
        reduced = [_unit_of(n, REDUCE) for n in names if n.startswith(REDUCE)]
        kind = "forward" if any(n.startswith("FSDP::pre_forward") for n in names) else "regather"
        for is_gather, units in ((True, gathered), (False, reduced)):
            mine = [c for _, g, c in calls if g == is_gather]
            if mine and len(mine) == len(units):
                for call, unit in zip(mine, units):
                    found[kind if is_gather else "reduce"].setdefault(unit, call)
    return found


def _shard_groups(analysis: RunAnalysis, flag: str) -> set[str]:
    """The process groups the job's FSDP units shard over, one per rank (several with HSDP,
    each over its ranks); a one-line error where a rank's units shard over more than one."""
    parallelism = analysis.parallelism
    if not parallelism.fsdp:
        raise WhatIfError(f"{flag} applies to FSDP jobs; this job has no fully_shard unit")
    if parallelism.tensor_parallel or parallelism.pipeline is not None:
        raise WhatIfError(f"{flag} is modelled for FSDP alone (its own 1-D or replicate x shard mesh); this job is "
                          f"{parallelism.describe()}")
    found: set[str] = set()
    for rank, meta in sorted(analysis.metas.items()):
        groups = {str(u.get("shard_group")) for u in meta.parallel.fsdp if u.get("parameters")}
        if len(groups) > 1:
            raise WhatIfError(f"{flag} is modelled for FSDP over one process group per rank; rank {rank}'s units "
                              f"shard over {len(groups)} ({', '.join(sorted(groups))})")
        found |= groups
    return found


def _hook_nodes(w: WhatIf) -> dict[tuple[str, str], dict[int, int]]:
    """``(kind, unit) -> rank -> node``: the first op of each rank that ran each FSDP hook
    (:data:`HOOKS`; the root unit is ``""``)."""
    nodes = w.graph.nodes
    hooks = nodes["hooks"].astype(object).fillna("").astype(str).str.split(";") if "hooks" in nodes else None
    if hooks is None or not hooks.map(lambda names: any(names)).any():
        raise WhatIfError("this run's graph holds no FSDP pre-forward or pre-backward hook (torch's FSDP::* ranges)")
    where: dict[tuple[str, str], dict[int, int]] = {}
    rank = nodes["rank"].to_numpy()
    for v in np.argsort(nodes["offset_ns"].to_numpy(), kind="stable"):
        for hook in hooks.iat[v]:
            for prefix, kind in HOOKS:
                unit = _unit_of(hook, prefix)
                if unit is not None:
                    where.setdefault((kind, unit), {}).setdefault(int(rank[v]), int(v))
    return where


def _unit_of(hook: str, prefix: str) -> str | None:
    """The unit ``hook`` names if it starts with ``prefix`` (the root: ``""``), else None."""
    return hook[len(prefix):].strip().strip("()") if hook.startswith(prefix) else None


def _done_by_rank(w: WhatIf, gather: Gather) -> dict[int, int]:
    """Each rank's end of ``gather``."""
    c = w._collective(*gather)
    return dict(zip((int(r) for r in c["ranks"]), (int(v) for v in c["done"])))


def _waited_by(w: WhatIf, gather: Gather) -> dict[int, int]:
    """The op of each rank that waits for its end of ``gather``."""
    edges = w.edges[w.edges["kind"] == "wait"]
    return {r: int(edges.loc[edges["src"] == done, "dst"].iat[0]) for r, done in _done_by_rank(w, gather).items()
            if (edges["src"] == done).any()}


def _regather_in_backward(w: WhatIf, groups: set[str]) -> int:
    """:func:`_regather_group` for each shard group (HSDP has several); how many were added."""
    return sum(_regather_group(w, group) for group in sorted(groups))


def _regather_group(w: WhatIf, group: str) -> int:
    """Each unit gathered again before its backward pass, as FSDP2 does when it reshards after
    forward: a copy of the unit's forward all-gather, issued where its backward prefetch runs
    (the ``FSDP::backward_prefetch for UNIT`` hook, inside the unit before it in the backward
    pass; without one, the op before the unit's own pre-backward hook) and needed by the op that
    runs the unit's ``FSDP::pre_backward`` hook; where the unit's forward gather was waited right
    after the op that issued it (FSDP2's unshard on gloo), the thread waits for the copy there
    too, before the op after the one that issued it. How many were added."""
    where, gathers = _hook_nodes(w), _calls_by_unit(w, {group})["forward"]
    added = 0
    after = _next_on_queue(w)
    previous = {v: u for u, v in after.items()}
    for (kind, unit), heads in list(where.items()):
        if kind != "forward":
            continue
        gather = gathers.get(unit)
        if gather is None:
            continue
        ranks = {int(r) for r in w._collective(*gather)["ranks"]}
        users = {r: v for r, v in where.get(("backward", unit), {}).items() if r in ranks}
        heads = {r: v for r, v in heads.items() if r in ranks}
        if set(users) != ranks:
            continue
        prefetch = where.get(("prefetch", unit), {})
        issuers = {r: prefetch.get(r, previous.get(u)) for r, u in users.items()}
        if any(v is None or v == users[r] for r, v in issuers.items()):
            continue
        if _synchronous(w, gather, _waited_by(w, gather), heads, after):
            users = {r: after.get(v, users[r]) for r, v in issuers.items()}
        w.add_collective(*gather, issuers=issuers, users=users)
        added += 1
    return added


def _synchronous(w: WhatIf, gather: Gather, waiter: dict[int, int], issuers: dict[int, int],
                 after: dict[int, int]) -> bool:
    """Whether every rank waited for ``gather`` (``waiter``: :func:`_waited_by`) in the op right
    after the one that issued it (``issuers``: rank -> op; ``after``: :func:`_next_on_queue`)."""
    return set(waiter) == set(_done_by_rank(w, gather)) and all(
        v in after and after.get(issuers.get(r, -1)) == v for r, v in waiter.items())


def _next_on_queue(w: WhatIf) -> dict[int, int]:
    """Each node's successor on its thread or stream (program order)."""
    order = w.edges[w.edges["kind"] == "order"]
    return dict(zip(order["src"].astype(int), order["dst"].astype(int)))


def _backward_all_gathers(graph: DataflowGraph, groups: set[str]) -> list[Gather]:
    """The all-gathers of ``groups`` every rank issued after its first backward op (FSDP's before
    a unit's backward)."""
    nodes = graph.nodes
    names = nodes["name"].astype(str)
    backward = nodes[names.str.startswith(BACKWARD_EVENT_PREFIX).to_numpy() & (nodes["kind"] == "cpu").to_numpy()]
    first = backward.groupby("rank")["offset_ns"].min()
    out = []
    offsets = nodes["offset_ns"].to_numpy()
    for row in graph.collectives.itertuples():
        if collective_family(str(row.coll)) != "all_gather" or not len(row.done) or str(row.group) not in groups:
            continue
        sends_start = [offsets[s] for s in row.sends] or [offsets[d] for d in row.done]
        if all(r in first.index and min(sends_start) >= first[r] for r in row.ranks):
            out.append((str(row.coll), int(row.occurrence)))
    return out
