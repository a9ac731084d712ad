"""Run one function per rank: in this process, in a process pool over the cores, or on a Dask
distributed cluster.

The per-rank stage of the analysis is a plain function of a trace's path (see
:mod:`dpro.graph.reduction`), so it runs wherever that path can be read: each worker reads its
rank's trace itself, and only the small per-rank reduction travels back to the coordinating
process. With a scheduler (``--scheduler ADDRESS`` or ``$DPRO_SCHEDULER``) the tasks go to that
Dask cluster, whose workers must see the run directory at the same path (a shared file
system, or the machine that recorded it); otherwise a process pool with one worker per core
(at most one per task) runs them, and a single task runs here. The pool forks this process; from
a process that runs other threads it starts its workers from a fork server instead, which, as
``spawn`` does, imports the caller's main module: a script that analyses runs from several
threads guards its entry point with ``if __name__ == "__main__":``.

    >>> map_ranks(reduce_trace, [(path0, 0), (path1, 1)], workers=2)      # doctest: +SKIP
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import Any

from dpro.errors import DproError

__all__ = ["SCHEDULER_ENV", "FanoutError", "map_ranks", "scheduler_address"]

SCHEDULER_ENV = "DPRO_SCHEDULER"


class FanoutError(DproError):
    """The per-rank work could not be spread (no Dask, an unreachable scheduler)."""


def scheduler_address(scheduler: str | None = None) -> str | None:
    """The Dask scheduler to use: the one given, else ``$DPRO_SCHEDULER``, else none."""
    return scheduler or os.environ.get(SCHEDULER_ENV) or None


def map_ranks(fn: Callable[..., Any], tasks: Sequence[tuple], *, scheduler: str | None = None,
              workers: int | None = None, progress: bool = False, desc: str = "ranks") -> list[Any]:
    """``[fn(*task) for task in tasks]``, spread over workers; results in the order of ``tasks``.

    ``scheduler``: a Dask scheduler address (default ``$DPRO_SCHEDULER``); ``workers``: the
    size of the local process pool (default: the cores, at most one per task; 1 runs here).
    ``progress`` shows a progress bar on stderr. A task's exception is raised here.
    """
    address = scheduler_address(scheduler)
    if address:
        return _on_dask(fn, tasks, address, progress, desc)
    workers = min(workers or os.cpu_count() or 1, len(tasks))
    if workers > 1:
        return _in_pool(fn, tasks, workers, progress, desc)
    results = []
    with _progress_bar(len(tasks), desc, progress) as bar:
        for task in tasks:
            results.append(fn(*task))
            bar.update()
    return results


def _in_pool(fn: Callable[..., Any], tasks: Sequence[tuple], workers: int, progress: bool, desc: str) -> list[Any]:
    # Workers are forked from this process (cheap: the analysis is imported already), unless it
    # runs other threads, which a fork would leave behind holding their locks: then from a
    # fork server (whose workers, like spawned ones, import the caller's main module).
    method = "fork" if threading.active_count() == 1 else "forkserver"
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method)) as pool:
        futures = {pool.submit(fn, *task): i for i, task in enumerate(tasks)}
        with _progress_bar(len(tasks), desc, progress) as bar:  # its monitor thread starts after the fork
            return _gather(futures, as_completed(futures), bar)


def _on_dask(fn: Callable[..., Any], tasks: Sequence[tuple], address: str, progress: bool, desc: str) -> list[Any]:
    try:
        from distributed import Client
        from distributed import as_completed as dask_completed
    except ImportError:
        raise FanoutError("a Dask scheduler was given but dask.distributed is not installed "
                          "(pip install distributed)") from None
    import dask

    try:  # Dask's own connect timeout (30 s; $DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT)
        client = Client(address, timeout=dask.config.get("distributed.comm.timeouts.connect"), set_as_default=False)
    except (OSError, TimeoutError) as e:
        raise FanoutError(f"cannot reach the Dask scheduler at {address}: {e}") from None
    with client, _progress_bar(len(tasks), desc, progress) as bar:
        futures = {client.submit(fn, *task, pure=False): i for i, task in enumerate(tasks)}
        return _gather(futures, dask_completed(list(futures), loop=client.loop), bar)


def _gather(futures: dict[Future, int], done: Any, bar: Any) -> list[Any]:
    results: list[Any] = [None] * len(futures)
    for future in done:
        results[futures[future]] = future.result()
        bar.update()
    return results


def _progress_bar(total: int, desc: str, show: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="rank", disable=not show, leave=False)
