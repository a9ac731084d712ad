"""Matched collectives → the sends and receives of their algorithm, in the dataflow graph.

Each rank's instance of a collective stays in the graph as its *arrival* (duration 0, where it
was issued on its thread or stream). The collective becomes the transfers of its algorithm
(:func:`dpro.graph.collectives.schedule`), one node per send on the resource
``link/<src>-><dst>``, and one *done* node per rank that everything which followed
the instance on that rank now follows. A send waits for both ends to have arrived, for the
data it forwards (the latest send into its sender at an earlier step) and for its sender's
previous send. The collective's measured transfer time (its shortest instance: the last rank to
arrive waits the least) is spread over the algorithm's steps, so that the decomposed collective
ends when the measured one did; the rest of each instance was waiting for the slowest rank, but
for what it ended after the shortest one's end: a rank's *done* node lasts that long
(:func:`_finished_late`; a what-if re-times it with the collective's sends).

Collectives over the same ranks share their links: a backend that runs several at once (gloo's
worker threads) splits the links' bandwidth between them, so each one's measured time holds
the others' bytes too. The links are modelled as queues instead (:func:`_link_queue`): a
collective that was issued while an earlier one over the same ranks was still running starts
its transfer when that one ended (its first sends wait for the earlier one's *done* nodes), and
its transfer time is what it took beyond that. Both still end when measured; the two transfer
times add up to the time the links were busy, and a what-if that fuses, splits or resizes them
sees the links' rate, not a share of it.

Everything is computed on arrays, a collective at a time: a ring all-reduce over 256 ranks is
130,560 sends.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpro.graph.collectives import Schedule, schedule
from dpro.graph.vocabulary import P2P_FAMILIES, collective_family

__all__ = ["EDGE_COLUMNS", "Matched", "decompose"]

EDGE_COLUMNS = ["src", "dst", "lag_ns", "kind"]


@dataclass
class Matched:
    """One collective seen on every rank of its group: its instances' node ids by rank."""

    coll: str
    occurrence: int
    instances: dict[int, int]  # rank -> node id of its instance
    nbytes: float = float("nan")
    algorithm: str | None = None
    group: str = ""  # its process group's name
    root: int = 0  # the sender of a send, as an index into the members in rank order


