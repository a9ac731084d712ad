"""A background sampler that appends rows to a CSV file as it takes them (a killed job keeps
what was sampled). Runs in the ``dpro record`` process, so the training processes pay nothing."""

from __future__ import annotations

import csv
import threading
from pathlib import Path
from typing import Any

from dpro.run_format import not_saved_reason


class CsvSampler:
    """Calls :meth:`_sample` every ``interval_s`` in a daemon thread and writes its rows under
    the header ``columns``; a failure ends the sampling and is kept in :attr:`error` (a note,
    never the job's problem). Subclasses start the thread with :meth:`_launch`."""

    columns: tuple[str, ...] = ()

    def __init__(self, path: Path, interval_s: float) -> None:
        self.path = path
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self.lost: OSError | None = None  # the file could not be written (a full disk, a removed run folder)

    def _launch(self, name: str) -> None:
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and wait for the thread (a bounded time)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _sample(self) -> list[list[Any]]:
        raise NotImplementedError

    def _run(self) -> None:
        try:
            with open(self.path, "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(self.columns)
                while not self._stop.is_set():
                    writer.writerows(self._sample())
                    f.flush()
                    self._stop.wait(self.interval_s)
        except OSError as e:  # the file (a full disk, a removed run folder): said as what was not saved
            self.error, self.lost = f"not saved: {not_saved_reason(e)}", e
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
