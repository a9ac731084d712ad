"""What each node's own collectors saw during the job: fault counters that moved, GPUs that
throttled, hosts whose hypervisor took their CPUs.

``dpro record`` snapshots every host counter at the start and the end of the job
(``counters-start.json``, ``counters-end.json``: :class:`dpro.collectors.counters.Snapshot`)
and samples every GPU through NVML (``gpu-samples.csv``). A counter that counts faults
(:data:`dpro.collectors.counters.catalog.FAULT_COUNTERS`: errors, drops, link losses, retries,
uncorrected ECC) and went up during the job makes its device a suspect; so does a GPU that
spent at least half of its samples slowed by a hardware slowdown, a thermal limit or a power
brake; so does a host whose hypervisor took (*steal* time, :mod:`dpro.collectors.counters.procstat`)
at least 10 percentage points more of the CPU time its CPUs wanted than the run's other hosts
(their median; on a run of one host, 10%; :mod:`dpro.anomaly.steal`): hosts that share one
machine, or a cluster contended all over, slow no host more than the others.

Scores are on the scale of the other analyses, where 4 is where something stands out: a
faulty counter scores ``4 + log10(increase)``, a throttled GPU ``4 ×`` the share of its
samples it spent throttled (so 2 to 4), a host's stolen CPU ``4 + log10(excess / 0.1)`` (4 at
:data:`dpro.anomaly.steal.STEAL_SHARE`, 5 where the hypervisor took all of it).

    >>> counter_faults(run), throttled_gpus(gpu_samples(run)), stolen_cpu(run)   # doctest: +SKIP
"""

from __future__ import annotations

import math

import pandas as pd

from dpro.anomaly.steal import STEAL_SHARE, stolen_hosts
from dpro.anomaly.suspects import Suspect
from dpro.collectors.counters import Snapshot, diff
from dpro.collectors.counters.catalog import FAULT_COUNTERS
from dpro.collectors.counters.procstat import steal_share
from dpro.run_format import Run

__all__ = ["SLOWDOWN_REASONS", "counter_faults", "gpu_samples", "steal_shares", "stolen_cpu",
           "throttled_gpus"]

Z_MIN = 4.0
MIN_THROTTLED_SHARE = 0.5
SLOWDOWN_REASONS = {0x8: "hardware slowdown", 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
                    0x80: "hardware power brake"}
"""NVML's clock throttle reasons that mean the GPU is held back (``nvmlClocksThrottleReason*``;
an idle GPU, application clocks and the software power cap are not faults)."""


def counter_faults(run: Run) -> list[Suspect]:
    """A suspect per device (NIC, interface, GPU) whose fault counters went up during the job."""
    out = []
    for host, start, end in run.counter_snapshots():
        moved: dict[tuple[str, str], dict[str, int]] = {}
        for rate in diff(Snapshot.from_dict(start), Snapshot.from_dict(end)).rates:
            if rate.canonical in FAULT_COUNTERS and rate.delta:
                moved.setdefault((rate.source, rate.device), {})[rate.canonical] = int(rate.delta)
        for (source, device), counts in moved.items():
            kind = "gpu" if source == "gpu" else "nic"
            out.append(Suspect(kind, f"{host}/{device}", Z_MIN + math.log10(max(counts.values())), host=host,
                               evidence={"cause": "fault counters went up during the job", "counters": counts}))
    return sorted(out, key=lambda s: -s.score)


def gpu_samples(run: Run) -> pd.DataFrame:
    """Every node's GPU samples (``gpu-samples.csv``) with a ``host`` column; empty when none."""
    frames = [frame.assign(host=host) for host, frame in run.gpu_samples()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def throttled_gpus(samples: pd.DataFrame) -> list[Suspect]:
    """A suspect per GPU held back by a slowdown reason in at least half of its samples."""
    if samples.empty or "throttle_reasons" not in samples:
        return []
    reasons = pd.to_numeric(samples["throttle_reasons"], errors="coerce").fillna(0).astype("int64")
    out = []
    for (host, gpu), rows in samples.assign(reasons=reasons).groupby(["host", "gpu"]):
        held = {name: float(((rows["reasons"] & bit) != 0).mean()) for bit, name in SLOWDOWN_REASONS.items()}
        share = float(((rows["reasons"] & sum(SLOWDOWN_REASONS)) != 0).mean())
        if share >= MIN_THROTTLED_SHARE:
            evidence = {"cause": "the GPU's clocks were held back", "share_of_samples": round(share, 3),
                        "reasons": {k: round(v, 3) for k, v in held.items() if v > 0}, "samples": len(rows)}
            if "sm_clock_mhz" in rows:
                evidence["median_sm_clock_mhz"] = float(pd.to_numeric(rows["sm_clock_mhz"], errors="coerce").median())
            out.append(Suspect("gpu", f"{host}/gpu{int(gpu)}", Z_MIN * share, host=str(host), evidence=evidence))
    return sorted(out, key=lambda s: -s.score)


def steal_shares(run: Run) -> dict[str, float]:
    """Each node's share of the CPU time its CPUs wanted during the job that the hypervisor took,
    by host; nodes without CPU time (run format 1.4 and older) left out."""
    shares = {}
    for host, start, end in run.counter_snapshots():
        if (share := steal_share(start.get("cpu_times", {}), end.get("cpu_times", {}))) is not None:
            shares[host] = share
    return shares


def stolen_cpu(run: Run) -> list[Suspect]:
    """A host suspect per node whose stolen CPU stands out from the run's other nodes'
    (:func:`dpro.anomaly.steal.stolen_hosts`)."""
    shares = steal_shares(run)
    out = []
    for host, usual in stolen_hosts(shares).items():
        share = shares[host]
        evidence = {"cause": "the hypervisor ran other work on the host's CPUs (steal time)",
                    "steal_share": round(share, 3)}
        if len(shares) > 1:
            evidence["other_hosts_steal_share"] = round(usual, 3)
        out.append(Suspect("host", host, Z_MIN + math.log10((share - usual) / STEAL_SHARE), host=host,
                           evidence=evidence))
    return sorted(out, key=lambda s: -s.score)
