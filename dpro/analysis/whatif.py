"""What a recorded data-parallel job would do under another configuration (``dpro whatif``).

The recorded run's graph is replayed with the change made (:class:`dpro.replayer.graph_edits.WhatIf`),
sends timed by the link model fitted on the run's calibration
(:mod:`dpro.replayer.linkmodel`; on the graph's own collectives when the run was recorded with
``--no-calibrate``). Changes, applied in this order:

- **bucket cap** and **first bucket**: DDP's buckets rebuilt for the new caps exactly as DDP
  builds them, from the recorded parameters (:mod:`dpro.replayer.buckets`). A new bucket takes
  the all-reduce of the recorded bucket holding its last parameter: recorded buckets that no new
  bucket ends in are fused into the next; a recorded bucket in which several new ones end becomes
  their all-reduces, in order (copies of its all-reduce, each paying the call's fixed cost, each
  send queued behind the same send of the one before). Each all-reduce is issued where DDP issues
  it, by autograd's ``AccumulateGrad`` op of the last of its gradients (the k-th such op of a rank
  readies the k-th parameter in the recorded order), so a bucket that now ends earlier starts
  earlier. Where the ranks do not show one such op per parameter, every new bucket waits for
  the recorded bucket it ends in.
- **compression** (``fp16``, ``bf16``): DDP's hook halves each bucket's bytes and adds its
  compute (the cast and the copy back, timed in calibration).
- **operator fusion** (``torch.compile``): each rank's forward and backward ops take what
  TorchInductor's fused kernels would leave of them (:mod:`dpro.analysis.fusion`): on the CPU,
  the forward (DDP's ``DistributedDataParallel.forward``; without that marker it is kept) and
  the backward ops (but ``AccumulateGrad``) scaled by the shares measured on the rank's traced
  ops (every op not nested in a heavy one); on a GPU, each run of fusable kernels of the forward
  or of the backward pass (but ``AccumulateGrad``'s) shrunk to its longest kernel. With
  gradient accumulation, the fixed part of a fused op is its calls' fixed cost.
- **recompute forward** (activation checkpointing): the backward pass runs the forward pass
  again, segment by segment. Each rank's backward ops (autograd's functions on the CPU; on a
  GPU, the kernels they launch) take longer by the forward's share, ``× (1 + F / B)``: ``F``
  the model's forward pass (DDP's ``DistributedDataParallel.forward`` and, on a GPU, the
  kernels it launches; without that marker, the rank's ops of that kind before its first
  backward op), ``B`` its backward ops. The whole forward is counted, also what lies outside
  the checkpointed blocks (embeddings, the head): the cost errs high.
- **gradient accumulation** over ``K`` micro-batches (the same batch per step, ``K`` forward
  and backward passes of ``1/K`` of it, DDP's ``no_sync`` on all but the last): an op's time
  is a fixed part and a part that scales with the batch, and takes ``fixed + rest / K`` a
  micro-batch. On the CPU the fixed part is, in the forward pass, its time outside its ops (the
  interpreter between them), and of every op what a view op takes on that rank
  (``aten::as_strided``, ``aten::view``...: ops that do no work); on a GPU, the rank's shortest
  kernels' time (the 1st percentile); all of autograd's ``AccumulateGrad`` (it adds a parameter-sized gradient whatever the
  batch). The last micro-batch's backward pass is the one that all-reduces: its ops keep their
  place with that time; the first ``K - 1`` micro-batches' forward and backward passes (with
  autograd's time between backward ops) run before it, in the forward ops' place. Ops outside
  the forward and backward passes (the loss, the optimizer) are kept as recorded: the loss's
  share errs low.
- **op scaling**: the CPU and GPU ops whose name matches a regular expression take that many
  times as long (a faster kernel, a slower host).
- **world size**: every collective as its algorithm runs over N ranks (per-rank work fixed),
  over the links of the hosts N ranks need at the recorded ranks per host.
- **bandwidth scale**: every link that many times as fast. Where the calibration timed the
  links with plain TCP streams, only the wire's share of a send's time per byte scales; the
  host's (the backend's copies and threads, what makes gloo slower than the link) stays.

Compute and communication slow each other where they overlap
(:mod:`dpro.replayer.interference`): a change that moves communication re-times the ops whose
overlap it changes, with the slow-downs measured in the run's calibration (for a run recorded
``--no-calibrate``, the compute slow-down seen in its recorded step, if any).

The prediction is anchored on the recorded configuration: the measured step time users ran
(the median of the unprofiled steps) times the ratio of the changed replay to the unchanged
one, so the replay's own error on the recorded configuration is not carried into the answer.
The unanchored replay is reported beside it.
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from dpro.comm_hooks import CAST_BYTES_RATIO, POWERSGD, POWERSGD_MATMUL, parse_compress
from dpro.errors import DproError
from dpro.graph.dataflow import DataflowGraph
from dpro.run_format import BACKWARD_EVENT_PREFIX
from dpro.run_records import DdpLayout, Timing
from dpro.stats import job_mean, timed_ranks
from dpro.replayer.buckets import Param, first_bucket_bytes, ready_order, rebuilt_buckets
from dpro.replayer.cost import fit_link_model, link_class
from dpro.replayer.interference import Interference, NodeClasses, from_calibration, from_graph, overlap
from dpro.replayer.linkmodel import calibrated_link_model, wire_rates
from dpro.replayer.pipeline import SCHEDULES, StageCost, schedule_name, step_ns
from dpro.replayer.result import Replay
from dpro.replayer.simulate import replay
from dpro.replayer.graph_edits import WhatIf, WhatIfError

from dpro.analysis.cpu_ops import (ACCUMULATE_GRAD_EVENT, DDP_FORWARD_EVENT, FSDP_EVENT_PREFIX, cpu_ops,
                                   forward_marks, once_per_rank, top_level, view_op_ns)
from dpro.analysis import fsdp, tensor_parallel
from dpro.analysis.fusion import fused_kernel_durations, fused_shares
from dpro.analysis.run import RunAnalysis
from dpro.analysis.stages import fixed_shares, stage_costs

__all__ = ["Change", "CostModel", "Prediction", "predict"]

MIN_COMPRESSION_RATE = 2  # PowerSGDState's default: a matrix is compressed if that many times smaller


@dataclass(frozen=True)
class Change:
    """A configuration to predict; ``None``: as recorded."""

    bucket_cap_mb: float | None = None
    first_bucket_mb: float | None = None
    bandwidth_scale: float | None = None
    compress: str | None = None
    world_size: int | None = None
    ranks_per_host: int | None = None
    recompute_forward: bool | None = None
    accumulate: int | None = None
    fuse_ops: bool | None = None
    scale_ops: str | None = None  # a regular expression on op names: their ops' durations times op_scale
    op_scale: float | None = None
    reshard_after_forward: bool | None = None  # FSDP2's, for every unit
    forward_prefetch: int | None = None  # FSDP2's: each unit's forward all-gather issued this many units ahead
    merge_units: int | None = None  # FSDP2's units (the root apart) wrapped this many as one
    fsdp_mesh: str | None = None  # FSDP2's (replicate, shard) mesh of the same ranks, "RxS" (HSDP)
    tp_mesh: str | None = None  # tensor parallel's (dp, tp) mesh of the same ranks, "DPxTP"
    microbatches: int | None = None  # a pipeline's, the same batch per step
    schedule: str | None = None  # a pipeline's: gpipe | 1f1b
    microbatch_run: str | None = None  # a recording of the same pipeline at another micro-batch count
    probe_steps: bool | None = None  # False: the run's probe steps left out (dpro.collectors.probe)


def predict(analysis: RunAnalysis, change: Change, interference: bool = True, incremental: bool = True,
            fold: bool = False) -> dict[str, Any]:
    """The predicted step time of the recorded job under ``change`` (see the module docstring):
    ``baseline_step_ms`` (measured, unprofiled), ``replayed_step_ms`` (the unchanged replay),
    ``predicted_step_ms``, ``unanchored_step_ms``, ``per_rank`` and what the change did.
    ``interference=False`` leaves durations independent of overlap; ``incremental=False``
    replays the whole graph every time; ``fold=True`` replays it folded onto its median rank
    where the ranks run the same ops (approximate; ``ranks_folded`` says whether it was),
    :class:`~dpro.replayer.graph_edits.WhatIf`. To predict many changes of one run, build its
    :class:`CostModel` once."""
    return CostModel(analysis, interference, incremental, fold).predict(change).summary


class CostModel:
    """A recorded run's cost model, built once: the link model (the calibration's measurements,
    where they exist, replace the fits on the graph's own sends), the interference model and the
    replay of the unchanged graph. Every :meth:`predict` reuses them, starting from a fork of
    the unchanged what-if (:meth:`~dpro.replayer.graph_edits.WhatIf.fork`); one at a time (the forks
    share the replayer), so that threads may share a cost model."""

    def __init__(self, analysis: RunAnalysis, interference: bool = True, incremental: bool = True,
                 fold: bool = False) -> None:
        self.analysis, self.fold = analysis, fold
        self._lock = threading.Lock()
        graph = analysis.graph
        model = fit_link_model(graph)
        wires = wire_rates(analysis.calibrations, analysis.hosts)
        cls_ = link_class(graph, sorted(graph.step_ns))
        calibrated = calibrated_link_model(analysis.calibrations, cls_, wires.get(cls_))
        model.update(calibrated)
        slowdown = _interference(analysis) if interference else None
        self._unchanged = WhatIf(graph, model, slowdown, incremental, fold)
        self.replayed_ns = self._unchanged.replay().step_ns
        self.details: dict[str, Any] = {
            "link_model": "calibration" if calibrated else "the recorded collectives",
            "link_mbit_s": {c: round(rate * 8e3, 1) for c, rate in sorted(wires.items())},
            "interference": None if slowdown is None else asdict(slowdown)}

    def what_if(self) -> WhatIf:
        """A fork of the unchanged what-if, to make a change on."""
        return self._unchanged.fork()

    def predict(self, change: Change) -> "Prediction":
        """The recorded run replayed with ``change`` made (see :func:`predict`)."""
        with self._lock:
            return Prediction.of(self, change)


@dataclass
class Prediction:
    """A change replayed: :attr:`summary` (what :func:`predict` returns), the changed graph and
    its replay (the predicted timeline, unanchored)."""

    summary: dict[str, Any]
    graph: DataflowGraph
    replay: Replay

    @classmethod
    def of(cls, model: CostModel, change: Change) -> "Prediction":
        """Replay ``model``'s run with ``change`` made (see :func:`predict`)."""
        analysis, graph, replayed = model.analysis, model.analysis.graph, model.replayed_ns
        _check_applies(analysis, change)
        w = model.what_if()
        details = dict(model.details)
        rebucket = change.bucket_cap_mb is not None or change.first_bucket_mb is not None
        if rebucket or change.compress is not None:
            layout = _layout(analysis)
            ddp = _ddp_buckets(analysis, graph)
            buckets = _buckets(layout, change.bucket_cap_mb, change.first_bucket_mb)
            if rebucket:
                ddp, details["reissued"] = _rebucket(w, graph, layout, ddp, buckets)
                details["buckets_bytes"] = [b for _, b in ddp]
            hook, rank = parse_compress(change.compress) if change.compress is not None else (None, None)
            if hook == POWERSGD:
                details["compression"] = _powersgd(w, analysis, ddp, buckets, rank)
            elif hook is not None:
                details["compression"] = _compress(w, analysis, ddp, hook)
        if change.fuse_ops:
            details["fusion"] = _fuse_ops(w, analysis)
        if change.recompute_forward:
            details["recompute"] = _recompute_forward(w)
        if change.accumulate is not None:
            details["accumulation"] = _accumulate(w, analysis, change.accumulate, bool(change.fuse_ops))
        if change.op_scale is not None:
            details["scaled_ops"] = _scale_ops(w, change.scale_ops or ".", change.op_scale)
        if change.world_size is not None:
            details["link_class"] = _world_size(w, analysis, change.world_size, change.ranks_per_host)
        if change.merge_units is not None:  # first: the units are read from the ops that issued their calls
            details["fsdp_units"] = fsdp.merge_units(w, analysis, change.merge_units)
        if change.fsdp_mesh is not None:  # before the reshard: a gather it adds is timed as changed
            details["fsdp_mesh"] = fsdp.mesh(w, analysis, change.fsdp_mesh)
        if change.tp_mesh is not None:
            details["tp_mesh"] = tensor_parallel.tp_mesh(w, analysis, change.tp_mesh)
        if change.reshard_after_forward is not None:
            details["fsdp"] = fsdp.reshard(w, analysis, change.reshard_after_forward)
        if change.forward_prefetch is not None:
            details["fsdp_prefetch"] = fsdp.forward_prefetch(w, analysis, change.forward_prefetch)
        if change.bandwidth_scale is not None:
            w.set_link_bandwidth(change.bandwidth_scale)
        result = w.replay()
        changed = result.step_ns
        if change.microbatches is not None or change.schedule is not None:
            details["pipeline"] = _pipeline(w, analysis, change.microbatches, change.schedule, change.microbatch_run,
                                            change.probe_steps is not False)
            factor = details["pipeline"]["changed_ms"] / details["pipeline"]["modelled_ms"]
            changed = {r: ns * factor for r, ns in changed.items()}
        baseline = analysis.unprofiled_step_ns
        ranks = sorted(changed)
        timed = timed_ranks(baseline, ranks)
        anchored = {r: baseline[r] * changed[r] / replayed[r] if baseline[r] == baseline[r] else changed[r]
                    for r in ranks}
        per_rank = [{"rank": r, "baseline_step_ms": _ms(baseline[r]), "replayed_step_ms": replayed[r] / 1e6,
                     "predicted_step_ms": anchored[r] / 1e6, "unanchored_step_ms": changed[r] / 1e6} for r in ranks]
        job = {k: _ms(job_mean(v, timed)) for k, v in (("baseline_step_ms", baseline), ("replayed_step_ms", replayed),
                                                        ("predicted_step_ms", anchored),
                                                        ("unanchored_step_ms", changed))}
        if "pipeline" in details:  # the step the other extreme of the passes' fixed part would give
            pipeline = details["pipeline"]
            job["predicted_range_ms"] = [job["predicted_step_ms"] * b / pipeline["changed_ms"]
                                         for b in pipeline["changed_range_ms"]]
        summary = {**job, "change": {k: v for k, v in asdict(change).items() if v is not None}, **details,
                   **({"ranks_folded": w.folded} if model.fold else {}), "per_rank": per_rank}
        return cls(summary, replace(w.graph, edges=w.edges), result)


