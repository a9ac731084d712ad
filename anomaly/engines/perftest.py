"""The perftest engine: ``ib_send_bw`` / ``ib_write_bw`` / ``ib_read_bw`` as server and client.

Workload mapping: opcode picks the tool, ``connections`` is ``-q`` (QPs), ``transport`` ``-c``
(RC or UC), ``mtu`` ``-m``, ``queue_depth`` ``-t`` (TX depth), ``batch`` ``-l`` (post list),
``direction=bi`` ``-b``, ``cuda:<i>`` ``--use_cuda=<i>`` when the tools were built with CUDA.
One SGE per message. The run lasts ``-D`` seconds; RDMA port counters (and the interface's netdev
counters) of both endpoints are diffed. Bandwidth tests measure no latency.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field

from dpro.anomaly.engines.base import Endpoint, Opcode, Result, Workload, refusal
from dpro.anomaly.engines.runner import run_pair

TOOLS = {Opcode.SEND: "ib_send_bw", Opcode.WRITE: "ib_write_bw", Opcode.READ: "ib_read_bw"}
READY_MARK = "Waiting for client to connect"
_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(Gb/sec|MB/sec)\]\s+BW average\[(?:Gb/sec|MB/sec)\]"
                     r"(\s+MsgRate\[Mpps\])?")
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)(?:\s+([\d.]+))?\s*$")
_SETTING = re.compile(r"([A-Za-z][\w .*-]*?)\s*:\s*(\S+)")
_SETTINGS = {"Device": "device", "Number of qps": "qps", "Transport type": "transport", "Connection type": "connection",
             "TX depth": "tx_depth", "Mtu": "mtu", "Link type": "link_type", "GID index": "gid_index"}


@dataclass
class PerftestReport:
    """The result table and settings of one ``ib_*_bw`` run (the last row when it swept sizes)."""

    test: str
    message_size: int
    iterations: int
    bw_peak_gbps: float
    bw_average_gbps: float
    msg_rate_mpps: float | None
    settings: dict[str, str] = field(default_factory=dict)


def parse_perftest_output(text: str) -> PerftestReport | None:
    """The report in ``ib_*_bw`` output (``--report_gbits`` or not: MB/sec is MiB/s), None if absent."""
    lines = text.splitlines()
    test = next((line.strip() for line in lines if line.strip().endswith("BW Test")), "")
    settings = {}
    for line in lines:
        for key, value in _SETTING.findall(line):
            if key.strip() in _SETTINGS:
                settings[_SETTINGS[key.strip()]] = value
    report = None
    unit_gbps = 1.0
    for line in lines:
        if m := _HEADER.search(line):
            unit_gbps = 1.0 if m.group(1) == "Gb/sec" else 2**20 * 8 / 1e9
        elif m := _ROW.match(line):
            size, iters, peak, avg, rate = m.groups()
            report = PerftestReport(test, int(size), int(iters), float(peak) * unit_gbps, float(avg) * unit_gbps,
                                    float(rate) if rate else None, settings)
    return report


class PerftestEngine:
    """RDMA traffic with the perftest tools (see the module docstring)."""

    name = "perftest"

    def unavailable_reason(self) -> str | None:
        missing = [tool for tool in TOOLS.values() if shutil.which(tool) is None]
        if missing:
            return f"{', '.join(missing)} not installed (Debian/Ubuntu package: perftest)"
        return None

    def supported_features(self) -> frozenset[str]:
        features = {"opcode:send", "opcode:write", "opcode:read", "direction:uni", "direction:bi",
                    "placement:host", "connections", "batch", "queue_depth", "mtu", "transport:rc", "transport:uc"}
        if self._has_cuda():
            features.add("placement:cuda")
        return frozenset(features)

    def _has_cuda(self) -> bool:
        try:
            help_text = subprocess.run([TOOLS[Opcode.WRITE], "--help"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return "--use_cuda" in help_text.stdout + help_text.stderr

    def run(self, workload: Workload, server_host: Endpoint, client_host: Endpoint,
            duration_s: float = 5.0, timeout_s: float = 10.0) -> Result:
        """Run ``workload`` between the two endpoints (see :meth:`dpro.anomaly.engines.base.Engine.run`)."""
        if refused := refusal(self, workload):
            return refused
        if workload.opcode == Opcode.READ and workload.transport == "uc":
            return Result(self.name, workload, errors=["perftest engine: RDMA READ needs an RC transport"])
        seconds = max(int(round(duration_s)), 1)
        server_argv = ["stdbuf", "-oL", *_command(workload, server_host, seconds)]  # line-buffered: see the ready mark
        client_argv = [*_command(workload, client_host, seconds), server_host.address]
        outcome = run_pair(server_host, client_host, server_argv, lambda _: client_argv,
                           lambda line: READY_MARK in line, _probe_args, run_s=seconds, timeout_s=timeout_s)
        result = Result(self.name, workload, counters=outcome.counters, errors=outcome.errors,
                        notes=[*outcome.notes, "perftest bandwidth tests measure no latency"])
        if outcome.errors:
            return result
        report = parse_perftest_output(outcome.client_stdout)
        if report is None:
            result.errors.append(f"no result table in the client's output: {outcome.client_stdout[-300:]!r}")
            return result
        result.throughput_gbps = report.bw_average_gbps
        result.msgs_per_s = report.msg_rate_mpps * 1e6 if report.msg_rate_mpps is not None else None
        return result


def _command(workload: Workload, endpoint: Endpoint, seconds: int) -> list[str]:
    argv = [TOOLS[workload.opcode], "-s", str(workload.message_size), "-q", str(workload.connections),
            "-t", str(workload.queue_depth), "-l", str(workload.batch), "-D", str(seconds),
            "--report_gbits", "-F"]
    if endpoint.rdma_device:
        argv += ["-d", endpoint.rdma_device, "-i", str(endpoint.rdma_port)]
    if endpoint.gid_index is not None:
        argv += ["-x", str(endpoint.gid_index)]
    if workload.transport:
        argv += ["-c", workload.transport.upper()]
    if workload.mtu:
        argv += ["-m", str(workload.mtu)]
    if workload.direction.value == "bi":
        argv.append("-b")
    if workload.placement.startswith("cuda:"):
        argv.append(f"--use_cuda={workload.placement.split(':')[1]}")
    return argv


def _probe_args(endpoint: Endpoint) -> list[str]:
    args = ["--rdma", endpoint.rdma_device] if endpoint.rdma_device else ["--all-rdma"]
    return args + (["--netdev", endpoint.interface] if endpoint.interface else ["--address", endpoint.address])