def decompose(nodes: pd.DataFrame, edges: pd.DataFrame, matched: list[Matched]) -> tuple[pd.DataFrame, pd.DataFrame,
                                                                                       pd.DataFrame]:
    """Expand ``matched`` collectives in place of their instances (see the module docstring).

    ``nodes`` (``rank``, ``kind``, ``resource``, ``name``, ``dur_ns``, ``offset_ns``,
    ``coll_name``...) and ``edges`` (:data:`EDGE_COLUMNS`) are the graph's. Returns the nodes
    with the new ones appended (``rank`` of a send is its sender's), the edges with the new ones
    appended and those that followed an instance now leaving its rank's done node, and a table
    of the collectives: ``coll``, ``occurrence``, ``algorithm``, ``bytes``, ``ranks``,
    ``transfer_ns``, ``wait_ns`` (per rank, in rank order), ``sends`` and ``done`` (node ids).
    """
    base = len(nodes)
    new_nodes: list[pd.DataFrame] = []
    new_edges: list[pd.DataFrame] = []
    table = []
    done_of = np.full(base, -1, np.int64)  # instance id -> its rank's done node
    offset, dur, resource = (nodes[c].to_numpy() for c in ("offset_ns", "dur_ns", "resource"))
    behind, begins = _link_queue(matched, offset.astype(np.float64), dur.astype(np.float64))
    done_by: list[np.ndarray] = []  # per collective, its done nodes in rank order
    first_sends: list[tuple[np.ndarray, np.ndarray]] = []  # per collective, its step-0 sends and their senders
    for i, m in enumerate(matched):
        ranks = np.array(sorted(m.instances), np.int64)
        ids = np.array([m.instances[r] for r in ranks], np.int64)
        arrive = offset[ids].astype(np.float64)
        end = _end(m, offset, dur)
        transfer = end - begins[i]
        sends = schedule(m.coll, len(ranks), m.algorithm, root=m.root)
        first_send = base + sum(len(f) for f in new_nodes)
        send_ids = first_send + np.arange(len(sends))
        step_ns = _step_durations(sends, transfer)
        start = begins[i] + np.concatenate([[0.0], np.cumsum(step_ns)[:-1]]) if len(step_ns) else step_ns
        new_nodes.append(_send_nodes(m, ranks, sends, step_ns, start))
        last_in = _latest_before(sends.dst, sends.step, send_ids, sends.src, sends.step)
        last_out = _latest_before(sends.src, sends.step, send_ids, sends.src, sends.step)
        per_send = np.stack([ids[sends.src], ids[sends.dst], last_in, last_out], axis=1)
        kinds = np.broadcast_to(np.array([0, 0, 1, 1]), per_send.shape)  # arrive, arrive, transfer, transfer
        keep = per_send >= 0
        new_edges.append(_edges(per_send[keep], np.repeat(send_ids, 4).reshape(-1, 4)[keep], kinds[keep]))
        done_ids = send_ids[-1] + 1 + np.arange(len(ranks)) if len(sends) else first_send + np.arange(len(ranks))
        members = np.arange(len(ranks))
        final_in = _latest_before(sends.dst, sends.step, send_ids, members, np.full(len(ranks), sends.steps))
        final_out = _latest_before(sends.src, sends.step, send_ids, members, np.full(len(ranks), sends.steps))
        final_out = np.where(final_out == final_in, -1, final_out)
        into_done = np.stack([ids, final_in, final_out], axis=1)
        keep = into_done >= 0
        new_edges.append(_edges(into_done[keep], np.repeat(done_ids, 3).reshape(-1, 3)[keep],
                                np.broadcast_to(np.array([0, 1, 1]), into_done.shape)[keep]))
        new_nodes.append(pd.DataFrame({
            "rank": ranks, "kind": "collective", "resource": resource[ids], "name": f"{m.coll}#{m.occurrence}",
            "dur_ns": _finished_late(m, ids, offset, dur, end), "offset_ns": end, "coll_name": m.coll,
            "pg_name": m.group, "bytes": m.nbytes}))
        done_of[ids] = done_ids
        done_by.append(done_ids)
        first_sends.append((send_ids[sends.step == 0], sends.src[sends.step == 0]))
        table.append({"coll": m.coll, "occurrence": m.occurrence, "group": m.group, "algorithm": m.algorithm,
                      "bytes": m.nbytes,
                      "ranks": ranks.tolist(), "transfer_ns": transfer, "wait_ns": (arrive.max() - arrive).tolist(),
                      "sends": send_ids.tolist(), "done": done_ids.tolist()})
    for i, j in enumerate(behind):  # a queued collective's first sends wait for the earlier one's done nodes
        if j >= 0:
            sends_, senders = first_sends[i]
            new_edges.append(_edges(done_by[j][senders], sends_, np.ones(len(sends_), np.int64)))
    src = edges["src"].to_numpy(np.int64)
    moved = (src < base) & (done_of[np.minimum(src, base - 1)] >= 0) & (edges["kind"] != "arrive").to_numpy()
    if moved.any():
        edges = edges.assign(src=np.where(moved, done_of[np.minimum(src, base - 1)], src))
    nodes = nodes.copy()
    instances = np.flatnonzero(done_of >= 0)
    nodes.loc[instances, "dur_ns"] = 0.0
    out_nodes = pd.concat([nodes, *new_nodes], ignore_index=True) if new_nodes else nodes
    out_edges = pd.concat([edges, *new_edges], ignore_index=True) if new_edges else edges
    return out_nodes, out_edges, pd.DataFrame(table)


_EDGE_KINDS = np.array(["arrive", "transfer"], dtype=object)


def _edges(src: np.ndarray, dst: np.ndarray, kind: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"src": src.astype(np.int64), "dst": dst.astype(np.int64), "lag_ns": np.zeros(len(src), np.int64),
                         "kind": _EDGE_KINDS[kind]})