def _pipeline(w: WhatIf, analysis: RunAnalysis, microbatches: int | None, schedule: str | None,
              other_run: str | None = None, probe_steps: bool = True) -> dict[str, Any]:
    """The pipeline's step under another micro-batch count and schedule
    (:mod:`dpro.replayer.pipeline`, over the stages' costs :func:`~dpro.analysis.stages.stage_costs`
    reads from the graph as changed so far): the replayed step scales by the schedule model's
    changed step over its recorded one. With ``other_run``, a recording of the same job at
    another micro-batch count, or else the run's probe steps (unless ``probe_steps`` is False),
    each stage's passes take the fixed shares the two counts show
    (:func:`~dpro.analysis.stages.fixed_shares`). The timeline (the changed graph's replay)
    stays the recorded schedule's."""
    costs = stage_costs(w, analysis)
    pipeline = analysis.parallelism.pipeline or {}
    recorded_m = int(pipeline["microbatches"])
    second, fixed_from = _second_count(analysis, other_run, probe_steps)
    fitted = second is not None
    if second is not None:
        shares = fixed_shares(costs, recorded_m, *second)
        costs = [replace(c, forward_fixed_ns=f * c.forward_ns, backward_fixed_ns=b * c.backward_ns)
                 for c, (f, b) in zip(costs, shares)]
    try:
        recorded = schedule_name(str(pipeline["schedule"]))
    except ValueError as e:
        raise WhatIfError(str(e)) from None
    m = recorded_m if microbatches is None else microbatches
    name = schedule or recorded
    if name not in SCHEDULES:
        raise WhatIfError(f"unknown schedule {name!r}: one of {', '.join(SCHEDULES)}")
    if m < 1:
        raise WhatIfError(f"--microbatches must be 1 or more, not {m}")
    if name == "1f1b" and m < len(costs):
        raise WhatIfError(f"1F1B needs at least as many micro-batches as stages ({len(costs)}), not {m}")
    modelled = step_ns(costs, recorded_m, recorded)
    changed = step_ns(costs, m, name, size=recorded_m / m)
    if not fitted and m != recorded_m:  # the passes' fixed part unknown: from what was seen to all of them
        all_fixed = [replace(c, forward_fixed_ns=c.forward_ns, backward_fixed_ns=c.backward_ns) for c in costs]
        bounds = sorted((changed, step_ns(all_fixed, m, name, size=recorded_m / m)))
    else:
        bounds = [changed, changed]
    return {"microbatches": m, "schedule": name, "recorded": {"microbatches": recorded_m, "schedule": recorded},
            "modelled_ms": modelled / 1e6, "changed_ms": changed / 1e6, "changed_range_ms": [b / 1e6 for b in bounds],
            "stages": [{"forward_ms": c.forward_ns / 1e6, "backward_ms": c.backward_ns / 1e6,
                        "fixed_share": (c.forward_fixed_ns + c.backward_fixed_ns) / max(c.forward_ns + c.backward_ns, 1.0)}
                       for c in costs],
            "fixed_from": fixed_from, "fitted": fitted, "timeline": "the recorded schedule's"}


