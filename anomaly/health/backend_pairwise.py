"""The pairwise host bandwidth matrix over the job's own backend (point-to-point sends).

One rank per host (its lowest) probes, in the rounds of :func:`dpro.anomaly.fabric.schedule.probe_rounds`
(every pair of hosts once; given each host's edge switch and pod, no two probes of a round on one
link, whichever path ECMP picks); a pair measures one way, then the other, while the other pairs
of the round do the same. Where the fabric routes by destination (``pairwise.routes``), the
first sweep takes the rounds of :func:`dpro.anomaly.fabric.schedule.disjoint_rounds` instead
(the routes read from the topology: as many pairs out of a pod as its uplinks carry apart), and
a pair measures both ways at once. Given the topology, the pairs whose probes may cross a class
the first sweep left in doubt are probed again (:mod:`dpro.anomaly.fabric.follow_up`), in rounds
kept apart the same way; without it, the pairs of the paths the matrix names
(:func:`dpro.anomaly.fabric.follow_up.confirm_paths`).

A direction is measured by sending messages of ``megabytes`` back to back, as many as fill about
``seconds`` (sized from one timed message), and waiting for the receiver's acknowledgement.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import networkx as nx
import numpy as np
import torch
import torch.distributed as dist

from dpro.anomaly.fabric.follow_up import SWEEPS, confirm_paths, probe_adaptively, repeated
from dpro.anomaly.fabric.probes import Probes
from dpro.anomaly.fabric.routing import Routing
from dpro.anomaly.fabric.schedule import disjoint_rounds, probe_rounds
from dpro.anomaly.health.budget import Budget

__all__ = ["Measured", "leaders", "measure_pairwise"]

MAX_MESSAGES = 512
ACK_TAG = 1
"""The acknowledgements' tag while a pair probes both ways at once (gloo; the messages keep tag 0)."""


def leaders(rank_hosts: Sequence[str]) -> list[int]:
    """The lowest rank of each host, in order of first appearance."""
    seen: dict[str, int] = {}
    for rank, host in enumerate(rank_hosts):
        seen.setdefault(host, rank)
    return list(seen.values())


class Measured(NamedTuple):
    """The probes (Gb/s, sender to receiver), None with a single host; what the check's budget
    cut (rounds not run once it ran out), if anything; the host-pair probes made again (a pair
    probed twice counts twice); and the rounds the first sweep was scheduled in."""

    probes: Probes | None
    cut: str | None
    again: int
    first_rounds: int