def _finished_late(m: Matched, ids: np.ndarray, offset: np.ndarray, dur: np.ndarray, end: float) -> np.ndarray:
    """Per rank (in rank order), how long after the collective's end (:func:`_end`) its own
    instance ended: a ring's ranks finish apart (those whose last piece crossed a slower link
    later; measured 12-14 ms apart on a 4-rank all-gather over two hosts). 0 for a send or receive."""
    if collective_family(m.coll) in P2P_FAMILIES and len(ids) == 2:
        return np.zeros(len(ids))
    return np.maximum(0.0, offset[ids].astype(np.float64) + dur[ids].astype(np.float64) - end)


def _send_nodes(m: Matched, ranks: np.ndarray, sends: Schedule, step_ns: np.ndarray, start: np.ndarray) -> pd.DataFrame:
    """One node per send: on its link, named after its collective and step."""
    a, b = ranks[sends.src], ranks[sends.dst]
    links, which = np.unique(np.stack([a, b], axis=1), axis=0, return_inverse=True)
    link_names = np.array([f"link/{x}->{y}" for x, y in links], dtype=object)
    step_names = np.array([f"{m.coll}#{m.occurrence} step {s}" for s in range(sends.steps)], dtype=object)
    return pd.DataFrame({"rank": a, "kind": "transfer", "resource": link_names[which.reshape(-1)],
                         "name": step_names[sends.step], "dur_ns": step_ns[sends.step], "offset_ns": start[sends.step],
                         "coll_name": m.coll, "pg_name": m.group, "bytes": m.nbytes * sends.fraction})


def _latest_before(member: np.ndarray, step: np.ndarray, ids: np.ndarray, query_member: np.ndarray,
                   query_step: np.ndarray) -> np.ndarray:
    """For each query, the id of the last send (in schedule order) whose ``member`` is the
    query's and whose step is earlier than the query's; -1 when there is none."""
    if not len(member):
        return np.full(len(query_member), -1, np.int64)
    width = int(max(step.max(), query_step.max())) + 1
    keys = member * width + step
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    at = np.searchsorted(sorted_keys, query_member * width + query_step, "left") - 1
    found = (at >= 0) & (sorted_keys[np.maximum(at, 0)] // width == query_member)
    return np.where(found, ids[order][np.maximum(at, 0)], -1)


def _link_queue(matched: list[Matched], offset: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per collective, the index of the earlier collective over the same ranks it queued behind
    (-1: none) and when its transfer began: when its last rank arrived, or, if an earlier
    collective over the same ranks was still running then and ended before it, when that one
    ended (the latest such end). A collective that ended first keeps its own arrival."""
    arrive = np.array([offset[list(m.instances.values())].max() for m in matched], np.float64)
    end = np.array([_end(m, offset, dur) for m in matched], np.float64)
    behind = np.full(len(matched), -1, np.int64)
    begins = arrive.copy()
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, m in enumerate(matched):
        groups.setdefault(tuple(sorted(m.instances)), []).append(i)
    for members in groups.values():
        members.sort(key=lambda i: arrive[i])
        last = -1  # the collective whose end is the latest so far
        for i in members:
            if last >= 0 and arrive[i] < end[last] < end[i]:
                behind[i], begins[i] = last, end[last]
            if last < 0 or end[i] > end[last]:
                last = i
    return behind, begins


def _end(m: Matched, offset: np.ndarray, dur: np.ndarray) -> float:
    """When a matched collective ended: its last rank's arrival plus its shortest instance (the
    last to arrive waited least); a send when its receiver had the data (a send's own span
    ends when its sender next looks, not when the data left)."""
    ids = [m.instances[r] for r in sorted(m.instances)]
    arrive = float(max(offset[i] for i in ids))
    if collective_family(m.coll) in P2P_FAMILIES and len(ids) == 2:
        receiver = ids[1 - m.root]
        return max(arrive, float(offset[receiver]) + float(dur[receiver]))
    return arrive + float(min(dur[i] for i in ids))


def _step_durations(sends: Schedule, total_ns: float) -> np.ndarray:
    """``total_ns`` spread over the schedule's steps in proportion to the largest share of the
    data sent in each step."""
    share = np.zeros(sends.steps)
    np.maximum.at(share, sends.step, sends.fraction)
    return total_ns * share / share.sum() if sends.steps else share
