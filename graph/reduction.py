"""The per-rank stage of the analysis: one rank's trace reduced to what the global stage needs.

:func:`reduce_trace` decodes one rank's trace (through the trace cache) and keeps only small
tables: its typical step (:mod:`dpro.graph.typical`), its collective instances over every
profiled step (:func:`dpro.graph.matching.rank_instances`) and its profiled steps. It is a plain function of a path, so it runs wherever the trace can be read: in this
process, in a process pool or on a Dask worker; the global stage (matching, clock alignment,
the dataflow graph) sees these reductions only, never the events.

    >>> reduction = reduce_trace("run1/ranks/0/trace.json.gz", rank=0)     # doctest: +SKIP
    >>> reduction.step.step_ns, len(reduction.instances)                   # doctest: +SKIP
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pandas as pd

import dataclasses

from dpro.graph.collective_labels import label, read_log
from dpro.graph.kineto import TraceTables, load_trace
from dpro.graph.matching import rank_instances
from dpro.graph.typical import RankStep, typical_step

__all__ = ["RankReduction", "reduce_tables", "reduce_trace"]


@dataclass
class RankReduction:
    """What the global stage needs of one rank: ``step`` (its typical step over ``step.steps``),
    ``instances`` (collective instances, the rank's own clock) and ``profiled_steps`` (``step``,
    ``start_ns``, ``end_ns`` of its ``ProfilerStep#N`` events)."""

    rank: int
    step: RankStep
    instances: pd.DataFrame
    profiled_steps: pd.DataFrame

    @property
    def steps(self) -> list[int]:
        """Every profiled step of the rank's trace."""
        return [int(s) for s in self.profiled_steps["step"]]


def reduce_tables(tables: TraceTables, rank: int, steps: list[int] | None = None,
                  log: dict | None = None) -> RankReduction:
    """Reduce one rank's trace tables; the typical step is made of ``steps`` (default: all).
    ``log``: the rank's collective log (:mod:`dpro.graph.collective_labels`), which labels the
    groups and peers a CPU trace does not name."""
    tables = dataclasses.replace(tables, events=label(tables.events, log))
    instances = rank_instances(tables.events, rank)
    chosen = [int(s) for s in tables.steps["step"]] if steps is None else list(steps)
    return RankReduction(rank, typical_step(tables, rank, chosen, instances), instances.drop(columns="event"),
                         tables.steps.copy())


def reduce_trace(path: str | os.PathLike, rank: int, cache_dir: str | os.PathLike | None = None,
                 steps: list[int] | None = None, log_path: str | os.PathLike | None = None) -> RankReduction:
    """Load one rank's trace (cached in ``cache_dir``) and reduce it (:func:`reduce_tables`) with
    the collective log at ``log_path``, if any."""
    return reduce_tables(load_trace(path, rank=rank, cache_dir=cache_dir), rank, steps, read_log(log_path))