def _second_count(analysis: RunAnalysis, other_run: str | None,
                  probe_steps: bool) -> tuple[tuple[list[StageCost], int] | None, str]:
    """The pipeline's stages' costs at a second micro-batch count and that count (each from its
    graph as recorded), and where they come from, in words: ``other_run`` where given, else the
    run's own probe steps (:mod:`dpro.collectors.probe`) unless ``probe_steps`` is False, else
    none (the passes' fixed part then the time between ops and per-op overhead)."""
    m = int((analysis.parallelism.pipeline or {})["microbatches"])
    if other_run is not None:
        other = RunAnalysis.open(other_run)
        if other.parallelism.pipeline is None:
            raise WhatIfError(f"{other_run} is not a recording of a pipeline")
        k = int(other.parallelism.pipeline["microbatches"])
        return (stage_costs(WhatIf(other.graph), other), k), f"the recordings at {m} and {k} micro-batches"
    alone = "the time between ops and per-op overhead (one recording: {})"
    if not probe_steps:
        return None, alone.format("its probe steps left out")
    probe, why = analysis.run.probe()
    if probe is None:
        return None, alone.format(why)
    other = RunAnalysis(probe, align=analysis.align, scheduler=analysis.scheduler, workers=analysis.workers,
                        cache=analysis.cache)
    k = int(other.parallelism.pipeline["microbatches"])
    try:
        costs = stage_costs(WhatIf(other.graph), other)
    except DproError as e:  # the probe unusable (a graph error, no backward pass): the window alone, and why
        return None, alone.format(f"its probe steps unusable: {e}")
    return (costs, k), f"the run's probe steps at {k} micro-batches beside its window at {m}"


