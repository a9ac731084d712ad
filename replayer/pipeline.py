"""A pipeline-parallel step replayed from its stages' costs, under any micro-batch count and schedule.

Each stage runs its micro-batches' forward (``F``) and backward (``B``) passes in the order its
schedule gives (:func:`stage_order`), one at a time. A stage's forward of micro-batch ``i``
needs the previous stage's (its activation, sent over their link), its backward the next
stage's (the gradient, sent back); the last stage's backward follows its own forward. A send
starts when its pass has ended and the link is free (one send at a time each way) and takes
what the recording's sends took, waiting for their receivers included (as the recorded graph
times them). A stage waits for its own sends as torch's schedules do: ``ScheduleGPipe`` for
all its forward sends before its first backward pass and for the rest at the step's end;
``Schedule1F1B`` for each send before its next pass (it waits for it, or batches it with the
next receive).

A pass of a micro-batch ``size`` times the recorded one takes ``fixed + (time - fixed) * size``:
its fixed part (the calls' overhead) whatever the batch, the rest in proportion; so does a send.
The step of a stage is its work before the pipeline, the pipeline, the wait for its last sends'
delivery, and its work after (the optimizer); the step is the longest stage's.

    >>> costs = [StageCost(forward_ns=10, backward_ns=20)] * 2
    >>> step_ns(costs, microbatches=4, schedule="gpipe")  # (4 + 2 - 1) * (10 + 20)
    150.0
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SCHEDULES", "StageCost", "in_flight", "schedule_name", "stage_order", "step_ns"]

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}
"""The schedules modelled: the name ``dpro whatif --schedule`` takes, and torch's class."""


@dataclass(frozen=True)
class StageCost:
    """One stage's work, per micro-batch of the recorded size: its passes (``*_fixed_ns`` of
    them not scaling with the micro-batch), its sends of the activation to the next stage and
    of the gradient to the previous one, and its work before and after the pipeline per step."""

    forward_ns: float
    backward_ns: float
    forward_fixed_ns: float = 0.0
    backward_fixed_ns: float = 0.0
    send_forward_ns: float = 0.0
    send_backward_ns: float = 0.0
    send_forward_fixed_ns: float = 0.0
    send_backward_fixed_ns: float = 0.0
    before_ns: float = 0.0
    after_ns: float = 0.0


def schedule_name(recorded: str) -> str:
    """``gpipe`` or ``1f1b`` for torch's schedule class name; ValueError for others."""
    for name, cls in SCHEDULES.items():
        if recorded == cls or recorded.lower() == name:
            return name
    raise ValueError(f"the pipeline schedule {recorded!r} is not modelled (only {', '.join(SCHEDULES.values())})")


def in_flight(schedule: str, microbatches: int, stage: int, stages: int) -> int:
    """The micro-batches stage ``stage`` of ``stages`` has run forward and not yet backward at
    most: all of them under GPipe; under 1F1B its warm-up's, ``stages - stage`` (at most all)."""
    return microbatches if schedule == "gpipe" else min(microbatches, stages - stage)


def stage_order(schedule: str, stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """The passes ``("F" | "B", micro-batch)`` stage ``stage`` of ``stages`` runs, in order:
    GPipe every forward then every backward; 1F1B (torch's ``Schedule1F1B``) ``stages - stage``
    forwards (at most all), then a backward and a forward in turn, then the remaining backwards."""
    if schedule == "gpipe":
        return [("F", i) for i in range(microbatches)] + [("B", i) for i in range(microbatches)]
    if schedule != "1f1b":
        raise ValueError(f"unknown schedule {schedule!r}")
    warmup = in_flight(schedule, microbatches, stage, stages)
    order = [("F", i) for i in range(warmup)]
    forward, backward = warmup, 0
    while backward < microbatches:
        order.append(("B", backward))
        backward += 1
        if forward < microbatches:
            order.append(("F", forward))
            forward += 1
    return order


def _scaled(total: float, fixed: float, size: float) -> float:
    fixed = min(max(fixed, 0.0), total)
    return fixed + (total - fixed) * size


def step_ns(costs: list[StageCost], microbatches: int, schedule: str, size: float = 1.0) -> float:
    """The step time of the pipeline of ``costs`` (stage 0 first) with ``microbatches``
    micro-batches of ``size`` times the recorded one, under ``schedule``."""
    stages = len(costs)
    if stages < 1 or microbatches < 1:
        raise ValueError("a pipeline needs a stage and a micro-batch")
    forward = [_scaled(c.forward_ns, c.forward_fixed_ns, size) for c in costs]
    backward = [_scaled(c.backward_ns, c.backward_fixed_ns, size) for c in costs]
    send_f = [_scaled(c.send_forward_ns, c.send_forward_fixed_ns, size) for c in costs]
    send_b = [_scaled(c.send_backward_ns, c.send_backward_fixed_ns, size) for c in costs]
    orders = [stage_order(schedule, s, stages, microbatches) for s in range(stages)]
    done: dict[tuple[str, int, int], float] = {}  # (pass, stage, micro-batch) -> its end
    delivered: dict[tuple[str, int, int], float] = {}  # the same key: when its output was at its receiver
    link_free = {("F", s): 0.0 for s in range(stages)} | {("B", s): 0.0 for s in range(stages)}
    clock = [c.before_ns for c in costs]
    last_sent: list[tuple[str, int, int] | None] = [None] * stages
    nxt = [0] * stages
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(stages):
            while nxt[s] < len(orders[s]):
                kind, i = orders[s][nxt[s]]
                inputs = [("F", s - 1, i)] if kind == "F" and s > 0 else [("B", s + 1, i)] if kind == "B" and s < stages - 1 else []
                own = [last_sent[s]] if schedule == "1f1b" and last_sent[s] is not None else []
                if schedule == "gpipe" and kind == "B" and i == 0 and s < stages - 1:
                    own = [("F", s, j) for j in range(microbatches)]  # ScheduleGPipe's wait before its backward
                if any(w not in delivered for w in inputs):
                    break  # not sent yet
                ready = max([delivered[w] for w in inputs + own] + [done.get(("F", s, i), 0.0) if kind == "B" else 0.0])
                end = max(clock[s], ready) + (forward[s] if kind == "F" else backward[s])
                clock[s] = done[(kind, s, i)] = end
                if (kind == "F" and s < stages - 1) or (kind == "B" and s > 0):  # its output, sent on
                    begin = max(end, link_free[(kind, s)])
                    link_free[(kind, s)] = delivered[(kind, s, i)] = begin + (send_f[s] if kind == "F" else send_b[s])
                    last_sent[s] = (kind, s, i)
                nxt[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # cannot happen for the schedules above; a guard against a bad order
            raise ValueError(f"the {schedule} order deadlocks over {stages} stages")
    sends_done = [max([t for (_, p, _), t in delivered.items() if p == s], default=0.0) for s in range(stages)]
    return max(max(clock[s], sends_done[s]) + costs[s].after_ns for s in range(stages))
