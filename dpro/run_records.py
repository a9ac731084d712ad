"""Typed records of a run's JSON files, each read from its JSON in one place that knows the
file's older forms (see ``docs/run-format.md``):

- :class:`RankMeta`, a rank's ``meta.json``: where it ran, its process groups, its parallel
  layout (:class:`ParallelLayout`), its DDP modules (:class:`DdpLayout`), the memory its tensors
  held (:class:`HeldMemory`) and the settings ``--apply`` set (:class:`Applied`);
- :class:`Calibration`, a rank's ``calibration.json``: the profiler's cost per event, the
  collectives, links, interference and compression hooks timed after the window.

Records are built from parsed JSON (``from_json``); :class:`dpro.run_format.Run` opens the files.
Like the run format, importing this module is cheap: the hooks inside the training job use it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

DDP_FIRST_BUCKET_BYTES = 1024 * 1024
"""``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``: DDP's first bucket cap unless
``bucket_cap_mb`` is given (torch 2.13), and what runs recorded before ``first_bucket_bytes_cap``
was (format 1.0) are read with."""


@dataclass(frozen=True)
class DdpParam:
    """A parameter in a DDP bucket: its name, shape and elements."""

    name: str
    numel: int
    shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class DdpBucket:
    """One of DDP's gradient buckets, in reduction order."""

    index: int
    numel: int
    nbytes: int
    dtype: str
    params: tuple[DdpParam, ...]


@dataclass(frozen=True)
class DdpLayout:
    """A DistributedDataParallel module as ``meta.json``'s ``ddp`` entry records it: its caps,
    flags, communication hook and buckets (empty where they were not recorded). Read with
    :meth:`from_meta`, the one place that knows the entry's older forms."""

    module: str
    bucket_cap_bytes: int
    first_bucket_bytes_cap: int
    buckets: tuple[DdpBucket, ...] = ()
    comm_hook: str | None = None
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    find_unused_parameters: bool = False

    @classmethod
    def from_meta(cls, entry: dict[str, Any]) -> DdpLayout:
        """The layout of one ``ddp`` entry; an entry without ``first_bucket_bytes_cap`` (format
        1.0) has DDP's default first cap."""
        buckets = tuple(
            DdpBucket(int(b.get("index", i)), int(b.get("numel", 0)), int(b.get("bytes", 0)), str(b.get("dtype") or "float32"),
                      tuple(DdpParam(str(p["name"]), int(p.get("numel", 0)), tuple(int(d) for d in p.get("shape") or ()))
                            for p in b.get("params") or ()))
            for i, b in enumerate(entry.get("buckets") or ()))
        return cls(module=str(entry.get("module") or ""), bucket_cap_bytes=int(entry["bucket_cap_bytes"]),
                   first_bucket_bytes_cap=int(entry.get("first_bucket_bytes_cap") or DDP_FIRST_BUCKET_BYTES),
                   buckets=buckets, comm_hook=entry.get("comm_hook") or None,
                   gradient_as_bucket_view=bool(entry.get("gradient_as_bucket_view")),
                   static_graph=bool(entry.get("static_graph")),
                   find_unused_parameters=bool(entry.get("find_unused_parameters")))

    @classmethod
    def all_in(cls, meta: dict[str, Any]) -> list[DdpLayout]:
        """The DistributedDataParallel modules of a rank's ``meta.json``; an entry whose
        collection failed in the job (``{"error": ...}``) is left out."""
        entries = meta.get("ddp") or []
        return [cls.from_meta(e) for e in entries if isinstance(e, dict) and "bucket_cap_bytes" in e]

    @property
    def bucket_cap_mb(self) -> float:
        return self.bucket_cap_bytes / 2**20

    @property
    def first_bucket_mb(self) -> float:
        return self.first_bucket_bytes_cap / 2**20

    @property
    def bucket_bytes(self) -> list[int]:
        """Bytes of each bucket, in reduction order."""
        return [b.nbytes for b in self.buckets]


def _dicts(value: Any) -> tuple[dict[str, Any], ...]:
    """The dict entries of a JSON list (anything else is no list)."""
    return tuple(v for v in value if isinstance(v, dict)) if isinstance(value, list) else ()


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class HeldMemory:
    """The bytes the rank's tensors held after the first step (``meta.json``'s ``memory``)."""

    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int = 0

    @classmethod
    def from_json(cls, entry: Any) -> HeldMemory | None:
        """None for a run recorded before dpro measured memory."""
        entry = _dict(entry)
        if "parameters_bytes" not in entry:
            return None
        return cls(int(entry["parameters_bytes"]), int(entry.get("gradients_bytes") or 0),
                   int(entry.get("optimizer_state_bytes") or 0))


