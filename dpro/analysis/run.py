"""The run model: a recorded run opened once, and everything the analysis derives from it.

:class:`RunAnalysis` is what every command and library entry point takes instead of a path.
Opening it reads only the manifest; each part is computed on first use and kept:

- cheap facts read from the run directory: ranks, hosts, per-rank metadata, step times
  (``steps.csv``), recorded clock offsets;
- the *per-rank stage* (:mod:`dpro.graph.reduction`: each rank's trace decoded and reduced to
  its typical step and collective instances), fanned out over a process pool or a Dask cluster
  (:mod:`dpro.analysis.fanout`);
- the *global stage*, on the reductions only: the collectives matched across ranks
  (:func:`dpro.graph.matching.match`, the one matcher), the refined clock offsets and the
  dataflow graph;
- replays of the graph.

The global stage's results and the replay are stored as versioned Parquet in the run's
``derived/`` folder (or the user's cache when the run is read-only; see
:mod:`dpro.graph.store`), keyed by the formats and the code that built them, the options and
every input file's size and modification time (the code: every module this one imports,
found from the imports, :func:`dpro.code_hash.code_hash`): a second command on an unchanged run decodes
no trace and builds no graph. The traces' own caches go there too (``derived/traces/``).

    >>> analysis = RunAnalysis.open("run1")                    # doctest: +SKIP
    >>> analysis.graph, analysis.replay().step_ns              # doctest: +SKIP
    >>> analysis.collectives                                   # doctest: +SKIP
"""

from __future__ import annotations

import os
import warnings
from functools import cached_property
from pathlib import Path
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from dpro.analysis.fanout import map_ranks
from dpro.code_hash import code_hash
from dpro.errors import DproError, PartialRunWarning
from dpro.graph import store
from dpro.graph.collectives import nccl_log_algorithms
from dpro.graph.dataflow import DataflowGraph, GraphError, build_graph, common_steps
from dpro.analysis.parallelism import Parallelism
from dpro.graph.kineto import TraceFormatError, TraceTables, load_trace
from dpro.graph.kineto.allocator import MemoryTrace
from dpro.graph.kineto.shapes_step import ShapesStep, load_shapes_step
from dpro.graph.matching import match
from dpro.graph.reduction import RankReduction, reduce_trace
from dpro.replayer.breakdown import mean_breakdown
from dpro.replayer.result import Replay
from dpro.run_format import Run, open_run
from dpro.run_records import Calibration, DdpLayout, RankMeta
from dpro.stats import job_mean

__all__ = ["RunAnalysis", "STALLED", "undecodable_trace"]

T = TypeVar("T")
STALLED = 1.5  # a profiled step this many times the window's median step is left out of the typical step


