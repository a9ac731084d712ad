"""The pairwise host bandwidth matrix over the job's own backend (point-to-point sends).

One rank per host (its lowest) probes, in the rounds of :func:`dpro.anomaly.fabric.schedule.probe_rounds`
(every pair of hosts once; given each host's edge switch and pod, no two probes of a round on one
link, whichever path ECMP picks); a pair measures one way, then the other, while the other pairs
of the round do the same. Given the topology, the pairs whose probes may cross a class the
first sweep left in doubt are probed again (:mod:`dpro.anomaly.fabric.follow_up`).

A direction is measured by sending messages of ``megabytes`` back to back, as many as fill about
``seconds`` (sized from one timed message), and waiting for the receiver's acknowledgement.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import networkx as nx
import numpy as np
import torch
import torch.distributed as dist

from dpro.anomaly.fabric.follow_up import probe_adaptively
from dpro.anomaly.fabric.probes import Probes
from dpro.anomaly.fabric.schedule import probe_rounds
from dpro.anomaly.health.budget import Budget

__all__ = ["leaders", "measure_pairwise"]

MAX_MESSAGES = 512


def leaders(rank_hosts: Sequence[str]) -> list[int]:
    """The lowest rank of each host, in order of first appearance."""
    seen: dict[str, int] = {}
    for rank, host in enumerate(rank_hosts):
        seen.setdefault(host, rank)
    return list(seen.values())


def measure_pairwise(rank_hosts: Sequence[str], megabytes: float, seconds: float, device: torch.device,
                     tiers: Sequence[dict[str, str]] = (), budget: Budget | None = None,
                     topology: nx.MultiGraph | None = None) -> tuple[Probes | None, str | None, int]:
    """The probes (Gb/s, sender to receiver) on every rank, None with a single host; what the
    check's ``budget`` cut (rounds not run once it ran out), if anything; and the pairs probed
    again. Every rank must call it; ``tiers``: host -> edge switch, host -> pod, to keep probes
    of a round apart. With the ``topology``, the first sweep is followed up where it leaves a
    class in doubt (:func:`dpro.anomaly.fabric.follow_up.probe_adaptively`; every rank takes
    the same decisions from the same gathered probes)."""
    heads = leaders(rank_hosts)
    hosts = [rank_hosts[r] for r in heads]
    if len(heads) < 2:
        return None, None, 0
    groups = [[tier.get(h, h) for h in hosts] for tier in tiers]
    elements = max(1, int(megabytes * 2**20) // 4)
    cut: list[str] = []

    def measure(rounds: list[list[tuple[int, int]]], first_round: int) -> Probes:
        rows = _probe_rounds(heads, rounds, first_round, elements, seconds, device, budget, cut)
        return Probes(hosts, rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64), rows[:, 2].astype(np.int64),
                      rows[:, 3])

    first = probe_rounds(len(heads), groups)
    if topology is None:
        return measure(first, 0), (cut or [None])[0], 0
    probes, added = probe_adaptively(measure, topology, groups, first, agree=_rank0s)
    return probes, (cut or [None])[0], added


def _rank0s(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Rank 0's follow-up pairs, on every rank: each rank computes them from the same probes,
    but a last bit of floating point may differ between hosts, and a rank that probed other
    pairs would wait forever for its peers."""
    chosen = [pairs]
    dist.broadcast_object_list(chosen, src=0)
    return chosen[0]


def _probe_rounds(heads: list[int], rounds: list[list[tuple[int, int]]], first_round: int, elements: int,
                  seconds: float, device: torch.device, budget: Budget | None, cut: list[str]) -> np.ndarray:
    """Run ``rounds`` (host indices; the hosts' lowest ranks probe); rows ``(src, dst, round,
    Gb/s)`` on every rank. Once the ``budget`` is spent the rest is not run, and said in ``cut``."""
    me = dist.get_rank()
    found: list[tuple[int, int, int, float]] = []
    for index, pairs in enumerate(rounds):
        if budget is not None and budget.spent(device):
            cut.append(budget.cut(f"{len(rounds) - index} of {len(rounds)} probe rounds not run"))
            break
        for a, b in pairs:
            for src, dst in ((a, b), (b, a)):
                if me == heads[src]:
                    gbps = _send(heads[dst], elements, seconds, device)
                    found.append((src, dst, first_round + index, gbps))
                elif me == heads[dst]:
                    _receive(heads[src], elements, device)
        dist.barrier()
    everyone: list[list[tuple[int, int, int, float]]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(everyone, found)
    return np.array([p for part in everyone for p in part], np.float64).reshape(-1, 4)


def _send(peer: int, elements: int, seconds: float, device: torch.device) -> float:
    message = torch.ones(elements, device=device)
    ack = torch.zeros(1, device=device)
    dist.send(message, peer)  # the first message opens the connection: not timed
    dist.recv(ack, peer)
    start = time.perf_counter()
    dist.send(message, peer)
    dist.recv(ack, peer)
    one = time.perf_counter() - start
    count = int(min(MAX_MESSAGES, max(1, round(seconds / max(one, 1e-6)))))
    dist.send(torch.tensor([float(count)], device=device), peer)
    start = time.perf_counter()
    for _ in range(count):
        dist.send(message, peer)
    dist.recv(ack, peer)
    elapsed = time.perf_counter() - start
    return count * elements * 4 * 8 / elapsed / 1e9


def _receive(peer: int, elements: int, device: torch.device) -> None:
    message = torch.empty(elements, device=device)
    ack = torch.zeros(1, device=device)
    for _ in range(2):
        dist.recv(message, peer)
        dist.send(ack, peer)
    count = torch.zeros(1, device=device)
    dist.recv(count, peer)
    for _ in range(int(count.item())):
        dist.recv(message, peer)
    dist.send(ack, peer)
