"""Network tomography: the fewest NICs, links and switches that explain the slow probes.

Every probe crosses components: the NICs at both ends (with their access links, which no probe
can tell apart from the NIC), the switch-to-switch links and the switches on its path (see
:mod:`dpro.anomaly.fabric.routing`). A faulty component makes the probes through it slow; a component
that many good probes cross is unlikely to be at fault.

**Greedy weighted set cover.** Each step picks, among the components that stand out, the one
with the lowest cost per slow probe it explains, cost being ``1 +`` the number of good probes
through it; the slow probes it explains are removed and the step repeats. A component *stands
out* when at least ``min_slow`` unexplained slow probes cross it and their share of its probes
is too high for the slow rate ``p0`` of the rest of the fabric: its log-likelihood ratio
``LLR = n · KL(slow share ‖ p0)`` exceeds ``log(components / alpha)`` (a Chernoff bound on the
binomial tail, Bonferroni-corrected). Its score is ``sqrt(2 · LLR)``, a z-score.

A flapping component is slow in some rounds only: its ``confidence`` is the share of its
probes that were slow in the rounds where it had a slow probe (1 for a component that was
consistently slow then; near 0 for one that merely shares paths with a faulty one), and the
evidence gives the slow rounds among those it carried probes in.

Probes are routed in chunks and only slow ones are kept, so memory stays bounded whatever
their number; 4,096 hosts and a million probes take a few seconds.
"""

from __future__ import annotations

import math

import networkx as nx
import numpy as np

from dpro.anomaly.fabric.probes import ProbeError, Probes, slow
from dpro.anomaly.fabric.multipath import localize_multipath
from dpro.anomaly.fabric.routing import Routing, component_chunks
from dpro.anomaly.suspects import Suspect

__all__ = ["localize"]

ALPHA = 1e-3
MIN_SLOW = 3


def localize(topology: nx.MultiGraph, probes: Probes, slow_mask: np.ndarray | None = None,
             routing: Routing | None = None, alpha: float = ALPHA, min_slow: int = MIN_SLOW,
             ecmp: str = "hash") -> list[Suspect]:
    """Suspect NICs, links and switches, most likely first; empty when no slow probe stands out.

    ``slow_mask`` defaults to :func:`dpro.anomaly.fabric.probes.slow`; ``routing`` to
    ``Routing.build(topology)`` (pass it to reuse it). ``ecmp="hash"``: each probe took the path
    the routing's hash gives (static routing, pinned paths); ``ecmp="all"``: any of its
    equal-cost paths, unknown (:mod:`dpro.anomaly.fabric.multipath`).
    """
    if ecmp not in ("hash", "all"):
        raise ValueError(f"ecmp is 'hash' or 'all', not {ecmp!r}")
    routing = routing or Routing.build(topology)
    index = {h: i for i, h in enumerate(routing.hosts)}
    missing = [h for h in probes.hosts if h not in index]
    if missing:
        raise ProbeError(f"probed host {missing[0]!r} is not in the topology")
    to_topology = np.array([index[h] for h in probes.hosts], np.int64)
    src, dst = to_topology[probes.src], to_topology[probes.dst]
    is_slow = slow(probes) if slow_mask is None else np.asarray(slow_mask, bool)
    if ecmp == "all":
        return localize_multipath(topology, routing, src, dst, probes.round, is_slow, alpha, min_slow)
    n_comp = len(routing.hosts) + len(routing.links) + len(routing.switches)
    total = np.zeros(n_comp, np.int64)
    slow_parts = []
    for part, comp in component_chunks(routing, src, dst):
        total += np.bincount(comp[comp >= 0], minlength=n_comp)
        slow_parts.append(comp[is_slow[part]])
    slow_comp = np.concatenate(slow_parts) if slow_parts else np.zeros((0, 1), np.int32)
    good = total - np.bincount(slow_comp[slow_comp >= 0], minlength=n_comp)
    picks = _cover(slow_comp, good, int((~is_slow).sum()), alpha, min_slow)
    if not picks:
        return []
    rounds = _round_evidence(routing, src, dst, probes.round, is_slow, [c for c, *_ in picks])
    return [_suspect(topology, routing, c, explained, llr, rounds[c]) for c, explained, llr in picks]