def _scale_ops(w: WhatIf, pattern: str, factor: float) -> int:
    """The CPU and GPU ops whose name matches ``pattern`` take ``factor`` times as long; how many."""
    try:
        ids = np.union1d(w.select(name=pattern, kind="cpu"), w.select(name=pattern, kind="gpu"))
    except re.error as e:
        raise WhatIfError(f"bad op name pattern {pattern!r}: {e}") from None
    w.durations[ids] *= factor
    return int(len(ids))


def _phases(w: WhatIf) -> list[tuple[int, str, np.ndarray, np.ndarray]]:
    """Each rank's forward and backward ops of each kind, ``(rank, kind, forward, backward)``
    masks over the graph's nodes, with the copies of a split bucket's all-reduce if any: the
    backward ops are autograd's functions on the CPU (on a GPU, the kernels they launch); the
    forward, DDP's ``DistributedDataParallel.forward`` (and the kernels it launches), or without
    that marker the rank's ops of that kind before its first backward op but FSDP's (its hooks,
    which gather and copy parameters: a recomputed forward finds them gathered)."""
    nodes = w.graph.nodes
    rank = nodes["rank"].to_numpy()
    kind = nodes["kind"].astype(str).to_numpy()
    start = nodes["offset_ns"].to_numpy(np.float64)
    names = nodes["name"].astype(str)
    backward_cpu = names.str.startswith(BACKWARD_EVENT_PREFIX).to_numpy()
    model_cpu = (names == DDP_FORWARD_EVENT).to_numpy()
    hooks = nodes["hooks"].astype(object).fillna("").astype(str) if "hooks" in nodes else pd.Series("", nodes.index)
    fsdp = (names.str.startswith(FSDP_EVENT_PREFIX) | (hooks != "")).to_numpy()  # gathers' issue, wait and copies
    launches = w.edges[w.edges["kind"] == "launch"]
    src, dst = launches["src"].to_numpy(), launches["dst"].to_numpy()
    backward_gpu, model_gpu = np.zeros(len(nodes), bool), np.zeros(len(nodes), bool)
    backward_gpu[dst[backward_cpu[src]]] = True
    model_gpu[dst[model_cpu[src]]] = True
    found = []
    for r in np.unique(rank):
        for op_kind, backward, model in (("cpu", backward_cpu, model_cpu), ("gpu", backward_gpu, model_gpu)):
            mine = (rank == r) & (kind == op_kind)
            if not (mine & backward).any():
                continue
            forward = mine & model
            if not forward.any():
                forward = mine & ~backward & ~fsdp & (start < start[mine & backward].min())
            found.append((int(r), op_kind, forward, mine & backward))
    if not found:
        raise DproError("the recorded step shows no backward pass")
    return found


