"""A recorded pipeline's stages, as the costs :mod:`dpro.replayer.pipeline` replays
(``dpro whatif --microbatches/--schedule``).

Read from the graph under the change made so far (:class:`~dpro.replayer.graph_edits.WhatIf`'s
durations), each rank one stage (``meta.json``'s ``parallel.pipeline``). A rank's CPU ops in
the step, each with the time before it on its thread (the interpreter between ops), are:

- **backward**: torch's ``Backward i`` ranges (GPipe) or autograd's functions;
- **after**: every op after the last backward op (the gradients' scaling, the optimizer), and
  the thread's time from its last op of a step to its first of the next;
- **before**: the ops before the pipeline starts (the schedule's ``Forward 0`` or its split of
  the batch into micro-batches, ``aten::tensor_split``), where such a mark exists;
- **forward**: the rest (the stage's forward passes, the last stage's loss).

The forward and backward times are divided over the recorded micro-batches; the time between a wait's end and the op that waited going on
is that op's (the graph keeps it on the wait's edge), but after the last backward op, where the
stage waits for its sends to be delivered (:mod:`dpro.replayer.pipeline` replays that wait). Their fixed part,
what a smaller micro-batch would not save, is the time between ops and, of every op, what an op
that does no work takes on that rank (the median view op, :func:`~dpro.analysis.cpu_ops.view_op_ns`);
what a kernel or a custom op spends whatever its input's size is not seen at one micro-batch
count, so more micro-batches are predicted to cost less than they do where that is large. A
second count shows it (:func:`fixed_shares`): the run's own probe steps at half its
micro-batches (:mod:`dpro.collectors.probe`), or a second recording of the same job. A
send's fixed part is what it took beyond its bytes at the link's measured rate (the
calibration's TCP streams).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from dpro.graph.vocabulary import P2P_FAMILIES, collective_family
from dpro.replayer.linkmodel import wire_rates
from dpro.replayer.pipeline import StageCost
from dpro.replayer.graph_edits import WhatIf, WhatIfError
from dpro.run_format import BACKWARD_EVENT_PREFIX

from dpro.analysis.cpu_ops import cpu_ops, once_per_rank, view_op_ns
from dpro.analysis.run import RunAnalysis

__all__ = ["fixed_shares", "stage_costs"]

BACKWARD_RANGE = re.compile(r"^Backward \d+$")
PIPELINE_STARTS = re.compile(r"^(Forward 0|aten::tensor_split)$")
"""torch's range around a GPipe stage's backward pass of a micro-batch, and where a stage's
schedule starts (GPipe's first forward range, or the schedule's split of the batch, which the
first and last stages make). A middle stage under 1F1B has neither: its work before the
schedule (``zero_grad``) is then counted as forward."""


def stage_costs(w: WhatIf, analysis: RunAnalysis) -> list[StageCost]:
    """Each stage's :class:`StageCost` (stage 0 first) of the pipeline job ``analysis`` recorded,
    as ``w`` now times its graph; WhatIfError where the job is not one stage per rank."""
    parallelism = analysis.parallelism
    pipeline = parallelism.pipeline
    if pipeline is None:
        raise WhatIfError("--microbatches and --schedule apply to pipeline-parallel jobs; "
                          f"this job is {parallelism.describe()}")
    stages = int(pipeline["num_stages"])
    if sorted(parallelism.stages.values()) != list(range(stages)) or len(parallelism.stages) != parallelism.world_size:
        raise WhatIfError(f"the pipeline what-if models one stage per rank and no other parallelism; this job is "
                          f"{parallelism.describe()} over {parallelism.world_size} ranks")
    if (w.graph.nodes["kind"] == "gpu").any():
        raise WhatIfError("the pipeline what-if reads stages' passes from their CPU ops; on a GPU those are the "
                          "kernels' launches, and sends on NCCL are not paired yet")
    microbatches = int(pipeline["microbatches"])
    stage_of = parallelism.stages
    rank_of = {s: r for r, s in stage_of.items()}
    nodes = w.graph.nodes
    names = nodes["name"].astype(str)
    backward = (names.str.match(BACKWARD_RANGE) | names.str.startswith(BACKWARD_EVENT_PREFIX)).to_numpy()
    starts = names.str.match(PIPELINE_STARTS).to_numpy()
    gap, resumed = (_most_lag(w.edges[w.edges["kind"] == kind], "dst", len(nodes)) for kind in ("order", "wait"))
    events = nodes["events"].fillna(1).to_numpy(np.float64)
    offsets = nodes["offset_ns"].to_numpy(np.float64)
    main = ((nodes["kind"] == "cpu") & ~nodes["resource"].astype(str).str.contains("/p2p")).to_numpy()
    sends = _sends(w, analysis, stage_of)
    wrap = _most_lag(w.graph.wraps, "src", len(nodes))  # a thread's time from its last op of a step to its first of the next
    costs = []
    for s in range(stages):
        r = rank_of[s]
        mine = main & (nodes["rank"] == r).to_numpy()
        if not (mine & backward).any():
            raise WhatIfError(f"rank {r} (stage {s}) shows no backward pass in the recorded step")
        last = offsets[mine & backward].max()
        first = offsets[mine & starts].min() if (mine & starts).any() else -np.inf
        after = mine & (offsets > last)
        before = mine & (offsets < first)
        passes = mine & ~after & ~before
        per_op = _per_op_ns(analysis, r)
        work = w.durations + np.where(after, 0.0, resumed)  # after the passes, a wait is for the sends' delivery
        cost = work + gap
        fixed = gap + np.minimum(work, per_op * events)
        f, b = passes & ~backward, passes & backward
        forward_send, backward_send, forward_fixed, backward_fixed = sends.get(s, (0.0, 0.0, 0.0, 0.0))
        costs.append(StageCost(forward_ns=cost[f].sum() / microbatches, backward_ns=cost[b].sum() / microbatches,
                               forward_fixed_ns=fixed[f].sum() / microbatches,
                               backward_fixed_ns=fixed[b].sum() / microbatches,
                               send_forward_ns=forward_send / microbatches, send_backward_ns=backward_send / microbatches,
                               send_forward_fixed_ns=forward_fixed / microbatches,
                               send_backward_fixed_ns=backward_fixed / microbatches, before_ns=float(cost[before].sum()),
                               after_ns=float(cost[after].sum() + wrap[mine].max())))
    return costs


def _most_lag(edges: pd.DataFrame, end: str, n: int) -> np.ndarray:
    """Per node (of ``n``), the largest ``lag_ns`` of the ``edges`` at its ``end`` (``src`` or ``dst``); 0 if none."""
    lag = np.zeros(n)
    np.maximum.at(lag, edges[end].to_numpy(np.int64), edges["lag_ns"].to_numpy(np.float64))
    return lag


@once_per_rank
def _per_op_ns(analysis: RunAnalysis, rank: int) -> float:
    """What an op that does no work takes on the rank (its median view op); once per run and rank."""
    return view_op_ns(cpu_ops(analysis, rank))


def _sends(w: WhatIf, analysis: RunAnalysis, stage_of: dict[int, int]) -> dict[int, tuple[float, float, float, float]]:
    """Per stage: its sends' time a step to the next stage and to the previous one, and of each
    the fixed part (what they took beyond their bytes at the link's measured rate; all of it
    where the rate or the bytes are unknown)."""
    rates = wire_rates(analysis.calibrations, analysis.hosts)
    nodes = w.graph.nodes
    found: dict[int, list[float]] = {}
    for row in w.graph.collectives.itertuples():
        if collective_family(str(row.coll)) not in P2P_FAMILIES:
            continue
        for v in row.sends:
            src, dst = (int(x) for x in str(nodes.at[v, "resource"]).removeprefix("link/").split("->"))
            s, peer = stage_of.get(src), stage_of.get(dst)
            if s is None or peer is None or abs(s - peer) != 1:
                continue
            t = float(w.durations[v])
            rate = rates.get("intra" if analysis.hosts.get(src) == analysis.hosts.get(dst) else "inter")
            nbytes = float(nodes.at[v, "bytes"])
            wire = nbytes / rate if rate and nbytes == nbytes else 0.0
            totals = found.setdefault(s, [0.0, 0.0, 0.0, 0.0])
            way = 0 if peer == s + 1 else 1
            totals[way] += t
            totals[2 + way] += max(t - wire, 0.0)
    return {s: (f, b, ff, bf) for s, (f, b, ff, bf) in found.items()}


def fixed_shares(recorded: list[StageCost], m: int, other: list[StageCost], k: int) -> list[tuple[float, float]]:
    """Each stage's fixed share of its forward and its backward pass, fitted from two recordings
    of the same pipeline at ``m`` and ``k`` micro-batches: a pass of a micro-batch takes
    ``fixed + variable / M`` (``variable`` the whole batch's), so two counts give both parts."""
    if m == k:
        raise WhatIfError(f"both recordings split the batch into {m} micro-batches: a second count is needed")
    if len(recorded) != len(other):
        raise WhatIfError(f"the recordings' pipelines have {len(recorded)} and {len(other)} stages")
    shares = []
    for a, b in zip(recorded, other):
        pair = []
        for at_m, at_k in ((a.forward_ns, b.forward_ns), (a.backward_ns, b.backward_ns)):
            variable = (at_m - at_k) / (1 / m - 1 / k)
            fixed = at_m - variable / m
            pair.append(min(max(fixed / at_m, 0.0), 1.0) if at_m > 0 else 0.0)
        shares.append((pair[0], pair[1]))
    return shares
