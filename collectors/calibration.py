"""Calibration inside the job: what the profiler costs, and what the job's collectives cost.

Run by the hooks of :mod:`dpro.collectors.hooks` at two moments, outside every timed step (the
next step's timing starts after the calibration):

- **Profiler cost** (:func:`profiler_cost`), just before the profiling window: spans of known
  work (forward passes of a tiny model without autograd; its training steps: forward,
  backward, optimizer) timed without a profiler and with one configured as the window's, on
  the main thread (in its CPU time; on the GPU where the job has used one, in wall time to the
  end of the kernels: there the backward pass runs on autograd's device thread, and each
  launch is priced as the profiler makes it cost); the cost per profiler event is the difference over the events the profiler
  recorded, priced apart for events inside autograd's backward functions and the others.
  (The profiler follows other threads only through torch's propagated thread-local state, as
  in gloo's workers and the autograd engine's device threads; their events are priced as the
  main thread's of the same class.)
- **Collectives** (:func:`collectives`), just after the window, in lockstep on every rank (all
  reach the same step), on the GPU where the default group is NCCL's (:class:`Device`, each call
  timed to the device's end of it): the job's collectives on its default process group at sizes from
  4 KiB up (×4, at most 64 MiB), point-to-point sends around the ranks' ring, plain TCP
  streams around it (the links' own rate, :mod:`dpro.collectors.link_rate`), and the
  interference between compute and communication (known work alone and while an all-reduce
  runs, an all-reduce alone and while the main thread computes), and the compute of DDP's
  fp16 and bf16 compression hooks. Every timed call starts
  after a one-element all-reduce, so that the ranks enter it together. Sizes stop growing once one call takes
  longer than :data:`SLOW_CALL_S` on any rank (the ranks agree on it with a one-element
  all-reduce), so the whole takes a few seconds even on a slow link. Ranks first meet at a
  barrier of the job's rendezvous store with a timeout, so a rank that cannot calibrate makes
  the others skip rather than wait.

Every result goes to ``ranks/<rank>/calibration.json`` (:func:`dpro.run_format.Run.calibration`).

Nothing here may change how the job runs afterwards (:func:`quietly`): buffers are never
filled by torch's ops (a fill of megabytes starts the OpenMP pool, whose spinning threads then
slowed a job on two cores threefold for the rest of its run), torch runs one intra-op thread
meanwhile, and the job's random number generators are left as they were.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from dpro.collectors.link_rate import ring_streams
from dpro.comm_hooks import CAST_HOOKS, POWERSGD_MATMUL
from dpro.run_format import BACKWARD_EVENT_PREFIX

SIZES = [4096 * 4 ** k for k in range(9)]  # 4 KiB .. 256 MiB; cut by MAX_BYTES
MAX_BYTES = 64 * 2 ** 20
REPEATS = 5
SLOW_CALL_S = 0.25
BARRIER_TIMEOUT = timedelta(seconds=20)
KNOWN_WORK_STEPS = 20  # training steps of a tiny model in one span of known work
FORWARD_WORK_STEPS = 60  # its forward passes in one span of known forward work
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")

__all__ = ["collectives", "profiler_cost", "quietly", "release"]


@contextmanager
def quietly() -> Iterator[None]:
    """Run a calibration without touching the job's state: one intra-op thread, and the random
    number generators (CPU, and CUDA where present) restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []):
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)


# --- the profiler's cost -----------------------------------------------------------------------


def _known_work(torch: Any, device: Any = None) -> Callable[[], None]:
    """A span of training steps of a tiny model: the kinds of ops a job runs (linear layers,
    activations, a norm, autograd, an optimizer), each a few profiler events; on ``device``
    (a GPU; default the CPU), to the end of its kernels."""
    net, optimizer, x = _tiny_model(torch, device)

    def work() -> None:
        for _ in range(KNOWN_WORK_STEPS):
            loss = net(x).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if device is not None:
            torch.cuda.synchronize(device)

    return work


