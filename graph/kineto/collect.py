"""Decoded pieces of a trace to numpy columns: complete events, flows and instants."""

from __future__ import annotations

import numpy as np

from dpro.graph.kineto.numbers import to_ints, ts_ns, us_to_ns
from dpro.graph.kineto.strings import Factorizer
from dpro.graph.kineto.structs import Event
from dpro.graph.vocabulary import GPU_CATEGORIES, modern_category


PHASE_LABELS = ["s", "t", "f"]  # flow start, step, finish
_PHASE_CODE = np.full(256, -1, np.int32)
_PHASE_CODE[[ord(p) for p in PHASE_LABELS]] = range(len(PHASE_LABELS))


class Columns:
    """numpy columns of one table, appended a piece at a time."""

    def __init__(self) -> None:
        self._parts: dict[str, list[np.ndarray]] = {}

    def append(self, **columns: np.ndarray) -> None:
        for name, values in columns.items():
            self._parts.setdefault(name, []).append(values)

    def __getitem__(self, name: str) -> np.ndarray:
        parts = self._parts.get(name)
        return np.concatenate(parts) if parts else np.empty(0, np.int64)


class Collector:
    """Turns decoded pieces of the trace into columns of complete events, flows and instants.

    Columns that few events have are kept sparse, as rows and values: ``gpu`` (stream, device)
    and ``comm`` (the args of collectives, read where the args name one).
    """

    def __init__(self) -> None:
        self.events, self.gpu, self.comm = Columns(), Columns(), Columns()
        self.flows, self.instants = Columns(), Columns()
        self.n_events = 0
        self.text = {name: Factorizer()
                     for name in ("cat", "name", "flow_cat", "coll_name", "dtype", "pg_name", "pg_desc")}
        self._is_gpu = np.zeros(1, bool)  # by category code, and False for -1 last

    def add(self, events: list[Event]) -> bool:
        """Add a piece's events; False, adding nothing, if their float ``ts`` lost nanoseconds."""
        ts = ts_ns(events)
        if ts is None:
            return False
        phases = _phases(events)
        complete = np.flatnonzero(phases == ord("X"))
        if len(complete):
            self._add_complete([events[i] for i in complete.tolist()], ts[complete])
        flows = np.flatnonzero(_PHASE_CODE[phases] >= 0)
        if len(flows):
            f = [events[i] for i in flows.tolist()]
            self.flows.append(cat=self.text["flow_cat"]([e.cat for e in f]), flow_id=to_ints([e.id for e in f]),
                              phase=_PHASE_CODE[phases[flows]], pid=to_ints([e.pid for e in f]),
                              tid=to_ints([e.tid for e in f]), ts_ns=ts[flows])
        self.instants.append(ts_ns=ts[(phases == ord("i")) | (phases == ord("I"))])
        return True

    def _add_complete(self, events: list[Event], ts_ns: np.ndarray) -> None:
        n, text, args = len(events), self.text, [e.args for e in events]
        cat = text["cat"]([e.cat for e in events])
        external_id = to_ints([a.external_id for a in args])
        old = np.flatnonzero(external_id < 0).tolist()  # the 2021 schema's "external id"
        external_id[old] = to_ints([args[i].old_external_id for i in old])
        coll_name = text["coll_name"]([a.coll_name for a in args])
        self.events.append(
            cat=cat, name=text["name"]([e.name for e in events]),
            pid=to_ints([e.pid for e in events]), tid=to_ints([e.tid for e in events]),
            start_ns=ts_ns, dur_ns=us_to_ns(np.fromiter([e.dur for e in events], np.float64, n)),
            external_id=external_id, correlation=to_ints([a.correlation for a in args]))
        gpu = np.flatnonzero(self._gpu_flags()[cat]).tolist()
        if gpu:
            self.gpu.append(row=np.array(gpu) + self.n_events, stream=to_ints([args[i].stream for i in gpu]),
                            device=to_ints([args[i].device for i in gpu]))
        comm = np.flatnonzero(coll_name >= 0).tolist()
        if comm:
            a = [args[i] for i in comm]
            self.comm.append(
                row=np.array(comm) + self.n_events, coll_name=coll_name[comm],
                in_nelems=to_ints([x.in_nelems for x in a]), out_nelems=to_ints([x.out_nelems for x in a]),
                group_size=to_ints([x.group_size for x in a]), pg_id=to_ints([x.pg_id for x in a]),
                seq=to_ints([x.seq if x.seq != -1 else x.seq_lower for x in a]),
                dtype=text["dtype"]([x.dtype for x in a]), pg_name=text["pg_name"]([x.pg_name for x in a]),
                pg_desc=text["pg_desc"]([x.pg_desc for x in a]))
        self.n_events += n

    def _gpu_flags(self) -> np.ndarray:
        """Whether each category code is a GPU one, with False for code -1 last."""
        labels = self.text["cat"].labels
        if len(self._is_gpu) != len(labels) + 1:
            self._is_gpu = np.array([modern_category(c) in GPU_CATEGORIES for c in labels] + [False])
        return self._is_gpu


def _phases(events: list[Event]) -> np.ndarray:
    """The events' one-letter ``ph`` as bytes (``?`` for anything else), without hashing strings."""
    phases = "".join([e.ph for e in events])
    if len(phases) != len(events):
        phases = "".join([e.ph if len(e.ph) == 1 else "?" for e in events])
    return np.frombuffer(phases.encode("latin-1", "replace"), np.uint8)


def dense(n: int, sparse: Columns, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Sparse columns in full, -1 where they have no value."""
    rows, columns = sparse["row"], {}
    for name in names:
        values = sparse[name]
        columns[name] = np.full(n, -1, values.dtype)
        columns[name][rows] = values
    return columns