@dataclass(frozen=True)
class ParallelLayout:
    """How the rank's model was split (``meta.json``'s ``parallel``): its device meshes, FSDP
    units, pipeline stages and DTensor parameters, each entry as the job recorded it (read by
    the one analysis of that strategy). ``dtensor_parameters`` is None for a run recorded before
    dpro listed them."""

    meshes: tuple[dict[str, Any], ...] = ()
    fsdp: tuple[dict[str, Any], ...] = ()
    pipeline: tuple[dict[str, Any], ...] = ()
    dtensor_parameters: tuple[dict[str, Any], ...] | None = None

    @classmethod
    def from_json(cls, entry: Any) -> ParallelLayout:
        entry = _dict(entry)
        params = entry.get("dtensor_parameters")
        return cls(_dicts(entry.get("meshes")), _dicts(entry.get("fsdp")), _dicts(entry.get("pipeline")),
                   None if params is None else _dicts(params))

    @property
    def stage(self) -> int | None:
        """The rank's pipeline stage, where it runs exactly one."""
        indices = self.pipeline[0].get("stage_index") if self.pipeline else None
        return int(indices[0]) if isinstance(indices, list) and len(indices) == 1 else None

    @property
    def sharded_parameter_bytes(self) -> list[int]:
        """The rank's local bytes of each DTensor parameter sharded over some mesh dimension."""
        return [int(b) for p in self.dtensor_parameters or () if p.get("sharded_over") for b in p.get("local_bytes") or []]


@dataclass(frozen=True)
class Applied:
    """What ``dpro record --apply`` set in the job (``meta.json``'s ``applied``)."""

    settings: dict[str, Any] = field(default_factory=dict)
    applied: tuple[str, ...] = ()
    left_out: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, entry: Any) -> Applied:
        entry = _dict(entry)
        return cls(_dict(entry.get("settings")), tuple(map(str, entry.get("applied") or ())),
                   tuple(map(str, entry.get("left_out") or ())))


@dataclass(frozen=True)
class RankMeta:
    """A rank's ``meta.json``. ``present`` is False where the rank wrote none (every field is
    then empty); ``host`` is ``""`` where unknown."""

    present: bool = False
    rank: int | None = None
    world_size: int | None = None
    host: str = ""
    node: str = ""  # the folder of the node's dpro record (nodes/<host>-<pid>), "" before format 1.3
    pid: int | None = None
    backend: str | None = None
    process_groups: tuple[dict[str, Any], ...] = ()
    parallel: ParallelLayout = ParallelLayout()
    ddp: tuple[DdpLayout, ...] = ()
    memory: HeldMemory | None = None
    applied: Applied = Applied()
    versions: dict[str, Any] = field(default_factory=dict)
    devices: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, meta: Any) -> RankMeta:
        meta = _dict(meta)
        if not meta:
            return cls()
        return cls(present=True, rank=_int(meta.get("rank")), world_size=_int(meta.get("world_size")) or None,
                   host=str(meta.get("host") or ""), node=str(meta.get("node") or ""), pid=_int(meta.get("pid")),
                   backend=str(meta["backend"]) if meta.get("backend") else None,
                   process_groups=tuple(g for g in _dicts(meta.get("process_groups")) if "pg_name" in g),
                   parallel=ParallelLayout.from_json(meta.get("parallel")), ddp=tuple(DdpLayout.all_in(meta)),
                   memory=HeldMemory.from_json(meta.get("memory")), applied=Applied.from_json(meta.get("applied")),
                   versions=_dict(meta.get("versions")), devices=_dict(meta.get("devices")))


@dataclass(frozen=True)
class Loss:
    """Something ``dpro record`` could not save: ``file`` (relative to the run), ``why`` in words
    (``disk full``, ``read-only file system``, ``its folder was removed``...), the error, the rank
    and the step where known, and whether dpro stopped recording in that rank for it."""

    file: str
    why: str
    detail: str = ""
    rank: int | None = None
    step: int | None = None
    stopped: bool = False  # dpro stopped recording in that rank for it

    @classmethod
    def from_json(cls, entry: Any) -> Loss | None:
        entry = _dict(entry)
        if not entry.get("file") or not entry.get("why"):
            return None
        return cls(str(entry["file"]), str(entry["why"]), str(entry.get("detail") or ""), _int(entry.get("rank")),
                   _int(entry.get("step")), entry.get("stopped") is True)


@dataclass(frozen=True)
class NodeRecord:
    """One node's ``node.json`` (one ``dpro record`` process): ``name`` is its folder. A node
    without ``ended_ns`` was lost: its recorder never wrote its end (killed, or its host went down)."""

    name: str
    host: str = ""
    command: tuple[str, ...] = ()
    started_ns: int | None = None
    ended_ns: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    collectors: dict[str, str] = field(default_factory=dict)
    lost: tuple[Loss, ...] = ()

    @property
    def ended(self) -> bool:
        return self.ended_ns is not None

    @classmethod
    def from_json(cls, name: str, data: Any) -> NodeRecord:
        data = _dict(data)
        return cls(name, str(data.get("host") or ""), tuple(map(str, data.get("command") or ())),
                   _int(data.get("started_ns")), _int(data.get("ended_ns")), _int(data.get("exit_code")),
                   str(data["signal"]) if data.get("signal") else None,
                   {str(k): str(v) for k, v in _dict(data.get("collectors")).items()},
                   tuple(x for x in map(Loss.from_json, data.get("lost") or ()) if x is not None))


