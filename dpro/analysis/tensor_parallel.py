"""Tensor parallel's mesh shape as a graph edit (``dpro whatif --tp-mesh DPxTP``).

A job on a ``(dp, tp)`` device mesh (``init_device_mesh``'s layout: a tensor-parallel group is
``tp`` consecutive ranks), its layers split over ``tp`` with DTensor (``parallelize_module``'s
column- and row-wise styles) and its gradients averaged over ``dp``, asked on another shape of the
same ranks (4 ranks as ``2x2``, ``4x1`` or ``1x4``). Each data-parallel replica reads the same
batch as recorded (the script's batch size is per replica).

- **Tensor-parallel calls** (those of the mesh's ``tp`` groups): over ``tp`` consecutive ranks,
  of the same bytes (an activation's all-reduce does not depend on the degree); not made for
  ``tp = 1``.
- **Tensor-parallel compute**: each rank's ops from where a value enters DTensor
  (``_FromTorchTensor`` in the forward pass; a gradient's ``_ToTorchTensorBackward`` in the
  backward) up to the op that issues the ``tp`` group's next call (or leaves that pass) run on
  ``1/tp`` of the layer: their time times ``tp0/tp`` (on a GPU, the kernels they launched),
  DTensor's own wrapping and redistributing apart (:data:`BOOKKEEPING`). The ops outside (norms, embeddings, the loss, residual adds) are
  replicated and keep their time; the optimizer's step scales with this rank's parameter bytes.
- **Data-parallel calls** (the ``dp`` groups'): over the ``dp`` ranks of a column of the mesh;
  a call the size of a parameter sharded over ``tp`` carries ``tp0/tp`` times its bytes (of the
  calls of each size, as many as the run has parameters of that size sharded; the others, of
  replicated parameters, keep theirs); not made for ``dp = 1``. Each call over the links its new
  group crosses (the rule of :func:`dpro.analysis.fsdp.mesh`).

Modelled from a recording with tensor parallel (``tp0 >= 2``: its calls and sharded ops are what
is scaled) and, for ``dp > 1``, with data parallel (its all-reduces are what is regrouped).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpro.run_format import BACKWARD_EVENT_PREFIX
from dpro.replayer.linkmodel import wire_rates
from dpro.replayer.graph_edits import WhatIf, WhatIfError

from dpro.analysis.mesh_groups import regroup_over, runs, strides
from dpro.analysis.run import RunAnalysis

__all__ = ["TPLayout", "layout", "parameter_ratio", "parse_tp_mesh", "tp_mesh"]

ENTRIES = ("_FromTorchTensor", f"{BACKWARD_EVENT_PREFIX}: _ToTorchTensorBackward")
"""The ops where a value enters DTensor: a tensor-parallel region starts there (torch 2.13's names)."""
BOOKKEEPING = frozenset(["_FromTorchTensor", "_ToTorchTensor", "Redistribute"]
                        + [f"{BACKWARD_EVENT_PREFIX}: {name}Backward" for name in (
                            "_FromTorchTensor", "_ToTorchTensor", "Redistribute")])
"""DTensor's own ops (wrapping, unwrapping, redistributing): the same work whatever the shard."""
OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")

Call = tuple[str, int]  # a collective's name and occurrence


@dataclass(frozen=True)
class TPLayout:
    """A recorded ``(dp, tp)`` mesh: its shape, each rank's group in each dimension, and each
    rank's parameter bytes (``parameters``) of which ``sharded`` are sharded over ``tp``
    (``sharded_sizes``: each such parameter's local bytes)."""

    dp: int
    tp: int
    dp_groups: dict[int, str]
    tp_groups: dict[int, str]
    parameters: dict[int, int]
    sharded_sizes: dict[int, list[int]]

    def parameter_ratio(self, rank: int, tp: int) -> float:
        """The rank's parameter bytes at tensor-parallel degree ``tp`` over the recorded."""
        return parameter_ratio(self.parameters.get(rank, 0), sum(self.sharded_sizes.get(rank, [])), self.tp, tp)


def parameter_ratio(total: int, sharded: int, recorded_tp: int, tp: int) -> float:
    """A rank's parameter bytes (``total``, of which ``sharded`` split over tensor parallel's
    ``recorded_tp`` ranks) at degree ``tp``, over the recorded; 1 where none were measured."""
    return (total - sharded + sharded * recorded_tp / tp) / total if total > 0 else 1.0


def parse_tp_mesh(text: str) -> tuple[int, int]:
    """``"2x2"`` (or ``2×2``) as ``(dp, tp)``; a one-line error otherwise."""
    m = re.fullmatch(r"\s*([0-9]+)\s*[x×]\s*([0-9]+)\s*", text.lower(), re.ASCII)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise WhatIfError(f"--tp-mesh takes DPxTP (e.g. 4x1, 2x2, 1x4), not {text!r}")
    return int(m.group(1)), int(m.group(2))


def layout(analysis: RunAnalysis, flag: str = "--tp-mesh") -> TPLayout:
    """The job's ``(dp, tp)`` mesh; a one-line error where the job is not tensor parallel on one."""
    parallelism = analysis.parallelism
    if not parallelism.tensor_parallel:
        raise WhatIfError(f"{flag} applies to tensor-parallel jobs on a (dp, tp) device mesh; this job is "
                          f"{parallelism.describe()}")
    if parallelism.fsdp or parallelism.pipeline is not None:
        raise WhatIfError(f"{flag} is modelled for tensor parallel with data parallel by all-reduce; this job is "
                          f"{parallelism.describe()}")
    shape = list(parallelism.mesh["shape"])
    dp_groups, tp_groups, parameters, sharded = {}, {}, {}, {}
    for rank, meta in sorted(analysis.metas.items()):
        meshes = [m for m in meta.parallel.meshes if list(m.get("shape") or []) == shape]
        names = meshes[0].get("groups") if meshes else None
        if not names or len(names) != 2 or None in names:
            raise WhatIfError(f"{flag} is modelled on a 2-D (dp, tp) mesh; rank {rank}'s mesh is "
                              f"{'×'.join(map(str, shape))} with groups {names}")
        params = meta.parallel.dtensor_parameters
        if params is None:
            raise WhatIfError(f"{flag} needs the DTensor parameters in the run's metadata (recorded by a newer "
                              "dpro record); record the job again")
        if any(set(p.get("sharded_over") or []) - {names[1]} for p in params):
            raise WhatIfError(f"{flag} is modelled with parameters sharded over the mesh's last (tp) dimension; "
                              f"rank {rank}'s are sharded over another")
        dp_groups[rank], tp_groups[rank] = str(names[0]), str(names[1])
        parameters[rank] = meta.memory.parameters_bytes if meta.memory else 0
        sharded[rank] = parallelism.sharded_parameters.get(rank, [])
    if not any(sharded.values()):
        raise WhatIfError(f"{flag}: no parameter of this job is sharded over its tp dimension")
    return TPLayout(int(shape[0]), int(shape[1]), dp_groups, tp_groups, parameters, sharded)


def tp_mesh(w: WhatIf, analysis: RunAnalysis, shape: str) -> dict[str, Any]:
    """The job on a ``(dp, tp)`` mesh of the same ranks (see the module docstring)."""
    was = layout(analysis)
    dp, tp = parse_tp_mesh(shape)
    world = was.dp * was.tp
    details: dict[str, Any] = {"tp_mesh": f"{dp}x{tp}", "recorded": f"{was.dp}x{was.tp}"}
    if dp * tp != world:
        raise WhatIfError(f"--tp-mesh {dp}x{tp} has {dp * tp} ranks; the job runs on {world} (the mesh changes its "
                          "shape, not its size)")
    if (dp, tp) == (was.dp, was.tp):
        return {**details, "note": "as recorded"}
    if was.tp == 1:
        raise WhatIfError(f"--tp-mesh {dp}x{tp} adds tensor parallel to a job recorded without it ({was.dp}x1): there "
                          "are no tensor-parallel calls or sharded ops to model it from")
    if was.dp == 1 and dp > 1:
        raise WhatIfError(f"--tp-mesh {dp}x{tp} adds data parallel to a job recorded without it ({was.dp}x{was.tp}): "
                          "there is no gradient all-reduce to model it from")
    calls = [(str(r.coll), int(r.occurrence), str(r.group)) for r in w.graph.collectives.itertuples()
             if (str(r.coll), int(r.occurrence)) not in w.dropped]
    tp_calls = [(c, k) for c, k, g in calls if g in set(was.tp_groups.values())]
    dp_calls = [(c, k) for c, k, g in calls if g in set(was.dp_groups.values())]
    if not tp_calls:
        raise WhatIfError("the tensor-parallel groups' collectives were not found in this run's graph")
    if was.dp > 1 and not dp_calls:
        raise WhatIfError("no collective of the mesh's dp groups was found in this run's graph: --tp-mesh models "
                          "gradients averaged over the dp dimension's groups")
    sharded = _sharded_ops(w)
    w.durations[sharded] *= was.tp / tp
    step = w.select(name=OPTIMIZER_STEP.pattern, kind="cpu")
    ranks = w.graph.nodes["rank"].to_numpy()
    for v in step:
        w.durations[v] *= was.parameter_ratio(int(ranks[v]), tp)
    resized = _resize_gradients(w, was, dp_calls, tp)
    if dp_calls and not resized:
        raise WhatIfError("no gradient all-reduce of the dp groups has the size of a parameter sharded over tp: "
                          "--tp-mesh models an all-reduce per parameter (DDP's buckets over the dp groups are not "
                          "modelled)")
    wires = wire_rates(analysis.calibrations, analysis.hosts)
    links = {}
    for name, mine, size, groups, recorded in (
            ("tp", tp_calls, tp, runs(world, tp), runs(world, was.tp)),
            ("dp", dp_calls, dp, strides(world, tp), strides(world, was.tp))):
        if size > 1:
            links[name] = regroup_over(w, mine, size, groups, recorded, wires)
            continue
        for call in mine:
            w.drop_collective(*call)
    tp_link, dp_link = links.get("tp"), links.get("dp")
    return {**details, "sharded_ops": int(len(sharded)), "gradient_calls_resized": resized,
            "tp_links": tp_link, "dp_links": dp_link,
            "tp_calls_dropped": len(tp_calls) if tp == 1 else 0, "dp_calls_dropped": len(dp_calls) if dp == 1 else 0}


def _sharded_ops(w: WhatIf) -> np.ndarray:
    """The work inside each rank's tensor-parallel regions: a region runs on its thread from an op
    where a value enters DTensor (:data:`ENTRIES`) to the next op that issues a collective (the
    ``tp`` group's all-reduce; not included) or leaves the pass it began in (a forward region at
    the first backward op, a backward region at the first op outside the backward pass: the first
    layer's input needs no gradient, so its backward region issues nothing); DTensor's own ops
    (:data:`BOOKKEEPING`) left out. On a GPU the work is the kernels those ops launched; on a CPU,
    the ops."""
    issuing = set(w.issuers().values())
    nodes = w.graph.nodes
    cpu = nodes[(nodes["kind"] == "cpu").to_numpy()]
    names = cpu["name"].astype(str)
    marked = cpu.assign(entry=names.isin(ENTRIES).to_numpy(), own=names.isin(BOOKKEEPING).to_numpy(),
                        backward=names.str.startswith(BACKWARD_EVENT_PREFIX).to_numpy())
    found = []
    for _, thread in marked.sort_values("offset_ns", kind="stable").groupby("resource", observed=True):
        region: bool | None = None  # None: outside; else whether the region began in the backward pass
        for v, is_entry, own, backward in zip(thread.index, thread["entry"], thread["own"], thread["backward"]):
            if int(v) in issuing or (region is not None and region != backward):
                region = None
            if is_entry:
                region = bool(backward)
            if region is not None and not own:
                found.append(int(v))
    ops = np.asarray(found, np.int64)
    if not (nodes["kind"] == "gpu").any():
        return ops
    launches = w.edges[(w.edges["kind"] == "launch").to_numpy() & w.edges["src"].isin(ops).to_numpy()]
    return np.unique(launches["dst"].to_numpy(np.int64))


def _resize_gradients(w: WhatIf, was: TPLayout, dp_calls: list[Call], tp: int) -> int:
    """The data-parallel calls of sharded parameters' gradients at ``tp0/tp`` times their bytes:
    on each rank's group, of the calls of each size, as many as the rank has sharded parameters of
    that size (the first ones). How many calls were resized."""
    resized = 0
    by_group: dict[str, list[Call]] = {}
    for call in dp_calls:
        by_group.setdefault(str(w._collective(*call)["group"]), []).append(call)
    for rank, group in sorted(was.dp_groups.items()):
        mine = by_group.pop(group, [])
        left = Counter(was.sharded_sizes.get(rank, []))
        for call in mine:
            nbytes = int(round(w.collective_bytes(*call)))
            if left[nbytes] > 0:
                left[nbytes] -= 1
                w.set_collective_bytes(*call, nbytes * was.tp / tp)
                resized += 1
    return resized

