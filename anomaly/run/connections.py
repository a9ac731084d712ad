"""The job's own traffic as a host-to-host bandwidth matrix, from the TCP connection samples
``dpro record`` takes on every node (``nodes/<node>/connections.csv``, see
:mod:`dpro.collectors.connections`).

A connection's rate is the bytes it had acknowledged over the time it was busy sending, between
its first and last sample: what the network gave it while it had data to send, whatever the
job's own pauses. Connections within a host (loopback) say nothing of the network and are left
out. The matrix (sender host × receiver host: the median rate of their connections) is judged
like a matrix of probes (:func:`dpro.anomaly.fabric.probes.analyze`): a host whose sends and receives
are all slow is a suspect, passively, with no traffic of dpro's own.

    >>> connection_suspects(open_run("run1"))                  # doctest: +SKIP
"""

from __future__ import annotations

from ipaddress import ip_address

import numpy as np
import pandas as pd

from dpro.run_format import CONNECTIONS_FILE, Run

from dpro.anomaly.fabric.probes import Probes, analyze, from_matrix
from dpro.anomaly.suspects import Suspect

MIN_BYTES = 1 << 20  # a connection that moved less says nothing of its link
HEAVY_SHARE = 0.1  # nor one that moved less than this share of the busiest: its rate is its latency


def _ip(endpoint: str) -> str:
    """``10.0.0.2:5000`` / ``[::ffff:10.0.0.2]:5000`` → ``10.0.0.2``."""
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    address = ip_address(host.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def connection_rates(run: Run) -> pd.DataFrame:
    """One row per connection of the job that moved at least :data:`MIN_BYTES` and
    :data:`HEAVY_SHARE` of the busiest connection's bytes (the collectives' traffic): ``host``
    (the recording node's), ``local_ip``, ``peer_ip``, ``bytes``, ``busy_ms``, ``rate_bps``
    (bits per second while busy), ``rtt_ms`` (median), ``retrans`` (during the job)."""
    frames = []
    for host, (path,) in run.node_files(CONNECTIONS_FILE):
        samples = pd.read_csv(path)
        if samples.empty:
            continue
        samples = samples.sort_values("time_ns")
        per = samples.groupby(["pid", "local", "peer"])
        frame = pd.DataFrame({
            "bytes": per["bytes_acked"].max() - per["bytes_acked"].min(),
            "busy_ms": per["busy_ms"].max() - per["busy_ms"].min(),
            "rtt_ms": per["rtt_ms"].median(),
            "retrans": per["retrans_total"].max().fillna(0) - per["retrans_total"].min().fillna(0),
        }).reset_index()
        frame["host"] = host
        frames.append(frame)
    columns = ["host", "local_ip", "peer_ip", "bytes", "busy_ms", "rate_bps", "rtt_ms", "retrans"]
    if not frames:
        return pd.DataFrame(columns=columns)
    rates = pd.concat(frames, ignore_index=True)
    heavy = max(MIN_BYTES, HEAVY_SHARE * rates["bytes"].max())
    rates = rates[(rates["bytes"] >= heavy) & (rates["busy_ms"] > 0)].copy()
    rates["local_ip"] = rates["local"].map(_ip)
    rates["peer_ip"] = rates["peer"].map(_ip)
    rates["rate_bps"] = 8 * rates["bytes"] / (rates["busy_ms"] / 1e3)
    return rates[columns].reset_index(drop=True)


def connection_matrix(rates: pd.DataFrame) -> Probes | None:
    """Hosts × hosts median sending rate of the connections between them (a peer's host is
    the node that recorded that address as its own); None with fewer than three hosts."""
    if rates.empty:
        return None
    owner = dict(zip(rates["local_ip"], rates["host"]))
    network = rates[~rates["local_ip"].map(lambda a: ip_address(a).is_loopback).astype(bool)]
    network = network.assign(peer_host=network["peer_ip"].map(owner)).dropna(subset=["peer_host"])
    network = network[network["peer_host"] != network["host"]]
    hosts = sorted(set(network["host"]) | set(network["peer_host"]))
    if len(hosts) < 3:
        return None
    median = network.groupby(["host", "peer_host"])["rate_bps"].median()
    index = {h: i for i, h in enumerate(hosts)}
    matrix = np.full((len(hosts), len(hosts)), np.nan)
    for (src, dst), rate in median.items():
        matrix[index[src], index[dst]] = rate
    return from_matrix(matrix, hosts)


def connection_suspects(run: Run) -> list[Suspect]:
    """Hosts (and host pairs) whose share of the job's own traffic went slow; empty when the
    run has no connection samples, fewer than three hosts, or nothing stands out."""
    matrix = connection_matrix(connection_rates(run))
    if matrix is None:
        return []
    return [Suspect(s.kind, s.name, s.score, s.rank, s.host, {"source": "the job's TCP connections", **s.evidence})
            for s in analyze(matrix)]
