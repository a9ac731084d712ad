"""The pairwise host bandwidth matrix over the job's own backend (point-to-point sends).

One rank per host (its lowest) probes. Each round pairs hosts off; a pair measures one way, then
the other, while the other pairs of the round do the same. Every pair of hosts meets once.
Given each host's edge switch and pod (from a topology), at most one pair per round leaves any
switch and any pod, so on a leaf-spine fabric or a three-tier fat tree no two probes of a round
share a link, whichever path ECMP picks. That costs rounds where pods are many: a k=4 fat tree
(16 hosts) takes 52 rounds instead of 15, k=6 (54 hosts) 486, k=8 (128 hosts) 1,799 — at the
default 0.4 s a direction, 25 minutes; such a fabric needs a schedule that lets a pod send as
many pairs as it has uplinks, which this one does not yet do.

A direction is measured by sending messages of ``megabytes`` back to back, as many as fill about
``seconds`` (sized from one timed message), and waiting for the receiver's acknowledgement.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist

from dpro.anomaly.fabric.probes import Probes
from dpro.anomaly.health.budget import Budget

__all__ = ["leaders", "measure_pairwise", "probe_rounds"]

MAX_MESSAGES = 512


def leaders(rank_hosts: Sequence[str]) -> list[int]:
    """The lowest rank of each host, in order of first appearance."""
    seen: dict[str, int] = {}
    for rank, host in enumerate(rank_hosts):
        seen.setdefault(host, rank)
    return list(seen.values())


def probe_rounds(n: int, tiers: Sequence[Sequence[str]] = ()) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs of host indices ``0..n-1`` covering every pair once. Each of
    ``tiers`` names every host's group at one tier (its edge switch, its pod): at most one pair
    per round leaves any group of any tier."""
    left = [(a, b) for a in range(n) for b in range(a + 1, n)]
    # In the circle method's order ((a + b) mod n), n - 1 rounds suffice without groups.
    left.sort(key=lambda p: ((p[0] + p[1]) % n, p))
    exits = {(a, b): {(t, g[h]) for t, g in enumerate(tiers) if g[a] != g[b] for h in (a, b)} for a, b in left}
    rounds = []
    while left:
        busy_hosts: set[int] = set()
        leaving: set[tuple[int, str]] = set()  # (tier, group)
        chosen = []
        for a, b in left:
            if a in busy_hosts or b in busy_hosts or exits[a, b] & leaving:
                continue
            chosen.append((a, b))
            busy_hosts |= {a, b}
            leaving |= exits[a, b]
        rounds.append(chosen)
        taken = set(chosen)
        left = [p for p in left if p not in taken]
    return rounds


def measure_pairwise(rank_hosts: Sequence[str], megabytes: float, seconds: float, device: torch.device,
                     tiers: Sequence[dict[str, str]] = (), budget: Budget | None = None
                     ) -> tuple[Probes | None, str | None]:
    """The probes (Gb/s, sender to receiver) on every rank, None with a single host, and what
    the check's ``budget`` cut (rounds not run once it ran out), if anything. Every rank must
    call it; ``tiers``: host -> edge switch, host -> pod, to keep probes of a round apart."""
    heads = leaders(rank_hosts)
    hosts = [rank_hosts[r] for r in heads]
    if len(heads) < 2:
        return None, None
    me = dist.get_rank()
    rounds = probe_rounds(len(heads), [[tier.get(h, h) for h in hosts] for tier in tiers])
    elements = max(1, int(megabytes * 2**20) // 4)
    found: list[tuple[int, int, int, float]] = []
    cut = None
    for index, pairs in enumerate(rounds):
        if budget is not None and budget.spent(device):
            cut = budget.cut(f"{len(rounds) - index} of {len(rounds)} probe rounds not run")
            break
        for a, b in pairs:
            for src, dst in ((a, b), (b, a)):
                if me == heads[src]:
                    gbps = _send(heads[dst], elements, seconds, device)
                    found.append((src, dst, index, gbps))
                elif me == heads[dst]:
                    _receive(heads[src], elements, device)
        dist.barrier()
    everyone: list[list[tuple[int, int, int, float]]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(everyone, found)
    rows = np.array([p for part in everyone for p in part], np.float64).reshape(-1, 4)
    return Probes(hosts, rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64), rows[:, 2].astype(np.int64),
                  rows[:, 3]), cut


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
