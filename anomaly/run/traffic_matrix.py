"""The job's own traffic as a host-to-host bandwidth matrix, from the TCP connection samples
``dpro record`` takes on every node (``nodes/<node>/connections.csv``, see
:mod:`dpro.collectors.connections`).

A connection's rate is what the network gave it while it moved bulk data: between two samples
(500 ms apart), the bytes it had acknowledged over the time the network held it back, which is
the kernel's ``busy`` time (data to send) less the time the receiver's window (a receiver too busy
to read) or the sender's own buffer limited it; the connection's rate is the median over the
intervals that moved at least :data:`BULK_BYTES` or were held back by the network for most of
their time (a link too slow to move that much in one). Over a whole job, small messages and hosts whose
CPUs are too loaded to process acknowledgements at once pull a connection's average down to its
latency (a healthy link measured 75 Mb/s where its bulk intervals ran at 170 Mb/s and more); a
throttled link stays at its rate in every interval. Connections within a host (loopback) say nothing of the network and are left
out. The matrix (sender host × receiver host: the median rate of their connections) is judged
like a matrix of probes (:func:`dpro.anomaly.fabric.probes.analyze`): a host whose sends and receives
are all slow is a suspect, passively: dpro's own streams of the calibration are left out.

    >>> connection_suspects(open_run("run1"))                  # doctest: +SKIP
"""

from __future__ import annotations

from ipaddress import ip_address

import numpy as np
import pandas as pd

from dpro.run_format import Run
from dpro.run_records import RankMeta

from dpro.anomaly.fabric.probes import Probes, analyze, from_matrix
from dpro.anomaly.suspects import Suspect

MIN_BYTES = 1 << 20  # a connection that moved less says nothing of its link
HEAVY_SHARE = 0.1  # nor one that moved less than this share of the busiest: its rate is its latency
BULK_BYTES = 256 << 10  # nor does an interval between two samples that moved less ...
BUSY_SHARE = 0.5  # ... unless the network held the connection back for this share of it