def _known_forward_work(torch: Any, device: Any = None) -> Callable[[], None]:
    """A span of the tiny model's forward passes without autograd: ops that are not backward
    functions, single (an activation) and nesting others (a linear layer's transpose and matmul)."""
    net, _, x = _tiny_model(torch, device)

    def work() -> None:
        with torch.no_grad():
            for _ in range(FORWARD_WORK_STEPS):
                net(x).square().mean()
        if device is not None:
            torch.cuda.synchronize(device)

    return work


def _tiny_model(torch: Any, device: Any = None) -> tuple[Any, Any, Any]:
    generator = torch.Generator().manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 32))
    x = torch.randn(16, 32, generator=generator)
    if device is not None:
        net, x = net.to(device), x.to(device)
    return net, torch.optim.SGD(net.parameters(), lr=1e-3), x


SPANS = 9  # spans of known work timed, the median kept
ROUNDS = 7  # rounds of spans without, then with the profiler, for each known work


def _span_ns(work: Callable[[], None], repeats: int = SPANS, clock: Callable[[], int] = time.thread_time_ns) -> float:
    """The median time of ``work`` over ``repeats`` runs, by ``clock`` (default: this thread's CPU
    time, which the other processes sharing the cores do not disturb)."""
    return float(statistics.median(_timed(work, repeats, clock=clock)))


def profiler_cost(make_profiler: Callable[[], Any], rounds: int = ROUNDS) -> dict[str, Any]:
    """The profiler's cost per event on the main thread, in two classes of events (what one
    event costs differs about twofold between them, so one figure misjudges a job whose mix
    differs from the known work's):

    - ``forward``: events outside backward functions, from spans of forward passes without
      autograd (:func:`_known_forward_work`);
    - ``backward``: events inside autograd's backward functions (under an event named
      :data:`~dpro.run_format.BACKWARD_EVENT_PREFIX`), from spans of training steps
      (:func:`_known_work`) less their other events at the forward cost.

    Each holds ``per_event_ns`` (the median of ``rounds_ns``, one estimate per round; None for
    ``backward`` where the profiler saw no backward function), the
    ``events`` of its class per span, and the median CPU time of a span without and with the
    profiler (``span_ns``, ``profiled_span_ns``). ``make_profiler`` builds a profiler configured
    as the window's (not started)."""
    import torch

    on_gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
    device = job_gpu(torch) if on_gpu else None
    clock = time.perf_counter_ns if on_gpu else time.thread_time_ns
    forward, training = _known_forward_work(torch, device), _known_work(torch, device)
    forward()  # warm up the ops' code paths
    training()
    # the same work records the same events: counted once (building the events costs seconds)
    forward_events, _ = _event_counts(forward, make_profiler)
    training_events, backward_events = _event_counts(training, make_profiler)
    rounds_f, rounds_b, spans_f, spans_t = [], [], [], []
    for _ in range(rounds):
        f = _profiled_span(forward, make_profiler, clock)
        t = _profiled_span(training, make_profiler, clock)
        per_forward_event = f.extra_ns / max(forward_events, 1)
        rounds_f.append(per_forward_event)
        if backward_events:
            rounds_b.append((t.extra_ns - per_forward_event * (training_events - backward_events)) / backward_events)
        spans_f.append(f)
        spans_t.append(t)

    def summary(estimates: list[float], spans: list[_ProfiledSpan], events: int) -> dict[str, Any]:
        price = max(0.0, float(statistics.median(estimates))) if estimates else None
        return {"per_event_ns": price, "events": events,
                "span_ns": float(statistics.median(s.plain_ns for s in spans)),
                "profiled_span_ns": float(statistics.median(s.profiled_ns for s in spans)), "rounds_ns": estimates}

    return {"forward": summary(rounds_f, spans_f, forward_events),
            "backward": summary(rounds_b, spans_t, backward_events), "device": str(device) if on_gpu else "cpu"}


@dataclass
class _ProfiledSpan:
    plain_ns: float  # the mean of the plain spans just before and after: a drift of the machine cancels
    profiled_ns: float

    @property
    def extra_ns(self) -> float:
        return self.profiled_ns - self.plain_ns