class RunAnalysis:
    """A run opened once (see the module docstring).

    ``align``: align the ranks' clocks (recorded offsets refined with the collectives);
    ``scheduler``: a Dask scheduler address for the per-rank stage (default
    ``$DPRO_SCHEDULER``); ``workers``: the local process pool's size (default: the cores);
    ``progress``: a progress bar on stderr for the per-rank stage; ``cache``: read and write
    the stored analysis (``False`` recomputes everything and stores nothing); ``strict``: a
    rank whose trace cannot be decoded is an error (by default the graph is built without it
    and a :class:`~dpro.errors.PartialRunWarning` says so).
    """

    def __init__(self, run: Run, *, align: bool = True, scheduler: str | None = None, workers: int | None = None,
                 progress: bool = False, cache: bool = True, strict: bool = False) -> None:
        self.run = run
        self.strict = strict
        self.align = align
        self.scheduler = scheduler
        self.workers = workers
        self.progress = progress
        self.cache = cache
        self.built = False  # whether this object decoded traces and built the graph (not read it from the cache)
        self._kept: dict[str, dict[int, Any]] = {}

    @classmethod
    def open(cls, path: str | os.PathLike, **options: Any) -> RunAnalysis:
        """Open the run directory at ``path`` (a one-line error if it is not one)."""
        return cls(open_run(path), **options)

    # --- read from the run directory ------------------------------------------------------------

    @property
    def root(self) -> Path:
        return self.run.root

    @cached_property
    def ranks(self) -> list[int]:
        return self.run.ranks

    @cached_property
    def metas(self) -> dict[int, RankMeta]:
        """Each rank's ``meta.json`` (not ``present`` where it is missing or unreadable: a
        partial run, which :attr:`dpro.run_format.Run.gaps` says)."""
        return {r: m or RankMeta() for r, m in self.run.metas.items()}

    @cached_property
    def parallelism(self) -> Parallelism:
        """How the job is parallel: process groups, mesh, FSDP units, pipeline (from the metadata)."""
        return Parallelism.of(self.metas)

    @cached_property
    def hosts(self) -> dict[int, str]:
        """Each rank's host ("" when not recorded)."""
        return {r: m.host for r, m in self.metas.items()}

    @cached_property
    def recorded_offsets(self) -> dict[int, int]:
        """Each rank's clock offset against rank 0 as ``dpro record`` measured it."""
        return {r: self.run.clock_offset_ns(r) for r in self.ranks}

    def steps(self, rank: int) -> pd.DataFrame:
        """Every step the rank timed (:meth:`dpro.run_format.Run.steps`)."""
        return self.run.steps(rank)

    @cached_property
    def step_times(self) -> pd.DataFrame:
        """Every timed step of every rank: ``rank``, ``step``, ``dur_ns``, ``phase``."""
        frames = [self.steps(r).dropna(subset=["dur_ns"]).assign(rank=r) for r in self.ranks]
        frames = [f for f in frames if len(f)]
        if not frames:
            return pd.DataFrame({"rank": pd.Series(dtype="int64"), "step": pd.Series(dtype="int64"),
                                 "dur_ns": pd.Series(dtype="int64"), "phase": pd.Series(dtype="str")})
        out = pd.concat(frames, ignore_index=True)
        return out[["rank", "step", "dur_ns", "phase"]].astype({"dur_ns": "int64"})

    @cached_property
    def unprofiled_steps(self) -> pd.DataFrame:
        """The rows of :attr:`step_times` outside the profiling window: the steps users run (after
        step 0, whose start is unknown, and outside every phase dpro marked)."""
        times = self.step_times
        return times[(times["phase"] == "") & (times["step"] > 0)]

    @cached_property
    def unprofiled_step_ns(self) -> dict[int, float]:
        """Each rank's median step time over :attr:`unprofiled_steps`; NaN where none."""
        medians = self.unprofiled_steps.groupby("rank")["dur_ns"].median()
        return {r: float(medians.get(r, float("nan"))) for r in self.ranks}

    @cached_property
    def baseline_step_ns(self) -> float:
        """The job's step time as users see it, the one baseline every command compares with:
        :attr:`unprofiled_step_ns` over the ranks (:func:`dpro.stats.job_mean`: ranks without
        such steps left out; NaN when no rank has one)."""
        return job_mean(self.unprofiled_step_ns)

    @cached_property
    def profiled_step_ns(self) -> dict[int, float]:
        """Each rank's median step time inside the profiling window (NaN where none)."""
        times = self.step_times
        medians = times[times["phase"] == "profiled"].groupby("rank")["dur_ns"].median()
        return {r: float(medians.get(r, float("nan"))) for r in self.ranks}

    @cached_property
    def calibrations(self) -> dict[int, Calibration]:
        """Each rank's ``calibration.json`` (empty where the run was not calibrated)."""
        return {r: self.run.calibration(r) for r in self.ranks}

    def profiler_cost_ns(self) -> dict[int, dict[str, float]]:
        """What the profiler cost per event on each rank of a calibrated host, by class of event:
        ``{"forward": ns, "backward": ns}`` (see :func:`dpro.collectors.calibration.profiler_cost`),
        each the median over the host's ranks (one machine, one cost; each rank's own
        measurement is disturbed by the others calibrating beside it). Runs calibrated before
        the classes were priced apart hold one cost for every event (``main``)."""
        measured = {r: c.event_costs for r, c in self.calibrations.items() if c.event_costs}
        out = {}
        for rank in measured:
            peers = [measured[r] for r in measured if self.hosts[r] == self.hosts[rank]]
            out[rank] = {k: float(np.median([p[k] for p in peers])) for k in ("forward", "backward")}
        return out

    @property
    def has_traces(self) -> bool:
        """Whether some rank wrote a trace (the graph is built over the ranks that did)."""
        return bool(self.traced_ranks)

    @property
    def traced_ranks(self) -> list[int]:
        """The ranks that wrote a trace: those the graph is made of (the others are a partial
        run's gap, :attr:`dpro.run_format.Run.gaps`)."""
        return self.run.traced_ranks

    @cached_property
    def ddp_layout(self) -> DdpLayout | None:
        """The job's first DistributedDataParallel module as the lowest rank that recorded one
        recorded it (caps, flags, hook, buckets); None when the job used no DDP."""
        return next((self.metas[r].ddp[0] for r in self.ranks if self.metas[r].ddp), None)

    def bucket_bytes(self) -> list[int]:
        """Bytes of each DDP gradient bucket, in the order they are all-reduced (from the lowest
        rank's metadata; empty when the job used no DDP or it was not recorded)."""
        return self.ddp_layout.bucket_bytes if self.ddp_layout else []

    # --- traces and the per-rank stage -----------------------------------------------------------

    def kept(self, name: str, rank: int, compute: Callable[[], T]) -> T:
        """``compute()``'s result for ``rank`` under ``name``, computed on the first call and kept
        with this run model (for the analyses' measurements of the traces)."""
        known = self._kept.setdefault(name, {})
        if rank not in known:
            known[rank] = compute()
        return known[rank]

    def input_shapes(self, rank: int) -> dict[tuple[int, str, int], str] | None:
        """The rank's ops' input shapes from its shapes step (:meth:`shapes_step`); None where the
        rank has no readable shapes step."""
        step = self.shapes_step(rank)
        return self.kept("input_shapes", rank, step.input_shapes) if step is not None else None

    def memory_trace(self, rank: int) -> MemoryTrace | None:
        """The allocator's events of the rank's shapes step (:class:`dpro.graph.kineto.allocator.MemoryTrace`);
        None where the rank has no readable shapes step."""
        step = self.shapes_step(rank)
        return step.memory if step is not None else None

    def shapes_step(self, rank: int) -> ShapesStep | None:
        """The rank's shapes step (:mod:`dpro.graph.kineto.shapes_step`), decoded once and then
        read from the trace cache; None where the rank has none or it cannot be read."""
        return self.kept("shapes_step", rank, lambda: self._shapes_step(rank))

    def _shapes_step(self, rank: int) -> ShapesStep | None:
        path = self.run.shapes_trace_path(rank)
        try:
            return load_shapes_step(path, self.trace_cache_dir(rank) if self.cache else None) if path else None
        except TraceFormatError:
            return None

    @cached_property
    def derived_dir(self) -> Path:
        return self.run.derived_dir()

    def trace_cache_dir(self, rank: int) -> Path:
        return self.derived_dir / "traces" / str(rank)

    def tables(self, rank: int) -> TraceTables:
        """One rank's trace as tables (decoded once, then read from the trace cache)."""
        path = self.run.trace_path(rank)
        if path is None:
            raise GraphError(f"{self.root}: rank {rank} wrote no trace")
        return load_trace(path, rank=rank, cache=self.cache, cache_dir=self.trace_cache_dir(rank))

    @cached_property
    def collective_logs(self) -> dict[int, Path | None]:
        """Each rank's collective log (``collectives.json``), used only where every rank has one:
        a rank without it would name its groups apart from the others' and match none of their
        collectives, so all ranks are then matched as a run without logs is."""
        paths = {r: self.run.collective_log_path(r) for r in self.traced_ranks}
        return paths if all(paths.values()) else dict.fromkeys(paths)

    def _reduce(self, ranks: list[int], steps: list[int] | None) -> dict[int, RankReduction | str]:
        tasks = [(self.run.trace_path(r), r, self.trace_cache_dir(r) if self.cache else None, steps,
                  self.collective_logs[r]) for r in ranks]
        results = map_ranks(_reduce_or_why, tasks, scheduler=self.scheduler, workers=self.workers,
                            progress=self.progress, desc="decoding traces")
        return dict(zip(ranks, results))

    def reductions(self) -> dict[int, RankReduction]:
        """The per-rank stage: every rank's reduction (:mod:`dpro.graph.reduction`), each typical
        step made of the steps all ranks profiled; computed each time it is called. Ranks whose
        trace cannot be decoded are left out (:meth:`_per_rank_stage` says which and why)."""
        return self._per_rank_stage()[0]

    def _per_rank_stage(self) -> tuple[dict[int, RankReduction], dict[int, str]]:
        if not self.traced_ranks:
            raise GraphError(f"{self.root}: no trace to analyse: {self.run.why_no_traces()}")
        results = self._reduce(self.traced_ranks, None)
        undecodable = {r: why for r, why in results.items() if isinstance(why, str)}
        reductions = {r: rd for r, rd in results.items() if not isinstance(rd, str)}
        if not reductions:
            raise GraphError(f"{self.root}: no rank's trace can be decoded ({next(iter(undecodable.values()))})")
        common = common_steps({r: rd.steps for r, rd in reductions.items()})
        kept = [s for s in common if s not in set(self.stalled_steps)] or common
        redo = [r for r, rd in reductions.items() if rd.step.steps != kept]
        if redo:  # a rank profiled steps the others did not, or stalled steps: reduce it again over the kept ones
            reductions.update({r: rd for r, rd in self._reduce(redo, kept).items() if not isinstance(rd, str)})
        return reductions, undecodable

    @property
    def undecodable(self) -> dict[int, str]:
        """The ranks that wrote a trace that cannot be decoded, each with why (one line): left out
        of the graph, as a partial run's missing ranks are (stored with the analysis)."""
        table = self._derived[1]["undecodable"]
        return dict(zip(table["rank"].astype(int), table["why"].astype(str)))

    @property
    def analysed_ranks(self) -> list[int]:
        """The ranks the graph is made of: those that wrote a trace that can be decoded."""
        return [r for r in self.traced_ranks if r not in self.undecodable]

    @cached_property
    def stalled_steps(self) -> list[int]:
        """Profiled steps that ran more than :data:`STALLED` times the window's median step on
        some rank: a stall the window's other steps did not have (a retransmission timeout, a
        burst of the machine). The typical step leaves them out, while they are at most half of
        the window: its ops' times are medians taken op by op, and stalls that fell in different
        places of a step on different ranks would otherwise mix into an order no step had."""
        times = self.step_times[self.step_times["phase"] == "profiled"]
        if times.empty:
            return []
        longest = times.groupby("step")["dur_ns"].max()
        stalled = longest[longest > STALLED * longest.median()].index
        return sorted(int(s) for s in stalled) if 2 * len(stalled) <= len(longest) else []

    # --- the global stage, stored --------------------------------------------------------------

    @cached_property
    def _folder(self) -> Path:
        return self.derived_dir / f"analysis-{'aligned' if self.align else 'unaligned'}"

    @cached_property
    def _key(self) -> dict[str, Any]:
        return {"code": code_hash("dpro.analysis.run"), "align": self.align,
                "inputs": store.file_stamps(self.root, self.run.analysis_inputs())}

    @cached_property
    def _derived(self) -> tuple[DataflowGraph, dict[str, pd.DataFrame]]:
        found = store.load_graph(self._folder, self._key) if self.cache else None
        if found is None:
            found = self._build()
        self._say_undecodable(found[1]["undecodable"])
        return found

    def _say_undecodable(self, table: pd.DataFrame) -> None:
        if table.empty:
            return
        what = "; ".join(undecodable_trace(r, why) for r, why in zip(table["rank"], table["why"]))
        text = f"partial run {self.root}: {what}"
        if self.strict:
            raise DproError(f"{text} (--strict)")
        warnings.warn(f"{text}; analysing the ranks there are (--strict to refuse)", PartialRunWarning, stacklevel=2)

    def _build(self) -> tuple[DataflowGraph, dict[str, pd.DataFrame]]:
        reductions, undecodable = self._per_rank_stage()
        logs = self.run.nccl_logs()
        graph = build_graph(reductions, self.recorded_offsets, align=self.align, bucket_bytes=self.bucket_bytes(),
                            algorithms=nccl_log_algorithms(logs) if logs else None, hosts=self.hosts,
                            profiler_ns=self.profiler_cost_ns())
        instances = match(pd.concat([rd.instances for rd in reductions.values()], ignore_index=True))
        profiled = pd.concat([rd.profiled_steps.assign(rank=r) for r, rd in reductions.items()], ignore_index=True)
        tables = {"instances": instances, "profiled_steps": profiled[["rank", "step", "start_ns", "end_ns"]],
                  "undecodable": pd.DataFrame({"rank": pd.Series(list(undecodable), dtype="int64"),
                                               "why": pd.Series(list(undecodable.values()), dtype="str")})}
        self.built = True
        if self.cache:
            self._folder.mkdir(parents=True, exist_ok=True)
            store.save_graph(self._folder, self._key, graph, tables)
        return graph, tables

    @property
    def graph(self) -> DataflowGraph:
        """The global dataflow graph of a typical step (:mod:`dpro.graph.dataflow`)."""
        return self._derived[0]

    @property
    def offsets(self) -> dict[int, int]:
        """The clock offsets applied: recorded, refined with the collectives (0 without ``align``)."""
        return self.graph.clock_offsets_ns

    @property
    def collectives(self) -> pd.DataFrame:
        """Every matched collective instance of every profiled step: ``rank``, ``step``,
        ``pg_name``, ``coll_name``, ``occurrence``, ``start_ns`` (aligned to rank 0's clock),
        ``dur_ns``, ``nbytes`` (NaN if unknown), ``group_size``."""
        instances = self._derived[1]["instances"].copy()
        instances["start_ns"] -= instances["rank"].map(self.offsets).fillna(0).astype("int64")
        return instances

    @property
    def profiled_steps(self) -> pd.DataFrame:
        """Each rank's profiled steps: ``rank``, ``step``, ``start_ns``, ``end_ns`` (its own clock)."""
        return self._derived[1]["profiled_steps"]

    # --- replays ---------------------------------------------------------------------------------

    def replay(self) -> Replay:
        """The replay of the recorded graph (stored beside it)."""
        return self._replay

    def unclosed_collectives(self) -> pd.DataFrame:
        """The collectives of a partial run that no other rank closed (:meth:`DataflowGraph.unclosed`);
        empty for a whole run, where an unmatched collective is one of a group of one rank, which
        closes alone."""
        unclosed = self.graph.unclosed()
        return unclosed if self.run.gaps or self.undecodable else unclosed.iloc[:0]

    def critical_path_breakdown(self) -> dict[str, float]:
        """Mean ms of the critical path's span and of each category
        (:func:`dpro.replayer.breakdown.breakdown`) over the ranks, in the replay of the recorded step."""
        return mean_breakdown(self.graph, self.replay())

    @cached_property
    def _replay(self) -> Replay:
        graph = self.graph
        key = self._key  # the code key covers the replayer: this module imports it
        if self.cache:
            found = store.load(self._folder, "replay", key)
            if found is not None:
                tables, info = found
                times = tables["times"]
                return Replay(times["start_ns"].to_numpy(), times["end_ns"].to_numpy(),
                              {int(r): float(v) for r, v in info["step_ns"].items()}, list(info["critical_path"]),
                              times["cause_edge"].to_numpy())
        from dpro.replayer.simulate import replay

        result = replay(graph)
        if self.cache:
            store.save(self._folder, "replay", key,
                       {"times": pd.DataFrame({"start_ns": result.start_ns, "end_ns": result.end_ns,
                                               "cause_edge": result.cause_edge})},
                       {"step_ns": {str(r): v for r, v in result.step_ns.items()},
                        "critical_path": [int(v) for v in result.critical_path]})
        return result


def undecodable_trace(rank: int, why: str) -> str:
    """The gap a rank whose trace cannot be decoded leaves, in the words every command uses."""
    return f"rank {rank}'s trace cannot be decoded ({why})"


def _reduce_or_why(*task: Any) -> RankReduction | str:
    """:func:`dpro.graph.reduction.reduce_trace` of ``task``, or why its trace cannot be decoded."""
    try:
        return reduce_trace(*task)
    except TraceFormatError as e:
        return str(e)
