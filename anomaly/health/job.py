"""One rank's part of ``dpro health``: join the job, check this host's GPUs, NICs and the CPU
time its hypervisor took (the host's lowest rank does), run the collectives and the pairwise
matrix, and on rank 0 judge everything and return the report.

Rank and world come from the environment a launcher sets: torchrun's ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, or Slurm's ``SLURM_PROCID``, ``SLURM_NTASKS``,
``SLURM_LOCALID`` (with ``MASTER_ADDR`` and ``MASTER_PORT`` exported by the batch script).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dpro.anomaly.fabric.probes import Probes
from dpro.anomaly.fabric.routing import Routing
from dpro.anomaly.fabric.topology import probe_tiers, read_topology

from dpro.anomaly.health.budget import Budget
from dpro.anomaly.health.collective_bench import run_collectives
from dpro.anomaly.health.config import HealthConfig, HealthConfigError
from dpro.anomaly.health.cpu import CpuWatch, judge_steal
from dpro.anomaly.health.gpu_checks import GpuWatch
from dpro.anomaly.health.model import JOB, Check, HealthReport, Node
from dpro.anomaly.health.network import judge_network, matrix_as_judged
from dpro.anomaly.health.nic import NicWatch
from dpro.anomaly.health.backend_pairwise import leaders, measure_pairwise
from dpro.anomaly.health.rules import apply_rules

__all__ = ["launcher_env", "run_rank"]

TIMEOUT = timedelta(minutes=10)


def launcher_env(environ: dict[str, str] | None = None) -> dict[str, str] | None:
    """torchrun's variables (from Slurm's when srun launched us), or None when no launcher did."""
    env = dict(os.environ if environ is None else environ)
    if "RANK" in env and "WORLD_SIZE" in env:
        return env
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return {**env, "RANK": env["SLURM_PROCID"], "WORLD_SIZE": env["SLURM_NTASKS"],
                "LOCAL_RANK": env.get("SLURM_LOCALID", "0")}
    return None


def run_rank(config: HealthConfig, history: Callable[[str, str], list[float]] | None = None,
             sysfs_root: str | None = None) -> tuple[HealthReport | None, int]:
    """Run this rank's part: the judged report on rank 0 (None elsewhere) and the exit code of
    its verdict, which every rank gets. The process group is set up from the environment (see
    the module docstring) and torn down before returning."""
    env = launcher_env()
    if env is None:
        raise RuntimeError("run_rank needs RANK and WORLD_SIZE (or SLURM_PROCID and SLURM_NTASKS)")
    os.environ.update({k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k in env})
    backend = config.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cuda", int(env.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    topology = read_topology(config.topology) if config.topology else None
    started = _now()
    dist.init_process_group(backend, timeout=TIMEOUT)
    try:
        host = socket.gethostname()
        rank_hosts: list[str] = [""] * dist.get_world_size()
        dist.all_gather_object(rank_hosts, host)
        tiers = _tiers(topology, rank_hosts) if topology is not None else []
        leader = dist.get_rank() in leaders(rank_hosts)
        gpus, nics, cpu = GpuWatch(), NicWatch(sysfs_root), CpuWatch()
        if leader:
            gpus.start()
            nics.start()
            cpu.start()
        budget = Budget(config.time_budget_s)
        job_checks = run_collectives(config.collectives.ops, config.collectives.sizes_mb,
                                     config.collectives.iterations, device, config.collectives.seconds, budget)
        routing = Routing.build(topology, by="destination") \
            if topology is not None and config.pairwise.routes == "destination" else None
        probes, cut, again, first_rounds = measure_pairwise(rank_hosts, config.pairwise.megabytes,
                                                            config.pairwise.seconds, device, tiers, budget, topology,
                                                            routing, config.pairwise.sweeps)
        if cut:
            job_checks.append(Check("pairwise.budget", "skip", cut))
        if again:
            why = ("where the first sweep left a NIC, link or switch in doubt" if topology is not None else
                   "to confirm the paths the first sweep named (each direction weighed at the better of its two)")
            job_checks.append(Check("pairwise.follow_up", "pass", f"{again} host-pair probes made again {why}"))
        node_checks = gpus.finish(busy=device.type == "cuda") + nics.finish() + cpu.finish() if leader else []
        gathered: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object((host, node_checks), gathered, dst=0)
        report = None
        if gathered is not None:
            report = _judge(config, history, started, rank_hosts, gathered, job_checks, probes, topology, backend,
                            routing)
            if probes is not None:
                report.facts["pairwise"]["first_sweep_rounds"] = first_rounds
        code = [report.exit_code if report is not None else 0]
        dist.broadcast_object_list(code, src=0)
    finally:
        dist.destroy_process_group()
    return report, int(code[0])


def _judge(config: HealthConfig, history: Callable[[str, str], list[float]] | None, started: str,
           rank_hosts: list[str], gathered: list[Any], job_checks: list[Check], probes: Probes | None,
           topology: Any, backend: str, routing: Routing | None = None) -> HealthReport:
    nodes = {h: Node(h) for h in rank_hosts}
    for h, checks in gathered:
        nodes[h].checks += checks
    report = HealthReport(started, _now(), list(nodes.values()) + [Node(JOB, job_checks)],
                          facts={"world_size": len(rank_hosts), "backend": backend,
                                 "hosts": list(nodes), "ranks_per_host": {h: rank_hosts.count(h) for h in nodes},
                                 "time_budget_s": config.time_budget_s,
                                 "rules": asdict(config.rules)})
    if probes is not None:
        report.suspects = judge_network(report, probes, topology, routing, config.rules)
        report.probes = probes
        report.facts["pairwise"] = {"hosts": probes.hosts, "gbps": _matrix(probes, topology), "routes": config.pairwise.routes,
                                    "rounds": len(np.unique(probes.round)), "sweeps": config.pairwise.sweeps}
    else:
        report.node(JOB).checks.append(Check("pairwise", "skip", "one host: no host pairs to probe"))
    judge_steal(report)
    apply_rules(report, config, history)
    report.finished = _now()
    return report


def _tiers(topology: Any, rank_hosts: list[str]) -> list[dict[str, str]]:
    """Each host's edge switch and pod; every rank raises the same error when a host is not in
    the topology."""
    missing = sorted(set(rank_hosts) - set(topology))
    if missing:
        raise HealthConfigError(f"host {missing[0]} is in the job but not in the topology")
    return probe_tiers(topology, sorted(set(rank_hosts)))


def _matrix(probes: Probes, topology: Any) -> list[list[float | None]]:
    """The probes as rows of Gb/s, as the check judged them (None where not measured), for JSON."""
    return [[None if np.isnan(v) else round(float(v), 4) for v in row] for row in matrix_as_judged(probes, topology)]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