def _profiled_span(work: Callable[[], None], make_profiler: Callable[[], Any],
                   clock: Callable[[], int] = time.thread_time_ns) -> _ProfiledSpan:
    """``work``'s median time by ``clock`` without, with, and again without a profiler."""
    before = _span_ns(work, clock=clock)
    profiler = make_profiler()
    profiler.start()
    try:
        profiled = _span_ns(work, clock=clock)
    finally:
        profiler.stop()
        release(profiler)
    return _ProfiledSpan((before + _span_ns(work, clock=clock)) / 2, profiled)


def _event_counts(work: Callable[[], None], make_profiler: Callable[[], Any]) -> tuple[int, int]:
    """The events a profiler records over one run of ``work``: all, and those inside backward
    functions."""
    profiler = make_profiler()
    profiler.start()
    try:
        work()
    finally:
        profiler.stop()
    events = profiler.events()
    backward = sum(1 for e in events if _outermost(e).name.startswith(BACKWARD_EVENT_PREFIX))
    release(profiler)
    return len(events), backward


def _outermost(event: Any) -> Any:
    while event.cpu_parent is not None:
        event = event.cpu_parent
    return event


def release(profiler: Any) -> None:
    """Free a stopped profiler's results now. Left to the garbage collector (they sit in
    reference cycles), results of an earlier session freed after a later session ran crash
    the process in Kineto (``MemoryTraceLogger::~MemoryTraceLogger``, torch 2.13)."""
    import gc

    inner = vars(profiler).get("profiler")  # torch.autograd.profiler.profile, holding the results
    if inner is not None:
        for name in ("kineto_results", "_function_events", "_old_function_events"):
            if name in vars(inner):
                setattr(inner, name, None)
        profiler.profiler = None
    gc.collect()


# --- collectives -----------------------------------------------------------------------------


def collectives(rank: int, world_size: int) -> dict[str, Any]:
    """Time the job's collectives on its default process group (see the module docstring)."""
    import torch
    import torch.distributed as dist

    from dpro.collectors.clock import job_store

    found = job_store("calibration")
    if found is None:
        return {"skipped": "no rendezvous store to meet at"}
    store, address = found
    store.set(f"ready/{rank}", "1")
    try:
        store.wait([f"ready/{r}" for r in range(world_size)], BARRIER_TIMEOUT)
    except Exception as e:  # a rank that will not come: nobody calibrates, nobody waits
        return {"skipped": f"not every rank reached the calibration ({type(e).__name__})"}
    group_size = dist.get_world_size()
    on = Device.of(torch, dist)
    rows, p2p, links, notes = [], [], [], []
    for coll in COLLECTIVES:
        run = _collective(torch, dist, coll, group_size, on)
        try:
            rows += _sweep(torch, dist, lambda nbytes: run(nbytes), {"coll": coll, "group_size": group_size}, on)
        except Exception as e:  # the backend may not offer it (reduce_scatter on old gloo)
            notes.append(f"{coll}: {type(e).__name__}: {e}".splitlines()[0][:200])
    if group_size > 1:
        p2p = _sweep(torch, dist, lambda nbytes: _ring_send(torch, dist, rank, group_size, nbytes, on),
                     {"src": rank, "dst": (rank + 1) % group_size}, on)
        _together(torch, dist, on)
        try:
            links = [ring_streams(store, address.rsplit(":", 1)[0], rank, group_size)]
        except Exception as e:  # a rank that cannot listen or reach its neighbour: no wire rate
            notes.append(f"link streams: {type(e).__name__}: {e}".splitlines()[0][:200])
    return {"device": str(on.device), "collectives": rows, "p2p": p2p, "links": links,
            "interference": _interference(torch, dist, rows, on), "compression": _compression(torch, group_size, on),
            "notes": notes}


@dataclass(frozen=True)
class Device:
    """Where the job's collectives run: a GPU where the default group's backend is NCCL (it has
    no CPU tensors), else the CPU. ``sync`` waits for the device's queued work, so that a call
    is timed to its end."""

    device: Any
    sync: Callable[[], None]

    @classmethod
    def of(cls, torch: Any, dist: Any) -> "Device":
        if "nccl" in str(dist.get_backend()).lower() and torch.cuda.is_available():
            device = job_gpu(torch, dist)
            return cls(device, lambda: torch.cuda.synchronize(device))
        return cls(torch.device("cpu"), lambda: None)

    def zeros(self, torch: Any, numel: int) -> Any:
        """A float32 buffer of zeros, filled by no CPU op (:func:`quietly`)."""
        if self.device.type == "cpu":
            return torch.frombuffer(bytearray(4 * numel), dtype=torch.float32)
        return torch.zeros(numel, device=self.device)