@dataclass(frozen=True)
class Timing:
    """One call timed at one size, repeatedly: ``size`` is bytes (a collective, a send, a
    compression hook) or floating-point operations (a matrix product)."""

    size: int
    times_ns: tuple[float, ...]

    @property
    def median_ns(self) -> float:
        return statistics.median(self.times_ns)


@dataclass(frozen=True)
class CollectiveTiming(Timing):
    """A collective of the job's backend timed over a group of ``group_size`` ranks."""

    coll: str = ""
    group_size: int = 0


@dataclass(frozen=True)
class LinkStream:
    """A plain TCP stream from rank ``src`` to ``dst`` (:mod:`dpro.collectors.link_rate`): the
    bytes it moved in each window of ``window_ns`` (the last window partial; none where the
    stream was not timed), and the port ``dst`` listened on (None in runs recorded before dpro
    kept it)."""

    src: int
    dst: int
    window_ns: float
    window_bytes: tuple[float, ...]
    listen_port: int | None = None


@dataclass(frozen=True)
class InterferenceTiming:
    """Known compute alone and while an all-reduce ran, the all-reduce alone and while the main
    thread computed."""

    compute_alone_ns: float
    compute_beside_comm_ns: float
    comm_alone_ns: float
    comm_beside_compute_ns: float


@dataclass(frozen=True)
class Calibration:
    """A rank's ``calibration.json``, empty where the run was not calibrated.

    - ``event_costs``: the profiler's cost per event, ``{"forward": ns, "backward": ns}`` (events
      in autograd's backward functions priced apart; format 1.0's one price, ``main``, serves
      both); empty where not measured;
    - ``event_counts``: the events the profiler recorded in each class's spans of known work;
    - ``collectives``, ``links``, ``interference``: measured after the window, on ``device``;
    - ``compression``: each hook's compute (``fp16``, ``bf16``: by bytes; ``matmul``, PowerSGD's
      products: by flops);
    - ``problems``: each part that failed or was skipped, and why.
    """

    event_costs: dict[str, float] = field(default_factory=dict)
    event_counts: dict[str, int] = field(default_factory=dict)
    device: str | None = None
    collectives: tuple[CollectiveTiming, ...] = ()
    links: tuple[LinkStream, ...] = ()
    interference: InterferenceTiming | None = None
    compression: dict[str, tuple[Timing, ...]] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any) -> Calibration:
        data = _dict(data)
        profiler, measured = _dict(data.get("profiler")), _dict(data.get("collectives"))
        problems = {part: str(entry.get("error") or entry.get("skipped")) for part in ("profiler", "collectives")
                    if (entry := _dict(data.get(part))).get("error") or entry.get("skipped")}
        interference = _dict(measured.get("interference"))
        return cls(
            event_costs=_event_costs(profiler),
            event_counts={k: int(v["events"]) for k in ("forward", "backward")
                          if isinstance(v := profiler.get(k), dict) and _int(v.get("events")) is not None},
            device=str(measured["device"]) if measured.get("device") else None,
            collectives=tuple(CollectiveTiming(int(r["bytes"]), tuple(map(float, r["times_ns"])), str(r["coll"]),
                                               int(r["group_size"])) for r in _dicts(measured.get("collectives"))
                              if {"bytes", "times_ns", "coll", "group_size"} <= r.keys()),
            links=tuple(LinkStream(int(s["src"]), int(s["dst"]), float(s.get("window_ns") or 0),
                                   tuple(map(float, s.get("window_bytes") or ())),
                                   int(s["listen"][1]) if s.get("listen") else None)
                        for s in _dicts(measured.get("links")) if {"src", "dst"} <= s.keys()),
            interference=InterferenceTiming(*(float(interference[k]) for k in (
                "compute_alone_ns", "compute_beside_comm_ns", "comm_alone_ns", "comm_beside_compute_ns")))
            if interference.get("compute_alone_ns") and interference.get("comm_alone_ns") else None,
            compression={part: timings for part, rows in _dict(measured.get("compression")).items()
                         if (timings := tuple(Timing(int(r.get("bytes", r.get("flops", 0))), tuple(map(float, r["times_ns"])))
                                              for r in _dicts(rows) if r.get("times_ns")))},
            problems=problems)


def _event_costs(profiler: dict[str, Any]) -> dict[str, float]:
    """The profiler's cost per event of each class; format 1.0 priced one class (``main``)."""
    forward = _dict(profiler.get("forward")).get("per_event_ns")
    if forward is not None:
        backward = _dict(profiler.get("backward")).get("per_event_ns")
        return {"forward": float(forward), "backward": float(forward if backward is None else backward)}
    if "per_event_ns" in _dict(profiler.get("main")):
        return dict.fromkeys(("forward", "backward"), float(profiler["main"]["per_event_ns"]))
    return {}