def _recompute_forward(w: WhatIf) -> dict[str, dict[str, float]]:
    """Stretch each rank's backward ops by its forward's share (see the module docstring);
    per kind of op, ms of forward and backward, the mean over ranks, and the largest rank's forward."""
    seen: dict[str, list[tuple[float, float]]] = {}
    for _, op_kind, forward, backward in _phases(w):
        f, b = w.durations[forward].sum(), w.durations[backward].sum()
        if b <= 0:
            continue
        w.durations[backward] *= 1 + f / b
        seen.setdefault(op_kind, []).append((f / 1e6, b / 1e6))
    return {k: {"forward_ms": float(np.mean([f for f, _ in v])), "backward_ms": float(np.mean([b for _, b in v])),
                "largest_forward_ms": float(max(f for f, _ in v))} for k, v in seen.items()}


def _fuse_ops(w: WhatIf, analysis: RunAnalysis) -> dict[str, dict[str, float]]:
    """Operator fusion (see the module docstring and :mod:`dpro.analysis.fusion`); per kind of
    op, what fusion leaves of the forward and backward ops' time (the mean over ranks)."""
    nodes = w.graph.nodes
    names = nodes["name"].astype(str).to_numpy()
    kept = names == ACCUMULATE_GRAD_EVENT  # and the kernels it launches
    launches = w.edges[w.edges["kind"] == "launch"]
    src, dst = launches["src"].to_numpy(), launches["dst"].to_numpy()
    kept[dst[kept[src]]] = True
    streams, offsets = nodes["resource"].astype(str).to_numpy(), nodes["offset_ns"].to_numpy(np.float64)
    seen: dict[str, list[tuple[float, float]]] = {}
    for r, op_kind, forward, backward in _phases(w):
        before = w.durations.copy()
        if op_kind == "cpu":
            shares = fused_shares(analysis, r)
            w.durations[forward] *= shares.forward
            w.durations[backward & ~kept] *= shares.backward
        else:
            for members in (forward & ~kept, backward & ~kept):
                w.durations[:] = fused_kernel_durations(names, streams, offsets, w.durations, members)
        left = [w.durations[m].sum() / max(before[m].sum(), 1) for m in (forward, backward)]
        seen.setdefault(op_kind, []).append((float(left[0]), float(left[1])))
    return {k: {"forward_share": float(np.mean([f for f, _ in v])), "backward_share": float(np.mean([b for _, b in v]))}
            for k, v in seen.items()}


def _accumulate(w: WhatIf, analysis: RunAnalysis, micro_batches: int, fused: bool = False) -> dict[str, Any]:
    """Gradient accumulation over ``micro_batches`` (see the module docstring; ``fused``: the
    ops were fused first, and their fixed part is their calls'): per kind of op, the fixed share
    of the forward and backward ops' time (the mean over ranks) and the forward and backward ms
    of one micro-batch."""
    if micro_batches < 2:
        raise DproError(f"gradient accumulation needs 2 micro-batches or more, not {micro_batches}")
    fixed_only = (w.graph.nodes["name"] == ACCUMULATE_GRAD_EVENT).to_numpy()
    seen: dict[str, list[tuple[float, float, float]]] = {}
    for r, op_kind, forward, backward in _phases(w):
        d = w.durations.copy()
        if op_kind == "cpu":
            f_share, b_share, b_gaps = _fixed_shares(analysis, r)
            if fused:
                shares = fused_shares(analysis, r)
                f_share, b_share = shares.forward_fixed, shares.backward_fixed
            fixed = np.where(forward, f_share * d, b_share * d)
        else:  # kernels: the rank's shortest (1st percentile) take what a kernel takes whatever its work
            timed = d[(forward | backward) & (d > 0)]
            fixed, b_gaps = np.minimum(d, np.percentile(timed, 1) if len(timed) else 0.0), 0.0
        fixed[fixed_only] = d[fixed_only]
        small = fixed + (d - fixed) / micro_batches
        f_small, b_small = small[forward].sum(), small[backward].sum()
        earlier = (micro_batches - 1) * (f_small + b_small + b_gaps * d[backward].sum())  # micro-batches before the last
        w.durations[backward] = small[backward]
        if f_small > 0:
            w.durations[forward] = small[forward] * (1 + earlier / f_small)
        share = fixed[forward | backward].sum() / max(d[forward | backward].sum(), 1)
        seen.setdefault(op_kind, []).append((float(share), f_small / 1e6, b_small / 1e6))
    return {"micro_batches": micro_batches,
            **{k: {"fixed_share": float(np.mean([v[0] for v in rows])),
                   "micro_batch_forward_ms": float(np.mean([v[1] for v in rows])),
                   "micro_batch_backward_ms": float(np.mean([v[2] for v in rows]))} for k, rows in seen.items()}}