def job_gpu(torch: Any, dist: Any = None) -> Any:
    """The GPU this rank's job uses: the default group's bound device (``init_process_group(device_id=...)``),
    else ``LOCAL_RANK``'s (as torchrun numbers a host's ranks; a job that never calls ``set_device``
    puts its tensors there), else the current device."""
    group = dist.distributed_c10d._get_default_group() if dist is not None and dist.is_initialized() else None
    bound = getattr(group, "bound_device_id", None)
    if bound is not None:
        return bound
    local = os.environ.get("LOCAL_RANK")
    index = int(local) % torch.cuda.device_count() if local is not None else torch.cuda.current_device()
    return torch.device("cuda", index)


def _sweep(torch: Any, dist: Any, call: Callable[[int], None], facts: dict[str, Any], on: Device) -> list[dict[str, Any]]:
    """``call(nbytes)`` timed at growing sizes: each size once, then :data:`REPEATS` times in
    all unless that first call took over :data:`SLOW_CALL_S` on some rank, where the sweep ends."""
    rows = []
    for nbytes in (n for n in SIZES if n <= MAX_BYTES):
        times = _timed(lambda: call(nbytes), 1, lambda: _together(torch, dist, on))
        slow = _slowest(torch, dist, times[0], on) > SLOW_CALL_S * 1e9
        if not slow:
            times += _timed(lambda: call(nbytes), REPEATS - 1, lambda: _together(torch, dist, on))
        rows.append({**facts, "bytes": nbytes, "times_ns": times})
        if slow:
            break
    return rows