def _ip(endpoint: str) -> str:
    """``10.0.0.2:5000`` / ``[::ffff:10.0.0.2]:5000`` → ``10.0.0.2``."""
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    address = ip_address(host.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def connection_rates(run: Run) -> pd.DataFrame:
    """One row per connection of the job that moved at least :data:`MIN_BYTES` and
    :data:`HEAVY_SHARE` of the busiest connection's bytes (the collectives' traffic) and had a
    bulk interval: ``host`` (the recording node's), ``local_ip``, ``peer_ip``, ``bytes``,
    ``busy_ms``, ``limited_ms`` (of it, held back by the receiver's window or the send buffer),
    ``intervals`` (bulk ones), ``rate_bps`` (their median rate), ``rtt_ms`` (median), ``retrans``
    (during the job)."""
    frames = [_per_connection(samples).assign(host=host) for host, samples in run.connection_samples()]
    columns = ["host", "local_ip", "peer_ip", "bytes", "busy_ms", "limited_ms", "intervals", "rate_bps", "rtt_ms",
               "retrans"]
    if not frames:
        return pd.DataFrame(columns=columns)
    rates = pd.concat(frames, ignore_index=True)
    rates = _without_link_streams(rates.assign(local_ip=rates["local"].map(_ip), peer_ip=rates["peer"].map(_ip)), run)
    if rates.empty:
        return pd.DataFrame(columns=columns)
    heavy = max(MIN_BYTES, HEAVY_SHARE * rates["bytes"].max())
    rates = rates[(rates["bytes"] >= heavy) & (rates["intervals"] > 0)]
    return rates[columns].reset_index(drop=True)


def _without_link_streams(rates: pd.DataFrame, run: Run) -> pd.DataFrame:
    """``rates`` less dpro's own streams of the calibration (:mod:`dpro.collectors.link_rate`):
    the connections to or from a port a rank listened on for them, on that rank's host."""
    listening = {((run.metas[r] or RankMeta()).host, link.listen_port)
                 for r in run.ranks for link in run.calibration(r).links if link.listen_port is not None}
    if not listening:
        return rates
    owner = dict(zip(rates["local_ip"], rates["host"]))
    local = [(h, _port(e)) in listening for h, e in zip(rates["host"], rates["local"])]
    peer = [(owner.get(ip, ""), _port(e)) in listening for ip, e in zip(rates["peer_ip"], rates["peer"])]
    return rates[~(np.array(local, bool) | np.array(peer, bool))]


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def _per_connection(samples: pd.DataFrame) -> pd.DataFrame:
    """One node's samples → one row per connection (``pid``, ``local``, ``peer`` and the
    figures of :func:`connection_rates`)."""
    samples = samples.sort_values("time_ns")
    limited = samples["rwnd_limited_ms"] + samples["sndbuf_limited_ms"]
    samples = samples.assign(limited_ms=limited, network_ms=samples["busy_ms"] - limited)
    keys = ["pid", "local", "peer"]
    per = samples.groupby(keys)
    moved = per["bytes_acked"].diff()
    # ss prints busy time in whole milliseconds: round each interval up, so that a short burst
    # on a fast link is not taken for an infinite rate
    seconds = (per["network_ms"].diff().clip(lower=0) + 1) / 1e3
    # bulk: enough bytes, or the network held the connection back for most of the interval (a
    # link too slow to move BULK_BYTES between two samples)
    held = seconds >= BUSY_SHARE * per["time_ns"].diff() / 1e9
    bulk = samples.assign(rate_bps=8 * moved / seconds)[(moved >= BULK_BYTES) | (held & (moved > 0))]
    bulk = bulk.groupby(keys)["rate_bps"]
    frame = pd.DataFrame({
        "bytes": per["bytes_acked"].max() - per["bytes_acked"].min(),
        "busy_ms": per["busy_ms"].max() - per["busy_ms"].min(),
        "limited_ms": per["limited_ms"].max() - per["limited_ms"].min(),
        "intervals": bulk.size(),
        "rate_bps": bulk.median(),
        "rtt_ms": per["rtt_ms"].median(),
        "retrans": per["retrans_total"].max().fillna(0) - per["retrans_total"].min().fillna(0),
    })
    return frame.fillna({"intervals": 0}).astype({"intervals": np.int64}).reset_index()


def host_rates(rates: pd.DataFrame) -> tuple[list[str], np.ndarray]:
    """Hosts and their hosts × hosts median sending rate (bit/s) of the connections between
    them (a peer's host is the node that recorded that address as its own; NaN: none)."""
    if rates.empty:
        return [], np.empty((0, 0))
    owner = dict(zip(rates["local_ip"], rates["host"]))
    network = rates[~rates["local_ip"].map(lambda a: ip_address(a).is_loopback).astype(bool)]
    network = network.assign(peer_host=network["peer_ip"].map(owner)).dropna(subset=["peer_host"])
    network = network[network["peer_host"] != network["host"]]
    hosts = sorted(set(network["host"]) | set(network["peer_host"]))
    median = network.groupby(["host", "peer_host"])["rate_bps"].median()
    index = {h: i for i, h in enumerate(hosts)}
    matrix = np.full((len(hosts), len(hosts)), np.nan)
    for (src, dst), rate in median.items():
        matrix[index[src], index[dst]] = rate
    return hosts, matrix


def connection_matrix(rates: pd.DataFrame) -> Probes | None:
    """:func:`host_rates` as probes; None with fewer than three hosts."""
    hosts, matrix = host_rates(rates)
    return from_matrix(matrix, hosts) if len(hosts) >= 3 else None


def connection_suspects(run: Run) -> list[Suspect]:
    """Hosts (and host pairs) whose share of the job's own traffic went slow; empty when the
    run has no connection samples, fewer than three hosts, or nothing stands out."""
    matrix = connection_matrix(connection_rates(run))
    if matrix is None:
        return []
    return [Suspect(s.kind, s.name, s.score, s.rank, s.host, {"source": "the job's TCP connections", **s.evidence})
            for s in analyze(matrix)]