def measure_pairwise(rank_hosts: Sequence[str], megabytes: float, seconds: float, device: torch.device,
                     tiers: Sequence[dict[str, str]] = (), budget: Budget | None = None,
                     topology: nx.MultiGraph | None = None,
                     routing: Routing | None = None, sweeps: int = SWEEPS) -> Measured:
    """What :class:`Measured` holds, on every rank. Every rank must call it; ``tiers``: host ->
    edge switch, host -> pod, to keep probes of a round apart. With the ``topology``, the first
    sweep is followed up where it leaves a class in doubt
    (:func:`dpro.anomaly.fabric.follow_up.probe_adaptively`; every rank takes the same
    decisions from the same gathered probes). ``routing``: the topology's known routes
    (by destination); the rounds then follow them, each pair both ways at once (over gloo;
    NCCL takes no tags to keep a pair's two streams apart, so there one way after the other),
    and the follow-ups weigh the probes by them. Every round is measured ``sweeps`` times, each
    probe ``seconds / sweeps`` long, and each direction's median kept: the job keeps one
    connection between two ranks, so a repeat takes the same path
    (:func:`dpro.anomaly.fabric.follow_up.repeated`)."""
    heads = leaders(rank_hosts)
    hosts = [rank_hosts[r] for r in heads]
    if len(heads) < 2:
        return Measured(None, None, 0, 0)
    groups = [[tier.get(h, h) for h in hosts] for tier in tiers]
    elements = max(1, int(megabytes * 2**20) // 4)
    cut: list[str] = []

    both_ways = routing is not None and dist.get_backend() == "gloo"

    schedule = _routed(routing, hosts) if routing is not None else None
    first = schedule(None) if schedule is not None else probe_rounds(len(heads), groups)

    opened: set[tuple[int, int]] = set()  # directions probed before: their connection is open

    def measure(rounds: list[list[tuple[int, int]]], first_round: int) -> Probes:
        rows = _probe_rounds(heads, rounds, first_round, elements, seconds / sweeps, device, budget, cut, both_ways,
                             opened, max(1, MAX_MESSAGES // sweeps))  # the repeats share the cap, as the time
        return Probes(hosts, rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64), rows[:, 2].astype(np.int64),
                      rows[:, 3], both_ways=both_ways)

    if topology is None:
        probes, again = confirm_paths(measure, repeated(measure, first, sweeps), groups, sweeps,
                                      sweeps * len(first), _rank0s)
        return Measured(probes, (cut or [None])[0], again, len(first))
    probes, added = probe_adaptively(measure, topology, groups, first, agree=_rank0s, schedule=schedule,
                                     routing=routing, sweeps=sweeps)
    return Measured(probes, (cut or [None])[0], added, len(first))


def _routed(routing: Routing, hosts: list[str]) -> Callable[[Sequence[tuple[int, int]] | None],
                                                           list[list[tuple[int, int]]]]:
    """The rounds of the given pairs of ``hosts`` (every pair: None) under ``routing``
    (:func:`dpro.anomaly.fabric.schedule.disjoint_rounds`)."""
    members = np.array([routing.hosts.index(h) for h in hosts])

    def schedule(pairs: Sequence[tuple[int, int]] | None) -> list[list[tuple[int, int]]]:
        return [[(int(a), int(b)) for a, b in r] for r in disjoint_rounds(routing, members, pairs)]

    return schedule


def _rank0s(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Rank 0's follow-up pairs, on every rank: each rank computes them from the same probes,
    but a last bit of floating point may differ between hosts, and a rank that probed other
    pairs would wait forever for its peers."""
    chosen = [pairs]
    dist.broadcast_object_list(chosen, src=0)
    return chosen[0]


def _probe_rounds(heads: list[int], rounds: list[list[tuple[int, int]]], first_round: int, elements: int,
                  seconds: float, device: torch.device, budget: Budget | None, cut: list[str],
                  both_ways: bool = False, opened: set[tuple[int, int]] | None = None,
                  max_messages: int = MAX_MESSAGES) -> np.ndarray:
    """Run ``rounds`` (host indices; the hosts' lowest ranks probe), each pair one way then the
    other, or ``both_ways`` at once; rows ``(src, dst, round, Gb/s)`` on every rank. Once the
    ``budget`` is spent the rest is not run, and said in ``cut``. ``opened``: the directions
    probed before (every rank keeps the same set), whose first message need not open the
    connection again; ``max_messages``: a probe's cap."""
    opened = set() if opened is None else opened
    me = dist.get_rank()
    found: list[tuple[int, int, int, float]] = []
    for index, pairs in enumerate(rounds):
        if budget is not None and budget.spent(device):
            cut.append(budget.cut(f"{len(rounds) - index} of {len(rounds)} probe rounds not run"))
            break
        for a, b in pairs:
            warm = {(a, b): (a, b) in opened, (b, a): (b, a) in opened}
            opened.update(warm)
            if both_ways and me in (heads[a], heads[b]):
                src, dst = (a, b) if me == heads[a] else (b, a)
                gbps = _exchange(heads[dst], elements, seconds, device, warm[src, dst], warm[dst, src], max_messages)
                found.append((src, dst, first_round + index, gbps))
                continue
            for src, dst in ((a, b), (b, a)):
                if me == heads[src]:
                    gbps = _send(heads[dst], elements, seconds, device, opened=warm[src, dst],
                                 max_messages=max_messages)
                    found.append((src, dst, first_round + index, gbps))
                elif me == heads[dst]:
                    _receive(heads[src], elements, device, opened=warm[src, dst])
        dist.barrier()
    everyone: list[list[tuple[int, int, int, float]]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(everyone, found)
    return np.array([p for part in everyone for p in part], np.float64).reshape(-1, 4)


def _exchange(peer: int, elements: int, seconds: float, device: torch.device, sending_opened: bool = False,
              receiving_opened: bool = False, max_messages: int = MAX_MESSAGES) -> float:
    """Send to ``peer`` while receiving its probe (a thread receives); Gb/s sent. The
    acknowledgements go on a tag of their own (:data:`ACK_TAG`), so that neither side takes the
    other's acknowledgement for a message of its probe."""
    failed: list[Exception] = []

    def receive() -> None:
        try:
            _receive(peer, elements, device, ack_tag=ACK_TAG, opened=receiving_opened)
        except Exception as e:  # raised again on the probing thread
            failed.append(e)

    receiver = threading.Thread(target=receive, name="dpro-health-probe", daemon=True)
    receiver.start()
    try:
        gbps = _send(peer, elements, seconds, device, ack_tag=ACK_TAG, opened=sending_opened,
                     max_messages=max_messages)
    finally:
        receiver.join()
    if failed:
        raise failed[0]
    return gbps


def _send(peer: int, elements: int, seconds: float, device: torch.device, ack_tag: int = 0,
          opened: bool = False, max_messages: int = MAX_MESSAGES) -> float:
    message = torch.ones(elements, device=device)
    ack = torch.zeros(1, device=device)
    # not timed: the first message opens the connection; on an open one a one-element ping
    # lines the two sides up, so that the timed message below does not wait for the receiver
    dist.send(ack if opened else message, peer)
    dist.recv(ack, peer, tag=ack_tag)
    start = time.perf_counter()
    dist.send(message, peer)
    dist.recv(ack, peer, tag=ack_tag)
    one = time.perf_counter() - start
    count = int(min(max_messages, max(1, round(seconds / max(one, 1e-6)))))
    dist.send(torch.tensor([float(count)], device=device), peer)
    start = time.perf_counter()
    for _ in range(count):
        dist.send(message, peer)
    dist.recv(ack, peer, tag=ack_tag)
    elapsed = time.perf_counter() - start
    return count * elements * 4 * 8 / elapsed / 1e9


def _receive(peer: int, elements: int, device: torch.device, ack_tag: int = 0, opened: bool = False) -> None:
    message = torch.empty(elements, device=device)
    ack = torch.zeros(1, device=device)
    for first in (True, False):  # the opening message or ping (see _send), then the timed one
        dist.recv(torch.zeros(1, device=device) if first and opened else message, peer)
        dist.send(ack, peer, tag=ack_tag)
    count = torch.zeros(1, device=device)
    dist.recv(count, peer)
    for _ in range(int(count.item())):
        dist.recv(message, peer)
    dist.send(ack, peer, tag=ack_tag)
