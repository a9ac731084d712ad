"""The job's stderr through dpro: the profiler's and the allocator's messages to the node's log, the
rest to the terminal as the job wrote it.

torch.profiler's Kineto prints a line each time a rank's profiler starts and stops (``USDT: …
profiler_start``), and the CPU allocator warns once per rank that memory was allocated before
the profiling started: dozens of lines about dpro's own window, none about the job. They are kept,
line for line, in the node's ``job-stderr.log``; every other byte of the job's stderr reaches
dpro's stderr unchanged and at once (a partial line such as a progress bar's ``\\r`` update is
passed on before its line ends, unless it may still become one of those messages).

The job's stderr stays a terminal when dpro's is one (a pseudo-terminal of the same size), so a
job that colours its logs or draws progress bars on a terminal does so under dpro too.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import re
import select
import sys
import termios
import threading
import tty
from pathlib import Path
from typing import BinaryIO

__all__ = ["CHATTER", "StderrFilter"]

_MESSAGE = (
    rb"(\[rank\d+\]:)?("
    rb"(USDT|STAGE):\S+ \S+ \d+:\d+ \w+\.cpp:\d+\] "  # Kineto's markers of the profiler's start and stop
    rb"(profiler_start|profiler_stop|Completed Stage: [A-Z][a-z]+( [A-Z][a-z]+)?)|"
    rb"\[W\S+ \S+ (CPUAllocator|CUDACachingAllocator)\.cpp:\d+\] Memory block of unknown size was allocated "
    rb"before the profiling started, profiler results will not include the deallocation event"  # the allocator's
    rb")")
_ONE = re.compile(_MESSAGE)
CHATTER = re.compile(rb"(%s)+\r?" % _MESSAGE)
"""The lines of the job's stderr kept off the terminal: torch's messages about profiling itself,
one or several on a line (ranks that wrote at once: torch writes a message and its line end apart,
so each extra message on a line is followed by an empty line, which goes with it); a line mixed
with anything else reaches the terminal."""
_STARTS = (b"USDT:", b"STAGE:", b"[W", b"[rank")  # how a line of :data:`CHATTER` can begin
_DRAIN_S = 2.0  # after the job ends, how long to wait for what processes it left behind still write


class StderrFilter:
    """Sorts a job's stderr (see the module docstring). ``child_fd`` is what the job gets as its
    stderr; :meth:`start` after the job is started, :meth:`stop` after it ended."""

    def __init__(self, log: Path, out: BinaryIO | None = None) -> None:
        self.log_path = log
        self.out = out if out is not None else sys.stderr.buffer
        self.kept = 0  # lines sent to the log
        self.error: OSError | None = None  # why the log could not be written (its lines are then dropped)
        self.dropped = 0  # lines of torch's messages neither logged nor shown (the log could not be written)
        self._owed = 0  # line ends still to come of messages that ranks wrote onto one line
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.out.isatty():
            self._read_fd, self.child_fd = pty.openpty()
            tty.setraw(self.child_fd)  # bytes pass as written: no "\n" -> "\r\n" on the way
            try:
                fcntl.ioctl(self.child_fd, termios.TIOCSWINSZ, fcntl.ioctl(self.out.fileno(), termios.TIOCGWINSZ, b"\0" * 8))
            except OSError:
                pass
        else:
            self._read_fd, self.child_fd = os.pipe()

    def start(self) -> None:
        """Close dpro's copy of the job's end and sort what the job writes, in a thread."""
        os.close(self.child_fd)
        self._thread = threading.Thread(target=self._run, name="dpro-stderr-filter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Pass on what is left and close (waits at most a few seconds for processes the job left
        behind that still hold its stderr)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=_DRAIN_S + 1)

    def _run(self) -> None:
        pending = b""
        with self._log() as log:
            while True:
                ready, _, _ = select.select([self._read_fd], [], [], _DRAIN_S if self._stop.is_set() else 0.5)
                if not ready:
                    if self._stop.is_set():
                        break
                    continue
                try:
                    chunk = os.read(self._read_fd, 65536)
                except OSError as e:  # a pseudo-terminal whose every writer closed: EIO
                    if e.errno != errno.EIO:
                        raise
                    chunk = b""
                if not chunk:
                    break
                pending = self._sort(pending + chunk, log)
            if pending:
                self._pass(pending)
        os.close(self._read_fd)

    def _sort(self, data: bytes, log: BinaryIO) -> bytes:
        """Send ``data``'s whole lines where they belong; return the partial last line, unless
        it cannot become chatter (then it is passed on now)."""
        *lines, rest = data.split(b"\n")
        passed = []
        for line in lines:
            if CHATTER.fullmatch(line):  # logged, or dropped where the log cannot be written (a full disk)
                if self._logged(log, line + b"\n"):
                    self.kept += 1
                else:
                    self.dropped += 1
                self._owed += sum(1 for _ in _ONE.finditer(line)) - 1
            elif not line and self._owed:  # the line end of a message that shared a line with another's
                self._owed -= 1
            else:
                passed.append(line + b"\n")
        if rest and not any(rest.startswith(s) or s.startswith(rest) for s in _STARTS):
            passed.append(rest)
            rest = b""
        if passed:
            self._pass(b"".join(passed))
        return rest

    def _log(self) -> BinaryIO:
        """The log, or where nothing goes when it cannot be opened (a full disk)."""
        try:
            return open(self.log_path, "ab", buffering=0)
        except OSError as e:
            self.error = e
            return open(os.devnull, "wb")

    def _logged(self, log: BinaryIO, line: bytes) -> bool:
        if self.error is None:
            try:
                log.write(line)
                return True
            except OSError as e:
                self.error = e
        return False

    def _pass(self, data: bytes) -> None:
        try:
            self.out.write(data)
            self.out.flush()
        except OSError:
            pass  # dpro's stderr closed: the job keeps running, its messages are lost as they would be
