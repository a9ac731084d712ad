"""A pipeline's micro-batch count and schedule: the bubble against the micro-batches' fixed costs and memory.

More micro-batches shrink the pipeline's bubble (``(stages - 1) / (M + stages - 1)`` of an even
pipeline's step) but each pays its ops' fixed cost; 1F1B holds at most ``stages`` micro-batches'
activations where GPipe holds all ``M``, and lets a slow stage start its backward passes
earlier. The pass proposes half and twice the recorded count, and the other schedule with each;
the search weighs the step time the cost model predicts (:func:`dpro.analysis.whatif.predict`,
``microbatches`` and ``schedule``) against the memory :mod:`dpro.optimizer.memory_estimate` estimates.
``--apply`` sets both; the batch must divide into the micro-batches. The ops' fixed cost per
micro-batch comes from the run's probe steps (:mod:`dpro.collectors.probe`); from a recording
without them it is unknown, and a new count is predicted as a range: the search ranks it by
the range's slow end.
"""

from __future__ import annotations

from dpro.analysis.run import RunAnalysis
from dpro.replayer.pipeline import schedule_name

from dpro.optimizer.passes.base import Proposals

__all__ = ["pipeline_schedule"]


def pipeline_schedule(analysis: RunAnalysis) -> Proposals:
    """Half and twice the recorded micro-batches, under either schedule (1F1B with no fewer
    micro-batches than stages, as torch requires)."""
    pipeline = analysis.parallelism.pipeline
    if pipeline is None:
        return Proposals(why="the job has no pipeline schedule")
    try:
        recorded = schedule_name(str(pipeline["schedule"]))
    except ValueError as e:
        return Proposals(why=str(e))
    count, stages = int(pipeline["microbatches"]), int(pipeline["num_stages"])
    counts = [c for c in (count // 2 if count % 2 == 0 else 0, count, 2 * count) if c >= 1]
    proposals = []
    for c in counts:
        for schedule in ("gpipe", "1f1b"):
            if (c, schedule) == (count, recorded) or (schedule == "1f1b" and c < stages):
                continue
            proposals.append({**({"pipeline_microbatches": c} if c != count else {}),
                              **({"pipeline_schedule": schedule} if schedule != recorded else {})})
    return Proposals(proposals)