def _cover(slow_comp: np.ndarray, good: np.ndarray, n_good: int, alpha: float,
           min_slow: int) -> list[tuple[int, int, float]]:
    """Greedy weighted set cover of the slow probes: (component, slow probes explained, LLR)."""
    n_comp = len(good)
    threshold = math.log(n_comp / alpha)
    remaining = np.ones(len(slow_comp), bool)
    picks = []
    while remaining.any():
        rows = slow_comp[remaining]
        covered = np.bincount(rows[rows >= 0], minlength=n_comp)
        p0 = remaining.sum() / (remaining.sum() + max(n_good, 1))
        n = covered + good
        share = np.divide(covered, n, out=np.zeros(n_comp), where=n > 0)
        llr = n * _kl(share, p0)
        stands_out = (covered >= min_slow) & (share > p0) & (llr >= threshold)
        if not stands_out.any():
            break
        cost = np.where(stands_out, (good + 1) / np.maximum(covered, 1), np.inf)
        best = int(np.lexsort((-covered, cost))[0])  # cheapest, then the one explaining most
        picks.append((best, int(covered[best]), float(llr[best])))
        remaining[np.flatnonzero(remaining)[(rows == best).any(axis=1)]] = False
    return picks


def _kl(share: np.ndarray, p0: float) -> np.ndarray:
    """Kullback-Leibler divergence of Bernoulli(share) from Bernoulli(p0), elementwise."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(share > 0, share * np.log(share / p0), 0.0)
        b = np.where(share < 1, (1 - share) * np.log((1 - share) / (1 - p0)), 0.0)
    return a + b


def _round_evidence(routing: Routing, src: np.ndarray, dst: np.ndarray, rounds: np.ndarray, is_slow: np.ndarray,
                    picked: list[int]) -> dict[int, dict[str, float]]:
    """For each picked component: its probes and slow probes in the rounds where it had a slow
    probe, and how many rounds it carried probes in and was slow in."""
    seen: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {c: [] for c in picked}
    for part, comp in component_chunks(routing, src, dst):
        for c in picked:
            through = (comp == c).any(axis=1)
            seen[c].append((rounds[part][through], is_slow[part][through]))
    out = {}
    for c, parts in seen.items():
        r, s = (np.concatenate(x) for x in zip(*parts))
        slow_rounds = np.unique(r[s])
        in_slow_rounds = np.isin(r, slow_rounds)
        out[c] = {"confidence": float(s.sum() / max(in_slow_rounds.sum(), 1)),
                  "slow_rounds": int(len(slow_rounds)), "rounds": int(len(np.unique(r)))}
    return out


def _suspect(topology: nx.MultiGraph, routing: Routing, c: int, explained: int, llr: float,
             rounds: dict[str, float]) -> Suspect:
    n_hosts, n_links = len(routing.hosts), len(routing.links)
    evidence = {"slow_probes_explained": explained, "confidence": round(rounds["confidence"], 3),
                "slow_rounds": rounds["slow_rounds"], "rounds": rounds["rounds"]}
    score = math.sqrt(2 * llr)
    if c < n_hosts:
        access = [routing.links[i] for i in routing.host_links[c]]
        return Suspect("nic", routing.nics[c], score, host=routing.hosts[c], evidence={**evidence, "same_as": access})
    if c < n_hosts + n_links:
        name = routing.links[c - n_hosts]
        u, v = next((u, v) for u, v, n in topology.edges(data="name") if n == name)
        return Suspect("link", name, score, evidence={**evidence, "ends": [u, v]})
    return Suspect("switch", routing.switches[c - n_hosts - n_links], score, evidence=evidence)
