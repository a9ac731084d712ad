"""dpro's hooks inside the training processes started by ``dpro record``.

The bootstrap (``bootstrap/sitecustomize.py``) calls :func:`install` in every Python process of
the job. Nothing happens until ``torch`` is imported; then a global optimizer step hook delimits
steps, and the process attaches to the run (takes a rank directory, writes its metadata, starts
measuring its clock offset) when ``torch.distributed`` is initialised or at the end of the first
step, whichever comes first.

Step ``n`` ends when the first optimizer that ever stepped steps for the ``n``-th time (counting
from 0), or when the script calls :func:`dpro.step`, which, once called, takes over from the
optimizer hook. Step 0 begins somewhere in the script's setup, so its start is not recorded.

Every hook catches its own failure, writes it to the rank's ``errors.log`` and, if the failure
leaves dpro in an unknown state, turns dpro off for this process: the training goes on. A
pipeline's micro-batch probe (``dpro record --probe``, :mod:`dpro.collectors.probe`) switches
on its schedule's calls even then, as every other rank does.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.util
import os
import shutil
import signal
import sys
import threading
import time
import traceback
import weakref
from pathlib import Path
from typing import Any, Callable

from dpro.collectors.apply import Applier, from_environment
from dpro.collectors.losses import loss, report_loss
from dpro.collectors.probe import ENV_PROBE, PROBE_STEPS, MicrobatchProbe, count_training_calls
from dpro.collectors.settled_waits import settle_waits
from dpro.collectors.wrapping import wrap_after
from dpro.run_format import (CALIBRATION_FILE, CLOCK_FILE, COLLECTIVES_FILE, ERRORS_FILE, META_FILE, PROBE_COLLECTIVES_FILE,
                             PROBE_FILE, PROBE_TRACE_FILE, SHAPES_TRACE_FILE, STEPS_COLUMNS, STEPS_FILE, TRACE_FILE,
                             early_errors_file, rank_dir, write_json_atomic)

ENV_RUN_DIR = "DPRO_RUN_DIR"
ENV_SKIP = "DPRO_SKIP"
ENV_WARMUP = "DPRO_WARMUP"
ENV_STEPS = "DPRO_STEPS"
ENV_CALIBRATE = "DPRO_CALIBRATE"  # "0": no calibration (dpro record --no-calibrate)
SCHEDULES_MODULE = "torch.distributed.pipelining.schedules"
GZ_BYTES_PER_EVENT = 64  # a trace event gzipped, at most (16-18 bytes on CPU, longer names of GPU kernels)
JSON_BYTES_PER_EVENT = 800  # as torch writes it first, uncompressed, in the temporary folder (250 on CPU)


class _Window:
    """Which steps are profiled: warm-up steps ``[skip, skip+warmup)``, then ``steps`` recorded,
    then, one step later, one step recorded with the ops' input shapes and the allocator's
    events (kept out of the window: both cost). The step between lets the job's other threads
    finish the window's last ops with no profiler running: a profiler started as the window's
    stopped crashed the process in Kineto when it stopped (``GenericActivityProfiler::processCpuTrace``, torch 2.13 on CPU
    with gloo: 5 recordings of 80; none of 120 with the step between).

    A pipeline's probe (:mod:`dpro.collectors.probe`) follows: its schedule's call in the step
    after the shapes step switches the micro-batch count (that step keeps the profilers apart),
    the next step is the probe profiler's warm-up, the
    :data:`~dpro.collectors.probe.PROBE_STEPS` after it are profiled, and the call after them
    switches back. The steps are the schedule's training calls, one a step where the job makes
    one."""

    def __init__(self, skip: int, warmup: int, steps: int) -> None:
        self.first = skip
        self.recorded = skip + warmup
        self.end = skip + warmup + steps
        self.shapes = self.end + 1
        self.probe_switch = self.shapes + 1
        self.probe_warmup = self.probe_switch + 1
        self.probe = self.probe_warmup + 1
        self.probe_end = self.probe + PROBE_STEPS  # runs at the job's count again

    def phase(self, step: int, probed: bool = False) -> str:
        if self.first <= step < self.recorded:
            return "warmup"
        if self.recorded <= step < self.end:
            return "profiled"
        if probed and self.probe_switch <= step <= self.probe_end:
            return "probe"
        return "shapes" if step == self.shapes else ""

    def schedule(self, step: int) -> Any:
        from torch.profiler import ProfilerAction

        if step < self.first or step >= self.end:
            return ProfilerAction.NONE
        if step < self.recorded:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD_AND_SAVE if step == self.end - 1 else ProfilerAction.RECORD


class _Recorder:
    """The state of dpro in one process of the job."""

    def __init__(self, run_dir: Path, window: _Window, calibrate: bool = True, applier: Applier | None = None,
                 probe: bool = False) -> None:
        self.run_dir = run_dir
        self.applier = applier
        self.window = window
        self.calibrate = calibrate
        self.probe_wanted = probe
        self.probe: MicrobatchProbe | None = None  # the pipeline schedule's, once switched
        self.probed = False  # whether its probe steps ran (their phase in steps.csv)
        self.probe_profiler: Any = None
        self.probe_start_ns = 0
        self.probe_saved = False  # whether the probe's trace was written
        self.calibration: dict[str, Any] = {}
        self.lock = threading.RLock()
        self.enabled = True
        self.rank: int | None = None
        self.rank_dir: Path | None = None
        self.steps_fd: int | None = None
        self.steps_file_id: tuple[int, int] | None = None
        self.step = 0
        self.step_start_ns: int | None = None
        self.step_owner: Any = None  # id() of the optimizer that delimits steps, or "user"
        self.profiler: Any = None
        self.window_start_ns = 0  # when the profiler started: the collective log keeps what followed
        self.shapes_profiler: Any = None
        self.unsettle_waits: Callable[[], None] | None = None  # while the shapes step runs
        self.ddp_modules: weakref.WeakSet[Any] = weakref.WeakSet()
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()  # every optimizer that stepped
        self.previous_sigterm: Any = None

    # -- failures ---------------------------------------------------------------------------
    def log_error(self, where: str, exc: BaseException | None = None, disable: bool = False,
                  file: str | None = None) -> None:
        """Append a failure to the rank's errors.log (or the run's, before a rank is known); one
        that lost a file (``file``, else the error's) is told to the node's recorder too
        (:mod:`dpro.collectors.losses`: a full disk may keep errors.log from being written)."""
        if isinstance(exc, OSError):
            self.lost(file or self.relative(exc.filename) or self.own_file(), exc, stopped=disable)
        try:
            path = self.rank_dir / ERRORS_FILE if self.rank_dir else early_errors_file(self.run_dir, os.getpid())
            detail = "".join(traceback.format_exception(exc)) if exc else ""
            with open(path, "a") as f:
                f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} pid {os.getpid()} {where}"
                        f"{' (dpro disabled in this process)' if disable else ''}\n{detail}")
        except Exception:
            pass
        if disable:
            self.enabled = False
            self.close_profiler(save=False)

    def lost(self, file: str, error: BaseException | str, stopped: bool = False) -> None:
        """Tell the recorder that ``file`` (relative to the run) was not saved, and why
        (``stopped``: dpro stopped recording in this process)."""
        report_loss(loss(file, error, self.rank, self.step, stopped))

    def own_file(self, name: str = "") -> str:
        """The rank's file ``name`` relative to the run (its folder without a name; the ranks'
        folder before the rank is known): what a loss names."""
        return f"ranks/{self.rank}/{name}" if self.rank is not None else "ranks/"

    def relative(self, path: Any) -> str | None:
        """``path`` relative to the run directory (None when it is not a path in it)."""
        try:
            return str(Path(os.fsdecode(path)).relative_to(self.run_dir))
        except (TypeError, ValueError):
            return None

    # -- attaching ----------------------------------------------------------------------------
    def attach(self) -> None:
        """Take a rank directory and write the rank's metadata; start the clock measurement."""
        from dpro.collectors import clock, metadata

        rank, world_size = metadata.rank_and_world_size()
        own = rank_dir(self.run_dir, rank)
        try:  # never parents=True: a run folder removed while recording stays removed
            own.parent.mkdir(exist_ok=True)
            own.mkdir()
        except FileExistsError:
            self.log_error(f"rank {rank}: {own} exists already (another process of this job "
                           f"took rank {rank}, or the run was not empty)", disable=True)
            return
        self.rank, self.rank_dir = rank, own
        self.steps_fd = os.open(own / STEPS_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        stat = os.fstat(self.steps_fd)
        self.steps_file_id = (stat.st_dev, stat.st_ino)
        os.write(self.steps_fd, (",".join(STEPS_COLUMNS) + "\n").encode())
        self.write_metadata()
        clock.measure_offset_in_background(rank, world_size, own / CLOCK_FILE, self.log_error)

    def write_metadata(self) -> None:
        from dpro.collectors import metadata

        assert self.rank_dir is not None
        metadata.write_rank_metadata(self.rank_dir / META_FILE, self.window_options(), list(self.ddp_modules),
                                     list(self.optimizers), self.applier.report() if self.applier else None)

    def window_options(self) -> dict[str, int]:
        w = self.window
        return {"skip": w.first, "warmup": w.recorded - w.first, "steps": w.end - w.recorded}

    # -- steps ----------------------------------------------------------------------------------
    def end_step(self) -> None:
        """Record the step that just ended and drive the profiler into the next one."""
        now = time.time_ns()
        if self.rank_dir is None:
            self.attach()
            if not self.enabled:
                return
        stat = os.fstat(self.steps_fd)
        if (stat.st_dev, stat.st_ino) != self.steps_file_id:
            # The job closed dpro's files (and the number now names another file): it may
            # have closed the profiler's too, so dpro stops here rather than start it.
            raise RuntimeError("the job closed or replaced dpro's steps.csv descriptor")
        phase = self.window.phase(self.step, probed=self.probed)
        start = "" if self.step_start_ns is None else str(self.step_start_ns)
        try:
            os.write(self.steps_fd, f"{self.step},{start},{now},{phase}\n".encode())
        except OSError as e:  # a full disk: dpro stops in this process, the job goes on
            self.log_error(f"writing {STEPS_FILE}", e, disable=True, file=self.own_file(STEPS_FILE))
            return
        self.step += 1
        self.step_start_ns = now
        try:
            from dpro.collectors import calibration, metadata

            if self.step == self.window.first:
                self.run_calibration("profiler", lambda: calibration.profiler_cost(self.new_profiler))
                if self.room_for_window(self.window.end - self.window.recorded + 2):  # the shapes step records about twice a step's events
                    self.start_profiler()
            elif self.profiler is not None:
                self.profiler.step()
                if self.step >= self.window.end:
                    profiler, self.profiler = self.profiler, None  # its trace was saved by the transition just made
                    calibration.release(profiler)
                    self.restore_sigterm()
                    self.dump_collective_log()
                    self.run_calibration("collectives", lambda: calibration.collectives(
                        self.rank, metadata.rank_and_world_size()[1]))
            elif self.step == self.window.shapes:
                self.shapes_profiler = self.new_profiler(record_shapes=True, profile_memory=True)
                self.end_settled_waits()
                self.unsettle_waits = settle_waits()
                self.shapes_profiler.start()
            elif self.shapes_profiler is not None:
                shapes, self.shapes_profiler = self.shapes_profiler, None
                self.end_settled_waits()
                try:
                    shapes.stop()
                    self.export(shapes, SHAPES_TRACE_FILE)
                finally:
                    calibration.release(shapes)
        except Exception as e:  # the profiler failed: keep timing steps without it
            self.drop_profilers()
            self.log_error(f"torch.profiler at step {self.step}", e)
        try:
            self.profile_probe()
        except Exception as e:  # the probe's trace is lost; its count switches back on time all the same
            self.drop_profilers()
            self.log_error(f"profiling the micro-batch probe at step {self.step}", e)
        finally:
            self.step_start_ns = time.time_ns()  # what dpro did here belongs to no step

    def on_schedule_call(self, schedule: Any, n: int) -> None:
        """Before a pipeline schedule's ``n``-th training call (from 0): switch its micro-batch
        count for the probe, or back (:mod:`dpro.collectors.probe`). Runs whether or not dpro
        records in this process: every rank of the pipeline switches at the same call."""
        w = self.window
        if n == w.probe_switch and self.probe is None and self.probe_wanted:
            probe = MicrobatchProbe.of(schedule)
            if probe is not None:
                probe.switch()
                self.probe, self.probed = probe, True
        elif n == w.probe_end and self.probe is not None and self.probe.schedule is schedule:
            self.probe.restore()

    def profile_probe(self) -> None:
        """Profile the probe steps: a warm-up step once the schedule runs switched, then
        :data:`~dpro.collectors.probe.PROBE_STEPS` recorded (by the steps this process ends)."""
        w = self.window
        if self.step == w.probe_warmup and self.probe is not None and self.probe.active:
            if self.room_for_window(PROBE_STEPS + 1, PROBE_TRACE_FILE):
                self.probe_start_ns = time.time_ns()
                self.probe_profiler = self.start_window_profiler(self.probe_action, self.save_probe_trace)
        elif self.probe_profiler is not None:
            if self.step < w.probe_end:
                self.probe_profiler.step()
            else:
                profiler, self.probe_profiler = self.probe_profiler, None
                self.end_probe(profiler)

    def save_probe_trace(self, profiler: Any) -> None:
        if self.probe is not None and self.probe.active:  # else not kept (end_probe says why)
            self.probe_saved = self.export(profiler, PROBE_TRACE_FILE)

    def probe_action(self, step: int) -> Any:
        from torch.profiler import ProfilerAction

        w = self.window
        if not w.probe_warmup <= step < w.probe_end:
            return ProfilerAction.NONE
        if step == w.probe_warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD_AND_SAVE if step == w.probe_end - 1 else ProfilerAction.RECORD

    def end_probe(self, profiler: Any) -> None:
        """Save the probe steps' trace (the profiler's last transition) and collectives, and
        ``probe.json`` where the trace was saved and its steps all ran switched (not where the
        job calls its schedule more than once a step, or skipped an optimizer step: the switch
        back came inside them)."""
        from dpro.collectors import calibration, collective_log

        assert self.rank_dir is not None and self.probe is not None
        try:
            profiler.step()
        finally:
            calibration.release(profiler)
        if not self.probe.active:
            self.log_error("the micro-batch probe: its schedule switched back inside the profiled steps (this "
                           "process's steps, counted by its optimizer steps, do not line up with the schedule's "
                           "calls); the probe is not kept")
            return
        if not self.probe_saved:
            return
        try:
            collective_log.dump(self.rank_dir / PROBE_COLLECTIVES_FILE, self.probe_start_ns)
        except Exception as e:
            self.log_error("writing the probe steps' collective log", e)
        w = self.window
        write_json_atomic(self.rank_dir / PROBE_FILE, self.probe.report(list(range(w.probe, w.probe_end))),
                          parents=False)

    def dump_collective_log(self) -> None:
        """Write the window's collectives and sends with their groups and peers
        (:mod:`dpro.collectors.collective_log`); a failure costs the log only."""
        from dpro.collectors import collective_log

        assert self.rank_dir is not None
        try:
            collective_log.dump(self.rank_dir / COLLECTIVES_FILE, self.window_start_ns)
        except Exception as e:
            self.log_error("writing the collective log", e)

    def run_calibration(self, part: str, measure: Any) -> None:
        """Run one part of the calibration (:mod:`dpro.collectors.calibration`) and save what it
        found; a failure is noted there and logged, and the job goes on."""
        from dpro.collectors import calibration

        if not self.calibrate:
            return
        try:
            with calibration.quietly():
                self.calibration[part] = measure()
        except Exception as e:
            self.calibration[part] = {"error": f"{type(e).__name__}: {e}"}
            self.log_error(f"calibrating {part}", e)
        assert self.rank_dir is not None
        try:
            write_json_atomic(self.rank_dir / CALIBRATION_FILE, self.calibration, parents=False)
        except OSError as e:
            self.log_error(f"writing {CALIBRATION_FILE}", e, file=self.own_file(CALIBRATION_FILE))

    # -- profiler -------------------------------------------------------------------------------
    def start_profiler(self) -> None:
        """Start torch.profiler so that its ``ProfilerStep#n`` is this process's step ``n``."""
        try:
            self.write_metadata()  # DDP has built its final buckets by now
        except OSError as e:  # the metadata of the job's start stays; the window goes on
            self.log_error(f"rewriting {META_FILE}", e, file=self.own_file(META_FILE))
        self.window_start_ns = time.time_ns()
        self.profiler = self.start_window_profiler(self.window.schedule, self.save_trace)
        self.catch_sigterm()

    def start_window_profiler(self, schedule: Callable[[int], Any], on_trace_ready: Callable[[Any], None]) -> Any:
        """A profiler started on ``schedule``, stepped to this process's step so that its
        ``ProfilerStep#n`` is the step ``n`` (the schedule says NONE before: nothing is recorded)."""
        from dpro.collectors import calibration

        profiler = self.new_profiler(schedule=schedule, on_trace_ready=on_trace_ready)
        profiler.start()
        try:
            for _ in range(self.step):
                profiler.step()
        except BaseException:
            try:
                profiler.stop()
            finally:
                calibration.release(profiler)
            raise
        return profiler

    def new_profiler(self, **options: Any) -> Any:
        """A torch.profiler configured as dpro records (not started): CPU and, where present, CUDA
        activity, no input shapes; ``options`` add the schedule, the trace handler, shapes."""
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        return torch.profiler.profile(**{"activities": activities, "record_shapes": False, **options})

    def save_trace(self, profiler: Any) -> None:
        self.export(profiler, TRACE_FILE)

    def room_for_window(self, steps: int, name: str = TRACE_FILE) -> bool:
        """Whether ``steps`` profiled steps' traces fit on the run's disk, as the calibration's
        count of a step's events estimates them (no estimate without the calibration: the
        export checks again with the events it has). Without room they are skipped and the
        loss of ``name`` told."""
        counts = (self.calibration.get("profiler") or {})
        per_step = sum(int((counts.get(k) or {}).get("events") or 0) for k in ("forward", "backward"))
        file = self.own_file(name)
        try:
            short = self.short_of_room(2 * per_step * steps)  # the optimizer's and the step's own events besides
        except OSError as e:  # the rank's folder removed
            self.lost(file, e)
            return False
        if short:
            self.lost(file, f"disk full ({short}; {'the window was' if name == TRACE_FILE else 'the probe steps were'} skipped)")
        return not short

    def short_of_room(self, events: int) -> str | None:
        """What is missing for a trace of ``events`` events (its gzipped file in the rank's folder,
        torch's uncompressed one in the temporary folder), in words; None when both fit."""
        import tempfile

        assert self.rank_dir is not None
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or 1))  # the node's ranks write theirs at once
        for folder, need in ((self.rank_dir, ranks * events * GZ_BYTES_PER_EVENT),
                             (Path(tempfile.gettempdir()), ranks * events * JSON_BYTES_PER_EVENT)):
            free = shutil.disk_usage(folder).free
            if free < need:
                return f"about {need / 1e6:.1f} MB needed in {folder}, {free / 1e6:.1f} MB free"
        return None

    def export(self, profiler: Any, name: str) -> bool:
        """Write the profiler's trace as ``name`` in the rank's directory, atomically, where its
        estimated size fits; what is not saved is told to the recorder, never half-written.
        Whether it was written."""
        assert self.rank_dir is not None
        file = self.own_file(name)
        try:
            events = len(profiler.profiler.kineto_results.events())
        except Exception:  # another torch: no estimate, the write says
            events = 0
        try:
            short = self.short_of_room(events)
        except OSError as e:  # the rank's folder removed
            self.lost(file, e)
            return False
        if short:
            self.lost(file, f"disk full ({short}; not written)")
            return False
        tmp = self.rank_dir / f".{os.getpid()}.{name}"
        try:
            profiler.export_chrome_trace(str(tmp))
            empty = _empty_trace(tmp, events)
            if empty:  # torch says "Failed to write to log file!" and compresses what it has: nothing
                tmp.unlink(missing_ok=True)
                self.lost(file, empty)
                return False
            os.replace(tmp, self.rank_dir / name)
            return True
        except OSError as e:
            tmp.unlink(missing_ok=True)  # a half-written trace holds the space others need
            self.lost(file, e)
            return False

    def drop_profilers(self) -> None:
        """Stop and free whatever profiler runs, after a failure (a profiler's results left to the
        garbage collector can crash the process: :func:`dpro.collectors.calibration.release`)."""
        from dpro.collectors import calibration

        profilers = [p for p in (self.profiler, self.shapes_profiler, self.probe_profiler) if p is not None]
        self.profiler = self.shapes_profiler = self.probe_profiler = None
        self.restore_sigterm()
        self.end_settled_waits()
        for profiler in profilers:
            try:
                profiler.stop()
            except Exception:
                pass  # stopped already, or never started
            try:
                calibration.release(profiler)
            except Exception as e:
                self.log_error("freeing a profiler", e)

    def end_settled_waits(self) -> None:
        """Put back the collectives' own ``wait`` (:mod:`dpro.collectors.settled_waits`), if the
        shapes step changed it."""
        unsettle, self.unsettle_waits = self.unsettle_waits, None
        if unsettle is not None:
            try:
                unsettle()
            except Exception as e:
                self.log_error("putting back the collectives' wait", e)

    def close_profiler(self, save: bool) -> None:
        """Stop a profiler still running (job ending inside the window), saving what it has; the
        shapes step's and the probe's are stopped and dropped (a probe cut short is not kept)."""
        shapes, self.shapes_profiler = self.shapes_profiler, None
        self.end_settled_waits()
        if shapes is not None:
            try:
                shapes.stop()
            except Exception as e:
                self.log_error("stopping the shapes step's profiler", e)
        probe, self.probe_profiler = self.probe_profiler, None
        if probe is not None:
            from dpro.collectors import calibration

            try:
                probe.on_trace_ready = None
                probe.stop()
                calibration.release(probe)
            except Exception as e:
                self.log_error("stopping the probe steps' profiler", e)
        profiler, self.profiler = self.profiler, None
        if profiler is None:
            return
        try:
            if save:
                profiler.stop()
        except Exception as e:
            self.log_error("saving the trace of an unfinished profiling window", e)

    # -- SIGTERM inside the window: save the partial trace, then die as the job would have ---
    def catch_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self.previous_sigterm = signal.signal(signal.SIGTERM, self.on_sigterm)

    def restore_sigterm(self) -> None:
        if self.previous_sigterm is not None and signal.getsignal(signal.SIGTERM) == self.on_sigterm:
            signal.signal(signal.SIGTERM, self.previous_sigterm)
        self.previous_sigterm = None

    def on_sigterm(self, signum: int, frame: Any) -> None:
        with self.lock:
            self.close_profiler(save=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _empty_trace(path: Path, events: int) -> str | None:
    """Why the trace torch wrote at ``path`` is not the ``events`` it held (None when it is):
    torch writes the JSON to the temporary folder first, and where that fails it compresses an
    empty file."""
    import gzip
    import tempfile

    try:
        with gzip.open(path, "rb") as f:
            head = f.read(64).lstrip()
    except (OSError, EOFError):
        head = b""
    if head.startswith(b"{") or not events:
        return None
    free = shutil.disk_usage(tempfile.gettempdir()).free
    return (f"disk full (torch could not write the trace's JSON in {tempfile.gettempdir()}, "
            f"{free / 1e6:.1f} MB free; not kept)")


_recorder: _Recorder | None = None


def _guarded(where: str):
    """Run a hook under the recorder's lock; a failure is logged and turns dpro off."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            rec = _recorder
            if rec is None or not rec.enabled:
                return
            try:
                with rec.lock:
                    fn(rec, *args, **kwargs)
            except Exception as e:
                rec.log_error(where, e, disable=True)

        return wrapper

    return decorate


@_guarded("optimizer step hook")
def _on_optimizer_step(rec: _Recorder, optimizer: Any, args: Any, kwargs: Any) -> None:
    try:
        rec.optimizers.add(optimizer)
    except TypeError:  # an optimizer that cannot be weakly referenced: its state goes unmeasured
        pass
    if rec.step_owner is None:
        rec.step_owner = id(optimizer)
    if rec.step_owner == id(optimizer):
        rec.end_step()


@_guarded("dpro.step()")
def user_step(rec: _Recorder) -> None:
    """End a step (called by :func:`dpro.step`)."""
    rec.step_owner = "user"
    rec.end_step()


def _on_schedule_call(schedule: Any, n: int) -> None:
    """:meth:`_Recorder.on_schedule_call`, whether or not dpro records in this process; a failure is logged."""
    rec = _recorder
    if rec is None:
        return
    try:
        with rec.lock:
            rec.on_schedule_call(schedule, n)
    except Exception as e:
        rec.log_error("switching the micro-batch probe", e)


def _on_schedules_imported(schedules: Any) -> None:
    """Count the pipeline schedules' training calls (``dpro record --probe``)."""
    rec = _recorder
    assert rec is not None
    try:
        count_training_calls(schedules, _on_schedule_call)
    except Exception as e:  # no probe: the job runs as written
        rec.log_error("counting the pipeline schedule's calls for the probe", e)


@_guarded("attaching after torch.distributed.init_process_group")
def _on_process_group_ready(rec: _Recorder) -> None:
    if rec.rank_dir is None:
        rec.attach()


@_guarded("tracking a DistributedDataParallel module")
def _on_ddp_created(rec: _Recorder, ddp: Any) -> None:
    rec.ddp_modules.add(ddp)


@_guarded("saving at exit")
def _at_exit(rec: _Recorder) -> None:
    rec.close_profiler(save=True)


def _on_torch_imported(torch: Any) -> None:
    """Register dpro's hooks once torch is importable."""
    rec = _recorder
    assert rec is not None
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(_on_optimizer_step)
        import torch.distributed as dist

        if dist.is_available():
            wrap_after(dist, "init_process_group", lambda *a: _on_process_group_ready())
            try:
                from torch._C._distributed_c10d import ProcessGroup

                from dpro.collectors import collective_log

                collective_log.install(ProcessGroup)
            except Exception as e:  # sends go unmatched; the rest records on
                rec.log_error("logging point-to-point ops", e)
            from torch.nn.parallel import DistributedDataParallel

            if rec.probe_wanted:  # before --apply imports the schedules
                schedules = sys.modules.get(SCHEDULES_MODULE)
                if schedules is not None:
                    _on_schedules_imported(schedules)
                else:
                    sys.meta_path.insert(0, _ImportWatcher(SCHEDULES_MODULE, _on_schedules_imported))
            if rec.applier is not None:
                for install in (lambda: rec.applier.install(DistributedDataParallel, rec.log_error),
                                lambda: rec.applier.install_fsdp(rec.log_error),
                                rec.applier.install_pipeline):
                    try:
                        install()
                    except Exception as e:  # the job runs as written; dpro records on
                        rec.log_error("applying the strategy (dpro record --apply)", e)
            wrap_after(DistributedDataParallel, "__init__", lambda ddp, *a: _on_ddp_created(ddp))
        atexit.register(_at_exit)
    except Exception as e:
        rec.log_error("installing hooks into torch", e, disable=True)


class _ImportWatcher(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` right after the module ``name`` has been imported."""

    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_hook(module: Any) -> None:
            exec_module(module)
            self.then(module)

        spec.loader.exec_module = exec_then_hook  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Prepare this process for recording (called by the bootstrap; cheap: imports no torch)."""
    global _recorder
    if _recorder is not None:
        return
    from dpro.collectors.collective_log import prepare_environment

    prepare_environment()
    run_dir = Path(os.environ[ENV_RUN_DIR])
    window = _Window(int(os.environ.get(ENV_SKIP, 10)), int(os.environ.get(ENV_WARMUP, 2)),
                     int(os.environ.get(ENV_STEPS, 5)))
    _recorder = _Recorder(run_dir, window, calibrate=os.environ.get(ENV_CALIBRATE, "1") != "0",
                          applier=from_environment(), probe=os.environ.get(ENV_PROBE) == "1")
    if "torch" in sys.modules:
        _on_torch_imported(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _ImportWatcher("torch", _on_torch_imported))