@once_per_rank
def _fixed_shares(analysis: RunAnalysis, rank: int) -> tuple[float, float, float]:
    """What of ``rank``'s forward and backward CPU time does not scale with the batch, as
    shares of each: the forward's time outside its ops (the interpreter between them), and of
    every op, what an op that does no work takes (the median of the rank's view ops); and the
    time between its backward ops (autograd's engine), as a share of the backward ops' time.
    Over the whole trace (the time between backward ops over its profiled steps); measured once
    per run and rank."""
    cpu = cpu_ops(analysis, rank)
    top, owner = top_level(cpu)
    names = cpu["name"].astype(str)
    per_op = view_op_ns(cpu)
    outer = top & names.str.startswith(BACKWARD_EVENT_PREFIX).to_numpy()
    b_total = float(cpu["dur_ns"].to_numpy()[outer].sum())
    b_ops = int(outer[owner].sum())
    spans = cpu[outer & (cpu["step"] >= 0).to_numpy()].groupby("step").agg(first=("start_ns", "min"), last=("end_ns", "max"), busy=("dur_ns", "sum"))
    b_gaps = float((spans["last"] - spans["first"] - spans["busy"]).clip(lower=0).sum())
    f_total, f_fixed = 0.0, 0.0
    for s0, d0, t, _ in forward_marks(analysis, rank).itertuples(index=False):
        inside = ((cpu["tid"] == t) & (cpu["start_ns"] >= s0) & (cpu["end_ns"] <= s0 + d0)).to_numpy()
        f_total += d0
        f_fixed += d0 - float(cpu["dur_ns"].to_numpy()[inside & top].sum()) + per_op * int(inside.sum())
    forward = min(max(f_fixed / f_total, 0.0), 1.0) if f_total > 0 else 0.0
    backward = min(per_op * b_ops / b_total, 1.0) if b_total > 0 else 0.0
    return forward, backward, b_gaps / b_total if b_total > 0 else 0.0


def _interference(analysis: RunAnalysis) -> Interference | None:
    """The slow-downs of overlap: the calibration's; for a run recorded without it, the
    compute slow-down seen in the recorded step (communication's left at 0), if any."""
    calibrated = from_calibration(analysis.calibrations)
    if calibrated is not None:
        return calibrated
    graph = analysis.graph
    recorded = replay(graph)
    seen = from_graph(graph, overlap(NodeClasses.of(graph), recorded.start_ns, recorded.end_ns, recorded.step_ns))
    return None if seen is None else Interference(seen[0], 0.0, f"the recorded step ({seen[1]} ops)")


def _ms(ns: float) -> float | None:
    return None if ns != ns else ns / 1e6


DATA_PARALLEL_CHANGES = {"bucket_cap_mb": "--bucket-cap-mb", "first_bucket_mb": "--first-bucket-mb",
                         "compress": "--compress", "accumulate": "--accumulate", "world_size": "--world-size",
                         "ranks_per_host": "--ranks-per-host", "recompute_forward": "recomputing the forward",
                         "fuse_ops": "--fuse-ops"}
"""Changes modelled on a data-parallel job only (DDP's buckets, hooks, no_sync and forward marker;
the same job over more ranks)."""
FSDP_TOO = ("recompute_forward",)
"""Of those, the changes modelled on an FSDP2 job too (no pipeline, no tensor parallel)."""


