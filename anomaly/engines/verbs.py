"""The verbs engine: RC/UC/UD SEND, WRITE and READ through pyverbs
(:mod:`dpro.anomaly.engines.verbs_worker` on each endpoint).

pyverbs is optional (``pip install 'dpro[rdma]'`` or the distribution's ``python3-pyverbs``) and
imported only when the engine is asked whether it can run or runs. Both endpoints need an
``rdma_device``. Workload mapping: ``connections`` QPs, ``batch`` work requests posted between two
CQ polls, ``queue_depth`` in flight per QP, ``sges`` per work request, ``mtu`` the path MTU (RC/UC);
one direction, host memory. Availability is judged on this host; a remote endpoint's
``python`` must have pyverbs too.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

from dpro.anomaly.engines.base import Endpoint, Opcode, Result, Workload, refusal
from dpro.anomaly.engines.latency import LatencyHistogram
from dpro.anomaly.engines.runner import run_pair


class VerbsEngine:
    """RDMA traffic through pyverbs (see the module docstring)."""

    name = "verbs"

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("pyverbs") is None:
            return "pyverbs is not installed (pip install 'dpro[rdma]', or the python3-pyverbs package)"
        try:
            import pyverbs.device

            devices = pyverbs.device.get_device_list()
        except Exception as e:  # pyverbs raises when the verbs library finds no device at all
            return f"no RDMA device ({type(e).__name__}: {e})"
        return None if devices else "no RDMA device"

    def supported_features(self) -> frozenset[str]:
        return frozenset({"opcode:send", "opcode:write", "opcode:read", "direction:uni", "placement:host",
                          "connections", "batch", "queue_depth", "sges", "mtu",
                          "transport:rc", "transport:uc", "transport:ud"})

    def run(self, workload: Workload, server_host: Endpoint, client_host: Endpoint,
            duration_s: float = 5.0, timeout_s: float = 10.0) -> Result:
        """Run ``workload`` between the two endpoints (see :meth:`dpro.anomaly.engines.base.Engine.run`)."""
        if refused := refusal(self, workload):
            return refused
        transport = workload.transport or "rc"
        if invalid := _invalid(workload, transport, server_host, client_host):
            return Result(self.name, workload, errors=[f"verbs engine: {invalid}"])

        def argv(endpoint: Endpoint, role: str) -> list[str]:
            return [endpoint.python, "-m", "dpro.anomaly.engines.verbs_worker", role,
                    "--address", endpoint.address, "--device", str(endpoint.rdma_device),
                    "--ib-port", str(endpoint.rdma_port),
                    *(["--gid-index", str(endpoint.gid_index)] if endpoint.gid_index is not None else []),
                    "--transport", transport, "--opcode", workload.opcode.value,
                    "--size", str(workload.message_size), "--connections", str(workload.connections),
                    "--batch", str(workload.batch), "--queue-depth", str(workload.queue_depth),
                    "--sges", str(workload.sges), *(["--mtu", str(workload.mtu)] if workload.mtu else []),
                    "--duration", str(duration_s), "--io-timeout", str(timeout_s)]

        def client_argv(ready_line: str) -> list[str]:
            return [*argv(client_host, "client"), "--connect",
                    f"{server_host.address}:{json.loads(ready_line)['port']}"]

        outcome = run_pair(server_host, client_host, [*argv(server_host, "server"), "--bind", server_host.address],
                           client_argv, lambda line: line.startswith('{"event": "ready"'), _probe_args,
                           run_s=duration_s, timeout_s=timeout_s)
        result = Result(self.name, workload, counters=outcome.counters, errors=outcome.errors, notes=outcome.notes)
        if outcome.errors:
            return result
        report = _done(outcome.client_stdout)
        if report is None:
            result.errors.append("the client ended without its report")
            return result
        result.throughput_gbps = report["bytes"] * 8 / report["elapsed_s"] / 1e9
        result.msgs_per_s = report["messages"] / report["elapsed_s"]
        result.latency_us = LatencyHistogram.from_dict(report["latency"]).percentiles_us()
        if workload.opcode == Opcode.SEND and report["server_received"] != report["messages"]:
            result.notes.append(f"the server received {report['server_received']} of {report['messages']} "
                                f"messages ({transport.upper()} does not retransmit)")
        return result


def _invalid(workload: Workload, transport: str, *endpoints: Endpoint) -> str | None:
    if any(e.rdma_device is None for e in endpoints):
        return "both endpoints need an rdma_device"
    if transport == "ud" and workload.opcode != Opcode.SEND:
        return "UD queue pairs only SEND"
    if transport == "uc" and workload.opcode == Opcode.READ:
        return "RDMA READ needs an RC queue pair"
    return None


def _probe_args(endpoint: Endpoint) -> list[str]:
    return ["--rdma", str(endpoint.rdma_device),
            *(["--netdev", endpoint.interface] if endpoint.interface else ["--address", endpoint.address])]


def _done(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith('{"event": "done"'):
            return json.loads(line)
    return None
