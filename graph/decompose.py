"""Matched collectives → the sends and receives of their algorithm, in the dataflow graph.

Each rank's instance of a collective stays in the graph as its *arrival* (duration 0, where it
was issued on its thread or stream). The collective becomes the transfers of its algorithm
(:func:`dpro.graph.collectives.schedule`), one node per send on the resource
``link/<src>-><dst>``, and one *done* node per rank (duration 0) that everything which followed
the instance on that rank now follows. A send waits for both ends to have arrived, for the
data it forwards (the sends into its sender at earlier steps) and for its sender's previous
send. The collective's measured transfer time (its shortest instance: the last rank to arrive
waits the least) is spread over the algorithm's steps, so that the decomposed collective ends
when the measured one did; the rest of each instance was waiting for the slowest rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .collectives import Transfer, schedule, steps_of


@dataclass
class Matched:
    """One collective seen on every rank of its group: its instances' node ids by rank."""

    coll: str
    occurrence: int
    instances: dict[int, int]  # rank -> node id of its instance
    nbytes: float = float("nan")
    algorithm: str | None = None


def decompose(nodes: pd.DataFrame, edges: list[tuple[int, int, int, str]],
              matched: list[Matched]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Expand ``matched`` collectives in place of their instances (see the module docstring).

    ``edges`` is changed in place. Returns the nodes with the new ones appended (``rank`` of a
    send is its sender's) and a table of the collectives: ``coll``, ``occurrence``,
    ``algorithm``, ``bytes``, ``ranks``, ``transfer_ns``, ``wait_ns`` (per rank, in rank order),
    ``sends`` and ``done`` (node ids).
    """
    rows: list[dict] = []
    done_of: dict[int, int] = {}  # instance id -> its rank's done node
    table = []
    base = len(nodes)
    for m in matched:
        ranks = sorted(m.instances)
        ids = [m.instances[r] for r in ranks]
        dur = nodes.loc[ids, "dur_ns"].to_numpy(np.float64)
        arrive = nodes.loc[ids, "offset_ns"].to_numpy(np.float64)
        transfer = float(dur.min())
        first_done = float(arrive.max()) + transfer
        transfers = schedule(m.coll, len(ranks), m.algorithm)
        step_ns = _step_durations(transfers, transfer)
        sends = []
        last_in: dict[int, int] = {}   # member -> its latest incoming send
        last_out: dict[int, int] = {}  # member -> its latest send
        clock = float(arrive.max())
        for step in range(steps_of(transfers)):
            in_step = [t for t in transfers if t.step == step]
            made = []
            for t in in_step:
                v = base + len(rows)
                rows.append({"rank": ranks[t.src], "kind": "transfer", "resource": f"link/{ranks[t.src]}->{ranks[t.dst]}",
                             "name": f"{m.coll}#{m.occurrence} step {step}", "dur_ns": step_ns[step],
                             "offset_ns": clock, "coll_name": m.coll, "bytes": m.nbytes * t.fraction})
                edges += [(ids[t.src], v, 0, "arrive"), (ids[t.dst], v, 0, "arrive")]
                for before in (last_in.get(t.src), last_out.get(t.src)):
                    if before is not None:
                        edges.append((before, v, 0, "transfer"))
                made.append((t, v))
                sends.append(v)
            for t, v in made:  # this step's sends are inputs of the next step's
                last_in[t.dst], last_out[t.src] = v, v
            clock += step_ns[step]
        done = []
        for member, (rank, i) in enumerate(zip(ranks, ids)):
            v = base + len(rows)
            rows.append({"rank": rank, "kind": "collective", "resource": nodes.at[i, "resource"],
                         "name": f"{m.coll}#{m.occurrence}", "dur_ns": 0.0, "offset_ns": first_done,
                         "coll_name": m.coll, "bytes": m.nbytes})
            edges.append((i, v, 0, "arrive"))
            edges += [(u, v, 0, "transfer") for u in {last_in.get(member), last_out.get(member)} if u is not None]
            done_of[i] = v
            done.append(v)
        table.append({"coll": m.coll, "occurrence": m.occurrence, "algorithm": m.algorithm, "bytes": m.nbytes,
                      "ranks": ranks, "transfer_ns": transfer, "wait_ns": list(arrive.max() - arrive),
                      "sends": sends, "done": done})
    for e, (src, dst, lag, kind) in enumerate(edges):
        if src in done_of and kind != "arrive":
            edges[e] = (done_of[src], dst, lag, kind)
    nodes = nodes.copy()
    nodes.loc[list(done_of), "dur_ns"] = 0.0
    return pd.concat([nodes, pd.DataFrame(rows)], ignore_index=True), pd.DataFrame(table)


def _step_durations(transfers: list[Transfer], total_ns: float) -> list[float]:
    """``total_ns`` spread over the schedule's steps in proportion to the largest share of the
    data sent in each step."""
    n = steps_of(transfers)
    share = np.zeros(n)
    for t in transfers:
        share[t.step] = max(share[t.step], t.fraction)
    return list(total_ns * share / share.sum()) if n else []