def _check_applies(analysis: RunAnalysis, change: Change) -> None:
    """A one-line error for a change this job's parallelism has no model of."""
    parallelism = analysis.parallelism
    piped = [flag for flag, value in (("--microbatches", change.microbatches), ("--schedule", change.schedule),
                                      ("--microbatch-run", change.microbatch_run),
                                      ("--without-probe", change.probe_steps)) if value is not None]
    for flag, value in (("--microbatch-run", change.microbatch_run), ("--without-probe", change.probe_steps)):
        if value is not None and change.microbatches is None and change.schedule is None:
            raise DproError(f"{flag} goes with --microbatches or --schedule")
    if change.microbatch_run is not None and change.probe_steps is not None:
        raise DproError("--without-probe and --microbatch-run: give one (the second count is the other recording's)")
    if piped and parallelism.pipeline is None:
        raise DproError(f"{' and '.join(piped)} apply to pipeline-parallel jobs; this job is {parallelism.describe()}")
    if parallelism.data_parallel_only:
        return
    fsdp_only = bool(parallelism.fsdp) and parallelism.pipeline is None and not parallelism.tensor_parallel
    asked = [flag for name, flag in DATA_PARALLEL_CHANGES.items() if getattr(change, name) not in (None, False)
             and not (fsdp_only and name in FSDP_TOO)]
    if asked:
        raise DproError(f"{', '.join(asked)} models a data-parallel job; this job is {parallelism.describe()}: "
                        "only --bandwidth-scale and, for FSDP, --[no-]reshard-after-forward, --forward-prefetch, "
                        "--merge-units and --fsdp-mesh, for tensor parallel, --tp-mesh, for a pipeline, "
                        "--microbatches and --schedule apply to it")


def _layout(analysis: RunAnalysis) -> DdpLayout:
    layout = analysis.ddp_layout
    if not layout or not layout.buckets:
        raise DproError(f"{analysis.root} holds no DDP bucket layout (the job used no DistributedDataParallel)")
    return layout


def _ddp_buckets(analysis: RunAnalysis, graph: Any) -> list[tuple[int, int]]:
    """(occurrence, bytes) of DDP's bucket all-reduces in the graph, in the order of the recorded
    buckets (the step's all-reduces whose sizes are the buckets', in a row)."""
    sizes = analysis.bucket_bytes()
    table = graph.collectives
    reduces = table[table["coll"] == "all_reduce"].sort_values("occurrence") if len(table) else table
    found = reduces["bytes"].to_numpy(np.float64) if len(reduces) else np.empty(0)
    for first in range(len(found) - len(sizes) + 1):
        if sizes and np.allclose(found[first:first + len(sizes)], sizes):
            return list(zip(reduces["occurrence"].iloc[first:first + len(sizes)].astype(int).tolist(), sizes))
    raise DproError("the graph's all-reduces do not match the recorded DDP buckets")


def _buckets(layout: DdpLayout, cap_mb: float | None, first_mb: float | None = None) -> list[list[Param]]:
    """The parameters of every bucket, in all-reduce order: as recorded, or as DDP builds them
    for a cap of ``cap_mb`` (else the recorded cap) and a first bucket of ``first_mb`` (else
    what DDP's first cap is with that cap)."""
    ready = ready_order(layout)
    if cap_mb is None and first_mb is None:
        ends = np.cumsum([len(b.params) for b in layout.buckets])
        return [ready[start:end] for start, end in zip(np.r_[0, ends[:-1]], ends)]
    cap = layout.bucket_cap_bytes if cap_mb is None else int(cap_mb * 2 ** 20)
    first = first_bucket_bytes(layout, cap) if first_mb is None else int(first_mb * 2 ** 20)
    return rebuilt_buckets(ready, cap, first)


def _rebucket(w: WhatIf, graph: DataflowGraph, layout: DdpLayout, ddp: list[tuple[int, int]],
              new: list[list[Param]]) -> tuple[list[tuple[int, int]], int | str]:
    """Apply the ``new`` buckets in place of the recorded ones (``ddp``, in the graph): for each
    new bucket, the all-reduce that now carries it and its bytes; and how many all-reduces are
    now issued earlier (or why none could be)."""
    old_of = {p.name: i for i, b in enumerate(layout.buckets) for p in b.params}
    position = {p.name: k for k, p in enumerate(ready_order(layout))}
    ends_in: dict[int, list[Param]] = {}
    for bucket in new:
        ends_in.setdefault(old_of[bucket[-1].name], []).append(bucket)
    groups, pending, survivors = [], [], []
    for i, (occurrence, _) in enumerate(ddp):
        pending.append(occurrence)
        if i in ends_in:
            groups.append(pending)
            survivors.append((occurrence, i, ends_in[i]))
            pending = []
    w.fuse_buckets([g for g in groups if len(g) > 1])
    ready_ops = _gradient_ready_ops(graph, len(position))
    reissued: int | str = 0 if isinstance(ready_ops, dict) else ready_ops
    out = []
    for occurrence, i, parts in survivors:
        recorded_last = position[layout.buckets[i].params[-1].name]
        sizes = [sum(p.nbytes for p in bucket) for bucket in parts]
        if not isinstance(ready_ops, dict):  # no op to issue the earlier parts: one after the other, with the last
            w.set_collective_bytes("all_reduce", occurrence, float(sum(sizes)), parts=len(parts))
            out += [(occurrence, size) for size in sizes]
            continue
        for part, bucket, size in zip(w.split_collective("all_reduce", occurrence, len(parts)), parts, sizes):
            w.set_collective_bytes("all_reduce", part, float(size))
            last = position[bucket[-1].name]
            if last != recorded_last and w.reissue("all_reduce", part, {r: int(ops[last]) for r, ops in ready_ops.items()}):
                reissued = int(reissued) + 1
            out.append((part, size))
    return out, reissued


