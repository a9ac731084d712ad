"""The TCP engine: works on any host pair; a server and a client process of
:mod:`dpro.anomaly.engines.tcp_worker`, each behind its endpoint's command prefix.

Workload mapping: ``connections`` parallel sockets (per direction), ``batch`` messages per send
call, ``queue_depth`` unacknowledged messages per socket, ``sges`` buffers per message
(``sendmsg`` scatter-gather), ``mtu`` as the TCP segment size (MSS = MTU - 40), ``direction=bi``
both ends sending at once. Only SEND, host memory, no RDMA transport. Netdev counters of both
endpoints' interfaces are diffed.
"""

from __future__ import annotations

import json
from typing import Any

from dpro.anomaly.engines.base import Endpoint, Result, Workload, refusal
from dpro.anomaly.engines.latency import LatencyHistogram
from dpro.anomaly.engines.runner import run_pair


class TcpEngine:
    """Traffic over TCP sockets (see the module docstring)."""

    name = "tcp"

    def unavailable_reason(self) -> str | None:
        return None

    def supported_features(self) -> frozenset[str]:
        return frozenset({"opcode:send", "direction:uni", "direction:bi", "placement:host", "connections",
                          "batch", "queue_depth", "sges", "mtu"})

    def run(self, workload: Workload, server_host: Endpoint, client_host: Endpoint,
            duration_s: float = 5.0, timeout_s: float = 10.0) -> Result:
        """Run ``workload`` between the two endpoints (see :meth:`dpro.anomaly.engines.base.Engine.run`)."""
        if refused := refusal(self, workload):
            return refused
        common = ["--size", str(workload.message_size), "--connections", str(workload.connections),
                  "--batch", str(workload.batch), "--queue-depth", str(workload.queue_depth),
                  "--sges", str(workload.sges), "--direction", workload.direction.value,
                  "--duration", str(duration_s), "--io-timeout", str(timeout_s),
                  *(["--mtu", str(workload.mtu)] if workload.mtu else [])]
        worker = ["-m", "dpro.anomaly.engines.tcp_worker"]
        server_argv = [server_host.python, *worker, "server", "--bind", server_host.address, *common]

        def client_argv(ready_line: str) -> list[str]:
            port = json.loads(ready_line)["port"]
            host = f"[{server_host.address}]" if ":" in server_host.address else server_host.address
            return [client_host.python, *worker, "client", "--connect", f"{host}:{port}",
                    "--source", client_host.address, *common]

        outcome = run_pair(server_host, client_host, server_argv, client_argv, _is_ready, _probe_args,
                           run_s=duration_s, timeout_s=timeout_s)
        result = Result(self.name, workload, counters=outcome.counters, errors=outcome.errors, notes=outcome.notes)
        if outcome.errors:
            return result
        reports = [_done(outcome.server_stdout), _done(outcome.client_stdout)]
        if None in reports:
            result.errors.append("a worker ended without its report")
            return result
        rates = [_rates(r["senders"]) for r in reports if r["senders"]]
        result.throughput_gbps = sum(bits for bits, _ in rates) / 1e9
        result.msgs_per_s = sum(msgs for _, msgs in rates)
        latency = LatencyHistogram()
        for s in (s for r in reports for s in r["senders"]):
            latency.merge(LatencyHistogram.from_dict(s["latency"]))
        result.latency_us = latency.percentiles_us()
        return result


def _rates(senders: list[dict[str, Any]]) -> tuple[float, float]:
    """Bits and messages per second of one process's senders, over the span from the first one's
    start to the last one's end: summing each connection's own rate would count a connection that
    finished early as if it had kept its rate for the whole run."""
    span_s = (max(s["end_ns"] for s in senders) - min(s["start_ns"] for s in senders)) / 1e9
    return sum(s["bytes"] for s in senders) * 8 / span_s, sum(s["messages"] for s in senders) / span_s


def _is_ready(line: str) -> bool:
    return line.startswith('{"event": "ready"')


def _probe_args(endpoint: Endpoint) -> list[str]:
    return ["--netdev", endpoint.interface] if endpoint.interface else ["--address", endpoint.address]


def _done(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith('{"event": "done"'):
            return json.loads(line)
    return None