def _collective(torch: Any, dist: Any, coll: str, n: int, on: Device) -> Callable[[int], None]:
    """A function that runs ``coll`` of about ``nbytes`` in all (float32) on ``on``'s device, to its end."""
    def empty(numel: int) -> Any:
        return torch.empty(numel, device=on.device)

    # torch 2.13 names them *_single and deprecates the *_tensor names (a FutureWarning per call)
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def run(nbytes: int) -> None:
        numel = max(nbytes // 4, n)
        if coll == "all_reduce":
            dist.all_reduce(empty(numel))
        elif coll == "broadcast":
            dist.broadcast(empty(numel), src=0)
        elif coll == "all_gather":
            part = empty(numel // n)
            all_gather(empty(part.numel() * n), part)
        else:
            whole = empty(numel // n * n)
            reduce_scatter(empty(whole.numel() // n), whole)
        on.sync()

    return run


def _ring_send(torch: Any, dist: Any, rank: int, n: int, nbytes: int, on: Device) -> None:
    """Send ``nbytes`` to the next rank while receiving as much from the previous (on a GPU as
    one batch: NCCL queues a pair's send and receive one behind the other, and two ranks that
    each sent first would wait for each other)."""
    out, into = torch.empty(nbytes // 4, device=on.device), torch.empty(nbytes // 4, device=on.device)
    if on.device.type == "cuda":
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, out, (rank + 1) % n),
                                            dist.P2POp(dist.irecv, into, (rank - 1) % n)]):
            work.wait()
    else:
        sent = dist.isend(out, (rank + 1) % n)
        dist.recv(into, (rank - 1) % n)
        sent.wait()
    on.sync()


def _timed(call: Callable[[], None], repeats: int, before: Callable[[], None] = lambda: None,
           clock: Callable[[], int] = time.perf_counter_ns) -> list[int]:
    """``call``'s time by ``clock`` (default: wall time), ``repeats`` times, each after ``before``."""
    times = []
    for _ in range(repeats):
        before()
        start = clock()
        call()
        times.append(clock() - start)
    return times


def _together(torch: Any, dist: Any, on: Device) -> None:
    """A one-element all-reduce: every rank leaves it at about the same time."""
    dist.all_reduce(torch.zeros(1, device=on.device))
    on.sync()


def _slowest(torch: Any, dist: Any, ns: int, on: Device) -> float:
    """The largest of every rank's ``ns`` (so that all ranks stop growing sizes together)."""
    value = torch.tensor([float(ns)], device=on.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


COMPRESSION_SIZES = (2 ** 20, 4 * 2 ** 20, 16 * 2 ** 20)  # bytes of float32 gradients


def _compression(torch: Any, group_size: int, on: Device) -> dict[str, list[dict[str, Any]]]:
    """The compute of DDP's fp16 and bf16 compression hooks on a bucket of each size: the cast
    to half precision divided by the group's size, and the copy back into the float32 bucket
    after the all-reduce (``torch.distributed.algorithms.ddp_comm_hooks.default_hooks``); and
    the matrix products of its PowerSGD hook (``matmul``)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name, dtype_name in CAST_HOOKS.items():
        dtype = getattr(torch, dtype_name)
        rows = []
        for nbytes in COMPRESSION_SIZES:
            bucket = on.zeros(torch, nbytes // 4)

            def hook() -> None:
                bucket.copy_(bucket.to(dtype).div_(group_size))
                on.sync()

            rows.append({"bytes": nbytes, "times_ns": _timed(hook, REPEATS)})
        out[name] = rows
    out[POWERSGD_MATMUL] = _matmul_rate(torch, on)
    return out


MATMUL_SHAPE = (1024, 1024, 4)  # a gradient matrix times a low-rank factor, as PowerSGD computes


def _matmul_rate(torch: Any, on: Device) -> list[dict[str, Any]]:
    """A matrix of a gradient's size times a thin factor (the compute of DDP's PowerSGD hook,
    ``powerSGD_hook``): ``{"flops", "times_ns"}``."""
    n, m, r = MATMUL_SHAPE
    matrix, factor = on.zeros(torch, n * m).view(n, m), on.zeros(torch, m * r).view(m, r)

    def product() -> None:
        torch.matmul(matrix, factor)
        on.sync()

    return [{"flops": 2 * n * m * r, "times_ns": _timed(product, REPEATS)}]


def _interference(torch: Any, dist: Any, rows: list[dict[str, Any]], on: Device) -> dict[str, Any]:
    """Spans of known work alone and while an all-reduce runs; the all-reduce alone and while
    the main thread computes (the largest one calibrated under :data:`SLOW_CALL_S`, so that the
    spans fill it)."""
    sizes = [r["bytes"] for r in rows if r["coll"] == "all_reduce" and max(r["times_ns"]) < SLOW_CALL_S * 1e9]
    # every rank must run the same all-reduces: the largest size fast enough on every rank
    agreed = torch.tensor([float(max(sizes, default=0))], device=on.device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    nbytes = int(agreed.item())
    if not nbytes:
        return {}
    if on.device.type != "cpu":  # NCCL's future completes at launch, and CPU work is not what shares a GPU
        return {"skipped": "on a GPU, the job's kernels and NCCL's share the device: the known work on the "
                           "CPU does not measure it"}
    work = _known_work(torch)
    work()
    compute_alone = _span_ns(work, clock=time.perf_counter_ns)
    _together(torch, dist, on)
    comm_alone = _timed(lambda: (dist.all_reduce(torch.empty(nbytes // 4, device=on.device)), on.sync()), 1)[0]
    _together(torch, dist, on)
    start = time.perf_counter_ns()
    pending = dist.all_reduce(torch.empty(nbytes // 4, device=on.device), async_op=True)
    done: list[int] = []  # when the all-reduce completed, stamped by the thread that completes it
    pending.get_future().then(lambda _: done.append(time.perf_counter_ns()))
    spans = []
    while not pending.is_completed():
        began = time.perf_counter_ns()
        work()
        spans.append((began, time.perf_counter_ns()))
    pending.wait()
    end = done[0] if done else time.perf_counter_ns()
    beside = [b - a for a, b in spans if b <= end] or [b - a for a, b in spans]  # spans that ran wholly beside it
    return {"bytes": nbytes, "compute_alone_ns": compute_alone,
            "compute_beside_comm_ns": float(statistics.median(beside)) if beside else compute_alone,
            "spans_beside_comm": len(beside), "comm_alone_ns": comm_alone, "comm_beside_compute_ns": end - start}