def _gradient_ready_ops(graph: DataflowGraph, count: int) -> dict[int, np.ndarray] | str:
    """Per rank, its ops that make gradients ready (autograd's ``AccumulateGrad``, where DDP's
    hook marks a gradient ready and issues a full bucket), in order: the k-th readies the k-th
    parameter in the recorded ready order (the order of DDP's rebuilt buckets, which holds while
    the autograd graph does not change). A string saying why not, unless every rank has
    ``count`` of them."""
    nodes = graph.nodes
    mine = nodes[nodes["name"] == ACCUMULATE_GRAD_EVENT]
    found = {int(r): g.sort_values("offset_ns").index.to_numpy() for r, g in mine.groupby("rank", observed=True)}
    ranks = sorted(set(nodes.loc[nodes["kind"] != "transfer", "rank"].astype(int)))
    short = [r for r in ranks if len(found.get(r, ())) != count]
    if short:
        return (f"rank {short[0]} shows {len(found.get(short[0], ()))} AccumulateGrad ops for {count} parameters: "
                "every all-reduce stays where it was issued")
    return found


def _compress(w: WhatIf, analysis: RunAnalysis, ddp: list[tuple[int, int]], name: str) -> dict[str, float]:
    """Apply the hook ``name`` to every DDP all-reduce: its bytes sent per byte of gradient, and
    its compute per step (ms, from the calibration)."""
    rows = _calibrated(analysis, name, f"the {name} hook's compute")
    nbytes = np.array([r.size for r in rows], np.float64)
    ns = np.array([r.median_ns for r in rows], np.float64)
    per_byte = float(np.sum(nbytes * ns) / np.sum(nbytes * nbytes))
    totals: dict[int, int] = {}
    for occurrence, b in ddp:
        totals[occurrence] = totals.get(occurrence, 0) + b
    for occurrence, b in totals.items():
        w.compress("all_reduce", occurrence, CAST_BYTES_RATIO, b * per_byte)
    return {"bytes_ratio": CAST_BYTES_RATIO, "hook_ms": sum(totals.values()) * per_byte / 1e6}


def _calibrated(analysis: RunAnalysis, part: str, what: str) -> list[Timing]:
    """Every rank's ``compression`` calibration rows of ``part`` (``fp16``, ``matmul``...)."""
    rows = [row for c in analysis.calibrations.values() for row in c.compression.get(part, ())]
    if not rows:
        raise DproError(f"{analysis.root} has no calibration of {what} "
                        "(recorded with --no-calibrate, or by an older dpro)")
    return rows


def _powersgd(w: WhatIf, analysis: RunAnalysis, ddp: list[tuple[int, int]], buckets: list[list[Param]],
              rank: int) -> dict[str, float]:
    """DDP's PowerSGD hook of ``rank`` on every bucket (``powerSGD_hook``): each gradient
    matrix worth compressing (rows x the rest, :data:`MIN_COMPRESSION_RATE` times smaller as
    factors) is sent as its factors P (rows x rank) and Q (columns x rank), each all-reduced in
    turn; vectors and the rest are all-reduced as they are first. Three all-reduces per bucket
    (each paying the fixed cost) of the bytes the hook sends; its matrix products (three per
    matrix: M Q, M^T P, P Q^T) timed from the calibration's."""
    rows = _calibrated(analysis, POWERSGD_MATMUL, "the PowerSGD hook's compute")
    ns_per_flop = float(np.median([r.median_ns / r.size for r in rows]))
    per_call: dict[int, list[float]] = {}  # occurrence -> [gradient bytes, bytes sent, flops, buckets]
    for (occurrence, _), bucket in zip(ddp, buckets):
        totals = per_call.setdefault(occurrence, [0.0, 0.0, 0.0, 0])
        for p in bucket:
            n = p.shape[0] if len(p.shape) > 1 else 0
            m = p.numel // n if n else 0
            compressed = bool(n) and (n + m) * rank * MIN_COMPRESSION_RATE < n * m
            totals[0] += p.nbytes
            totals[1] += (n + m) * rank * p.itemsize if compressed else p.nbytes
            totals[2] += 3 * 2 * n * m * rank if compressed else 0
        totals[3] += 1
    for occurrence, (gradient, sent, flops, count) in per_call.items():
        w.set_collective_bytes("all_reduce", occurrence, gradient, parts=3 * int(count))
        w.compress("all_reduce", occurrence, sent / gradient, flops * ns_per_flop)
    gradient_total = sum(t[0] for t in per_call.values())
    sent_total = sum(t[1] for t in per_call.values())
    hook_ns = sum(t[2] for t in per_call.values()) * ns_per_flop
    return {"bytes_ratio": sent_total / gradient_total, "hook_ms": hook_ns / 1e6}


def _world_size(w: WhatIf, analysis: RunAnalysis, world_size: int, ranks_per_host: int | None) -> str:
    """Re-size every collective for ``world_size`` ranks; the link class they then cross."""
    recorded = len(analysis.ranks) / max(len(set(analysis.hosts.values())), 1)
    per_host = ranks_per_host or max(int(recorded), 1)
    cls = "intra" if math.ceil(world_size / per_host) == 1 else "inter"
    try:
        w.set_world_size(world_size, cls)
    except WhatIfError as e:
        raise DproError(f"{e}: {world_size} ranks at {per_host} per host need {cls}-host links "
                        "(--ranks-per-host sets how many ranks share a host)") from None
    return cls
