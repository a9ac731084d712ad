"""Pairwise probes between hosts: a schedule that tests every pair in n-1 rounds, and the
analysis of what the probes measured without knowing the topology.

A round pairs every host with one other (the circle method), so its probes share no host and
can run at once; each pair is probed in both directions. :class:`Probes` holds one measurement
per direction (``src`` sends to ``dst``): bandwidth, where higher is better, or latency.

**Slowness.** Values are compared on a log scale with the median of all probes: a probe's
``z`` is its shortfall divided by the noise, estimated as 1.4826 × the median absolute
deviation (MAD) of the log values. A probe is *slow* when ``z >= z_min`` and it falls short
of the median by at least ``min_drop`` (both must hold, so that neither very quiet nor very
noisy measurements produce spurious slow probes).

**Matrix analysis** (:func:`analyze`). A host is a row (what it sends) and a column (what it
receives). A bad host or NIC slows its whole row and column: its score is the smaller of the
median ``z`` of its row and of its column, and it is a suspect when that median probe is slow.
Slow probes that no suspect host explains are suspect *paths*, judged beyond what every pair
of their round lost at once (the moment's, not a path's: a round's pairs share no host). With
a topology, :mod:`dpro.anomaly.fabric.localize` names NICs, links and switches instead.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from dpro.errors import DproError
from dpro.stats import robust_z

from dpro.anomaly.suspects import Suspect

__all__ = ["Probes", "ProbeError", "analyze", "from_matrix", "read_probes", "round_robin", "to_matrix", "write_probes"]

Z_MIN = 6.0
MIN_DROP = 0.1


class ProbeError(DproError, ValueError):
    """Probe measurements that cannot be read or used; the message is one line."""


def round_robin(n: int) -> np.ndarray:
    """Pairs ``(rounds, n // 2, 2)`` of host indices that meet every pair exactly once.

    The circle method: host ``n-1`` stays put while the others turn, giving ``n - 1`` rounds
    of ``n / 2`` disjoint pairs. For odd ``n`` a dummy host is added and its partner sits the
    round out: ``n`` rounds of ``(n - 1) / 2`` pairs.
    """
    if n < 2:
        raise ProbeError(f"a probe schedule needs at least two hosts, not {n}")
    m = n + n % 2
    r = np.arange(m - 1)[:, None]
    i = np.arange(1, m // 2)[None, :]
    pairs = np.empty((m - 1, m // 2, 2), np.int64)
    pairs[:, 0, 0], pairs[:, 0, 1] = m - 1, r[:, 0]
    pairs[:, 1:, 0], pairs[:, 1:, 1] = (r + i) % (m - 1), (r - i) % (m - 1)
    return pairs if m == n else pairs[:, 1:]  # odd n: the dummy is the fixed host; drop its pairs


@dataclass(frozen=True)
class Probes:
    """Probe measurements: ``src``, ``dst`` (indices into ``hosts``), ``round`` (-1 if
    unknown) and ``value``; ``higher_is_better`` for bandwidth, False for latency.
    ``both_ways``: each pair's two directions ran at once, so a probe's acknowledgements queued
    behind its partner's data, and a component slow on either direction's path may slow both."""

    hosts: list[str]
    src: np.ndarray
    dst: np.ndarray
    round: np.ndarray
    value: np.ndarray
    higher_is_better: bool = True
    both_ways: bool = False

    def __post_init__(self) -> None:
        n = len(self.src)
        if not len(self.dst) == len(self.round) == len(self.value) == n:
            raise ProbeError("src, dst, round and value must have one entry per probe")
        if n and (min(self.src.min(), self.dst.min()) < 0 or max(self.src.max(), self.dst.max()) >= len(self.hosts)):
            raise ProbeError("a probe names a host index outside the host list")
        if n and not (np.isfinite(self.value) & (self.value > 0)).all():
            raise ProbeError("probe values must be positive numbers")

    def take(self, which: np.ndarray) -> Probes:
        """The probes ``which`` selects (a mask or indices), with the same hosts and flags."""
        return replace(self, src=self.src[which], dst=self.dst[which], round=self.round[which],
                       value=self.value[which])

    def medians(self, *repeats: Probes) -> Probes:
        """These probes, each direction's value the median of it and its measurements in
        ``repeats`` (the same probes measured again, in the same order): a probe repeated on the
        same connection takes the same path, so a fault slows every repeat while other tenants'
        traffic slows some."""
        if any(len(r.value) != len(self.value) or (r.src != self.src).any() or (r.dst != self.dst).any()
               for r in repeats):
            raise ProbeError("repeats of a sweep hold the same probes in the same order")
        return replace(self, value=np.median(np.stack([self.value, *(r.value for r in repeats)]), axis=0))

    def at_best(self) -> Probes:
        """One probe per direction, its first, at the better of its measurements: a fault slows
        every measurement, a moment's load some (a path probed again to confirm it,
        :func:`dpro.anomaly.fabric.follow_up.confirm_paths`)."""
        frame = pd.DataFrame({"src": self.src, "dst": self.dst, "value": self.value})
        best = frame.groupby(["src", "dst"], sort=False)["value"].transform("max" if self.higher_is_better else "min")
        first = ~frame.duplicated(["src", "dst"]).to_numpy()
        return replace(self.take(first), value=best.to_numpy()[first])

    def extended(self, more: Probes) -> Probes:
        """These probes and then ``more`` (probes of the same hosts), with these flags."""
        return replace(self, src=np.r_[self.src, more.src], dst=np.r_[self.dst, more.dst],
                       round=np.r_[self.round, more.round], value=np.r_[self.value, more.value])


def from_matrix(matrix: np.ndarray, hosts: list[str] | None = None, higher_is_better: bool = True) -> Probes:
    """Probes from an ``n × n`` matrix (row: sender, column: receiver); NaN cells and the
    diagonal were not measured."""
    matrix = np.asarray(matrix, np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ProbeError(f"a probe matrix is square, not of shape {matrix.shape}")
    n = matrix.shape[0]
    hosts = list(hosts) if hosts is not None else [str(i) for i in range(n)]
    if len(hosts) != n:
        raise ProbeError(f"{len(hosts)} host names for a {n} × {n} matrix")
    src, dst = np.nonzero(~np.isnan(matrix) & ~np.eye(n, dtype=bool))
    return Probes(hosts, src, dst, np.full(len(src), -1, np.int64), matrix[src, dst], higher_is_better)


def to_matrix(probes: Probes) -> np.ndarray:
    """The ``n × n`` matrix of the probes (a direction probed again: the median), NaN where none."""
    n = len(probes.hosts)
    matrix = np.full((n, n), np.nan)
    cells = pd.DataFrame({"src": probes.src, "dst": probes.dst, "value": probes.value}).groupby(["src", "dst"])
    medians = cells["value"].median()
    matrix[medians.index.get_level_values(0), medians.index.get_level_values(1)] = medians.to_numpy()
    return matrix


def read_probes(path: str | os.PathLike) -> Probes:
    """Probes from a file.

    JSON: ``{"hosts": [...], "bandwidth": [[...], ...]}`` (or ``"latency"``), a matrix whose
    ``null`` cells were not measured. CSV: columns ``src``, ``dst`` (host names), ``bandwidth``
    or ``latency``, and optionally ``round`` and ``both_ways`` (true where each pair's two
    directions ran at once; :func:`write_probes` writes them all).
    """
    path = Path(path)
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(path.read_text())
            metric = next((m for m in ("bandwidth", "latency") if m in data), None)
            if metric is None or "hosts" not in data:
                raise ProbeError(f"{path}: expected keys hosts and bandwidth (or latency)")
            matrix = np.array([[np.nan if v is None else v for v in row] for row in data[metric]], np.float64)
            return from_matrix(matrix, [str(h) for h in data["hosts"]], metric == "bandwidth")
        frame = pd.read_csv(path, dtype={"src": str, "dst": str, "both_ways": str}, keep_default_na=False)
    except (OSError, ValueError) as e:
        raise ProbeError(f"cannot read probes {path}: {e}") from None
    metric = next((m for m in ("bandwidth", "latency") if m in frame), None)
    if metric is None or not {"src", "dst"} <= set(frame):
        raise ProbeError(f"{path}: expected columns src, dst and bandwidth (or latency)")
    names = pd.Index(pd.unique(pd.concat([frame["src"], frame["dst"]]).astype(str)))
    try:
        rounds = frame["round"].to_numpy(np.int64) if "round" in frame else np.full(len(frame), -1, np.int64)
        values = frame[metric].to_numpy(np.float64)
    except (TypeError, ValueError) as e:
        raise ProbeError(f"{path}: {metric} and round must be numbers: {e}") from None
    flags = {"true": True, "1": True, "false": False, "0": False}
    both = frame["both_ways"].str.strip().str.lower() if "both_ways" in frame else pd.Series([], dtype=str)
    bad = both[~both.isin(list(flags))]
    if len(bad):
        raise ProbeError(f"{path}: both_ways must be true or false, not {bad.iloc[0]!r}")
    both_ways = bool(len(both)) and bool(both.map(flags).all())
    return Probes(list(names), names.get_indexer(frame["src"].astype(str)), names.get_indexer(frame["dst"].astype(str)),
                  rounds, values, metric == "bandwidth", both_ways)


def write_probes(probes: Probes, path: str | os.PathLike) -> None:
    """Every probe, one CSV row each (``src``, ``dst``, ``round``, ``bandwidth`` or ``latency``,
    ``both_ways``), as :func:`read_probes` reads them back."""
    metric = "bandwidth" if probes.higher_is_better else "latency"
    hosts = np.asarray(probes.hosts, dtype=object)
    pd.DataFrame({"src": hosts[probes.src], "dst": hosts[probes.dst], "round": probes.round, metric: probes.value,
                  "both_ways": probes.both_ways}).to_csv(path, index=False)


def analyze(probes: Probes, z_min: float = Z_MIN, min_drop: float = MIN_DROP, by_round: bool = True) -> list[Suspect]:
    """Suspect hosts (row and column slow) and paths (slow probes no suspect host explains,
    beyond what every pair of their round lost at once; ``by_round=False``: on the probes as
    measured, the rule before, for comparison), most likely first; empty when nothing stands out.
    A direction measured more than once counts once, at its best (:meth:`Probes.at_best`), each
    measurement judged beyond what its own round lost (a path probed again to confirm it; the
    follow-ups' probes of a file analysed without its topology).

    Hosts are peeled one at a time: the baseline is the probes between hosts not yet
    suspected, so that in a small cluster, where one bad host touches a large share of the
    probes (half of them with four hosts), its own probes do not drag the baseline down.
    """
    measured, probes = probes, probes.at_best()
    suspects, bad = [], np.zeros(len(probes.hosts), bool)
    logs = np.log(probes.value) * (1 if probes.higher_is_better else -1)  # higher is better
    while True:
        found = _worst_host(probes, logs, bad)
        if found is None:
            break
        h, score, evidence = found
        if score < z_min or min(evidence["row_drop"], evidence["col_drop"]) < min_drop:
            break
        bad[h] = True
        suspects.append(Suspect("host", probes.hosts[h], score, host=probes.hosts[h], evidence=evidence))
    baseline = ~bad[probes.src] & ~bad[probes.dst]
    if by_round:
        logs = _beyond_rounds(measured, bad)
    z = _z_against(logs, baseline)
    shortfall = np.median(logs[baseline]) - logs if baseline.any() else np.zeros(len(logs))
    unexplained = (z >= z_min) & (shortfall >= -np.log1p(-min_drop)) & baseline
    paths: dict[tuple[int, int], list[float]] = {}
    for s, d, v in zip(probes.src[unexplained], probes.dst[unexplained], z[unexplained]):
        paths.setdefault((min(s, d), max(s, d)), []).append(float(v))
    for (a, b), values in paths.items():
        name = f"{probes.hosts[a]}<->{probes.hosts[b]}"
        suspects.append(Suspect("path", name, float(np.median(values)),
                                evidence={"slow_directions": len(values), "median_z": round(float(np.median(values)), 2)}))
    return sorted(suspects, key=lambda s: -s.score)


def _beyond_rounds(measured: Probes, bad: np.ndarray) -> np.ndarray:
    """Per direction (in :meth:`Probes.at_best`'s order), the best of its measurements' logs
    (higher is better), each after what every pair of its own round lost at once
    (:func:`_rounds_loss`, the probes between hosts not ``bad``): a confirmation taken at its
    best leaves its first round's loss as it was measured, so the other pairs of that round keep it."""
    logs = np.log(measured.value) * (1 if measured.higher_is_better else -1)
    logs = logs + _rounds_loss(measured, logs, ~bad[measured.src] & ~bad[measured.dst])
    frame = pd.DataFrame({"src": measured.src, "dst": measured.dst, "log": logs})
    return frame.groupby(["src", "dst"], sort=False)["log"].max().to_numpy()


def _rounds_loss(probes: Probes, logs: np.ndarray, considered: np.ndarray) -> np.ndarray:
    """Per probe, what every pair of its round lost at once (log scale, 0 for none): the least
    of the pairs' shortfalls below the ``considered`` probes' median, each pair's by its slower
    direction, in rounds of two pairs or more that share no host. Those pairs share no host, so
    a loss they all share is the moment's (other traffic, the probers' own load), not a path's;
    so is one of a component every pair of the round crosses (a switch over them all), which
    the matrix alone cannot name anyway. Probes of no known round (-1) lost nothing."""
    loss = np.zeros(len(logs))
    if not considered.any():
        return loss
    shortfall = np.median(logs[considered]) - logs
    pair = np.minimum(probes.src, probes.dst) * len(probes.hosts) + np.maximum(probes.src, probes.dst)
    for r in np.unique(probes.round[considered & (probes.round >= 0)]):
        in_round = considered & (probes.round == r)
        worst = pd.Series(shortfall[in_round]).groupby(pair[in_round]).max()
        hosts = np.unique(np.r_[probes.src[in_round], probes.dst[in_round]])
        if len(worst) >= 2 and len(hosts) == 2 * len(worst):
            loss[in_round] = max(0.0, float(worst.min()))
    return loss


def _z_against(logs: np.ndarray, baseline: np.ndarray) -> np.ndarray:
    """Each probe's shortfall below the baseline probes' median, in units of their noise."""
    if not baseline.any():
        return np.zeros(len(logs))
    return -robust_z(logs, logs[baseline])


LEAVE_ONE_OUT_HOSTS = 64  # up to this many hosts, each host is judged against the probes it is not in
FEW_PROBES = 8  # fewer baseline probes than this: no noise estimate, a host must be separated from all
MIN_BASELINE_PAIRS = 2  # one pair of hosts is no baseline: its probes (one a direction) measure one link, like the host's


def _worst_host(probes: Probes, logs: np.ndarray, bad: np.ndarray) -> tuple[int, float, dict] | None:
    """The host, not yet suspected, whose row and column fall furthest below the probes among
    unsuspected hosts: (host, score = the smaller of its row's and column's median z, evidence).
    In clusters of up to :data:`LEAVE_ONE_OUT_HOSTS` hosts, each host's baseline leaves its own
    probes out (one host is a large share of them); in larger ones it makes no difference. With
    fewer than :data:`FEW_PROBES` baseline probes (a ring of four hosts), their spread says
    nothing of the noise: the host's probes must all fall below the slowest of them, and the
    score is that gap scaled so that a gap of ``MIN_DROP`` scores ``Z_MIN``. A host whose
    baseline probes join fewer than :data:`MIN_BASELINE_PAIRS` pairs of hosts is not judged."""
    clean = ~bad[probes.src] & ~bad[probes.dst]
    n = len(bad)
    candidates = [h for h in range(n) if not bad[h]]
    best: tuple[int, float, dict] | None = None
    for group in ([[h] for h in candidates] if n <= LEAVE_ONE_OUT_HOSTS else [candidates]):
        baseline = clean & ~np.isin(probes.src, group) & ~np.isin(probes.dst, group) if len(group) == 1 else clean
        if len({(min(s, d), max(s, d)) for s, d in zip(probes.src[baseline], probes.dst[baseline])}) < MIN_BASELINE_PAIRS:
            continue
        z = _z_against(logs, baseline)
        drop = -np.expm1(-(np.median(logs[baseline]) - logs))
        few = baseline.sum() < FEW_PROBES
        for h in group:
            row, col = (probes.src == h) & clean, (probes.dst == h) & clean
            if not row.any() or not col.any():
                continue
            if few:  # too few probes to estimate their noise: the host must fall below all of them
                gap = logs[baseline].min() - max(logs[row].max(), logs[col].max())
                score = float(Z_MIN * gap / -np.log1p(-MIN_DROP))
            else:
                score = float(min(np.median(z[row]), np.median(z[col])))
            if best is None or score > best[1]:
                best = (h, score, {
                    "row_median_z": round(float(np.median(z[row])), 2), "col_median_z": round(float(np.median(z[col])), 2),
                    "row_drop": round(float(np.median(drop[row])), 3), "col_drop": round(float(np.median(drop[col])), 3),
                    "probes": int(row.sum() + col.sum())})
    return best
