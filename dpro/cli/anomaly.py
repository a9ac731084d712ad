"""``dpro anomaly``: probe, search and read the network before a job does (``search``,
``probe``, ``counters``)."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

import click

from dpro.cli import CONTEXT


@click.group("anomaly", context_settings=CONTEXT)
def anomaly() -> None:
    """Find network anomalies before a job does."""


@anomaly.command("search")
@click.option("--engine", "engine_name", default="tcp", show_default=True,
              help="Traffic engine: tcp, perftest or verbs.")
@click.option("--server", required=True, help="Address the server listens on.")
@click.option("--client", required=True, help="Address the client sends from.")
@click.option("--server-prefix", default="", help="Command that runs a program on the server host, e.g. "
              "'ip netns exec h0' or 'ssh host0' (default: here).")
@click.option("--client-prefix", default="", help="The same for the client host.")
@click.option("--server-device", help="RDMA device of the server (perftest, verbs).")
@click.option("--client-device", help="RDMA device of the client (perftest, verbs).")
@click.option("--objective", default="throughput", show_default=True,
              help="'throughput' (low throughput for the message size) or 'counter:NAME' (a high rate of "
                   "a counter, e.g. counter:rx_pause_frames).")
@click.option("--threshold", type=float, help="When a score is anomalous: a fraction of the expected "
              "throughput (default 0.5), or a counter rate per second (default 0).")
@click.option("--link-gbps", type=float, help="Throughput objective: expect this rate per direction "
              "(default: the best measured at the same message size).")
@click.option("--budget", default=50, show_default=True, type=click.IntRange(min=1),
              help="Measurements at most (search, references, confirmations, minimization).")
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True), help="Start no measurement after this long.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the walk.")
@click.option("--duration", default=2.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds of traffic per measurement.")
@click.option("--timeout", default=10.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds any wait of a measurement may last before it is given up.")
@click.option("--features", help="Comma-separated workload features to vary (default: all the engine supports).")
@click.option("--domain", "domains", multiple=True, metavar="NAME=V1,V2,...",
              help="Values of one feature, e.g. message_size=4096,65536 (repeatable).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Directory for search.json and search.md (default: dpro-search-<time>).")
def search_command(engine_name: str, server: str, client: str, server_prefix: str, client_prefix: str,
                   server_device: str | None, client_device: str | None, objective: str,
                   threshold: float | None, link_gbps: float | None, budget: int, seconds: float | None,
                   seed: int, duration: float, timeout: float, features: str | None, domains: tuple[str, ...],
                   out: Path | None) -> None:
    """Search the workloads an engine can make between two hosts for anomalies (Collie-style
    simulated annealing), and reduce each to the features that trigger it.

    \b
    Every measurement counts against --budget: the walk, the reference measurements the
    throughput objective compares with, the re-measurement that confirms an anomaly, and the
    measurements that reset its features to the baseline one at a time.
    """
    from dpro.anomaly.engines.base import Endpoint
    from dpro.anomaly.search.collie import Budget, search
    from dpro.anomaly.search.objectives import parse_objective
    from dpro.anomaly.search.report import write_report
    from dpro.anomaly.search.space import WorkloadSpace, plain

    engine = _usable_engine(engine_name)
    try:
        space = WorkloadSpace.for_engine(engine, only=_names(features), domains=_domains(domains))
        goal = parse_objective(objective, threshold, link_gbps)
        limits = Budget(budget, seconds)
        ends = [Endpoint(address, prefix=tuple(shlex.split(prefix)), rdma_device=device)
                for address, prefix, device in ((server, server_prefix, server_device),
                                                 (client, client_prefix, client_device))]
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    out = out or Path(f"dpro-search-{time.strftime('%Y%m%d-%H%M%S')}")

    def progress(trial: Any) -> None:
        changed = ", ".join(f"{n}={plain(v)}" for n, v in space.differences(trial.workload).items())
        score = "failed: " + "; ".join(trial.result.errors) if trial.result.errors else \
            f"score {trial.score:.3g}" if trial.score is not None else "no score"
        click.echo(f"{trial.index:>3} {trial.kind:<9} {changed or '(baseline)'}: {score}"
                   f"{'  ANOMALOUS' if trial.anomalous else ''}", err=True)

    result = search(engine, *ends, space=space, objective=goal, budget=limits, seed=seed, duration_s=duration,
                    timeout_s=timeout, on_trial=progress)
    paths = write_report(result, out)
    found = len(result.anomalies)
    click.echo(f"{len(result.trials)} trials, {found} anomal{'y' if found == 1 else 'ies'} ({result.stopped})")
    for a in result.anomalies:
        minimal = ", ".join(f"{n}={plain(v)}" for n, v in a.minimal.items()) or "the baseline itself"
        click.echo(f"  needs {minimal}{'' if a.complete else ' (incomplete)'}  [trial {a.trial}]")
    click.echo(f"report: {paths['markdown']}, {paths['json']}")


def _usable_engine(name: str) -> Any:
    """The engine called ``name``, or a one-line error when there is none or it cannot run here."""
    from dpro.anomaly.engines import get_engine

    try:
        engine = get_engine(name)
    except KeyError as e:
        raise click.ClickException(str(e.args[0])) from None
    if reason := engine.unavailable_reason():
        raise click.ClickException(f"the {engine.name} engine cannot run here: {reason}")
    return engine


def _names(features: str | None) -> list[str] | None:
    if features is None:
        return None
    names = [n.strip() for n in features.split(",") if n.strip()]
    if not names:
        raise ValueError("--features names no feature")
    return names


def _domains(options: tuple[str, ...]) -> dict[str, list[str]]:
    domains: dict[str, list[str]] = {}
    for option in options:
        name, sep, values = option.partition("=")
        if not sep or not values.strip():
            raise ValueError(f"--domain takes NAME=V1,V2,..., not {option!r}")
        domains[name.strip()] = [v.strip() for v in values.split(",") if v.strip()]
    return domains


@anomaly.command("probe")
@click.argument("hosts_file", metavar="HOSTS", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the bandwidth matrix (JSON, for `dpro diagnose --probes`).")
@click.option("--engine", "engine_name", default="tcp", show_default=True, help="Traffic engine: tcp, perftest or verbs.")
@click.option("--seconds", default=2.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="How long each probe sends.")
@click.option("--message-size", default=1 << 20, show_default=True, type=click.IntRange(min=1), help="Bytes per message.")
@click.option("--connections", default=1, show_default=True, type=click.IntRange(min=1), help="Parallel connections per probe.")
@click.option("--rounds", type=click.IntRange(min=1), help="Only the first N rounds (default: every pair, n-1 rounds).")
@click.option("--timeout", default=20.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds any step of a probe may take.")
@click.option("--topology", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Fabric topology (YAML/JSON or ibnetdiscover): at most one pair a round leaves any edge switch "
                   "or pod, so that no two probes of a round share a link.")
def probe_command(hosts_file: Path, output: Path, engine_name: str, seconds: float, message_size: int,
                  connections: int, rounds: int | None, timeout: float, topology: Path | None) -> None:
    """Measure the bandwidth between every pair of HOSTS in rounds of disjoint pairs.

    \b
    HOSTS (YAML or JSON):   h0: {address: 10.0.0.1, prefix: "ssh h0"}
                            h1: {address: 10.0.0.2, prefix: "ssh h1", interface: eth0}
    Example:  dpro anomaly probe hosts.yaml -o probes.json && dpro diagnose RUN --probes probes.json
    """
    from dpro.anomaly.engines.base import Workload
    from dpro.anomaly.fabric.pairwise import measure, read_hosts, write_probes

    if output.exists():
        raise click.ClickException(f"{output} exists: not overwritten")
    engine = _usable_engine(engine_name)
    hosts = read_hosts(hosts_file)
    tiers = _probe_tiers(topology, list(hosts)) if topology is not None else []
    probes, results = measure(engine, hosts, Workload(message_size=message_size, connections=connections),
                              seconds, timeout, rounds, tiers)
    write_probes(probes, output)
    failed = [r for r in results if r["errors"]]
    click.echo(f"{len(probes.value)} of {len(results)} probes measured between {len(hosts)} hosts -> {output}")
    for r in failed:
        click.echo(f"  {r['src']} -> {r['dst']} failed: {'; '.join(r['errors'])}", err=True)


def _probe_tiers(path: Path, names: list[str]) -> list[dict[str, str]]:
    """Each host's edge switch and pod in the topology at ``path`` (a one-line error if a host is not in it)."""
    from dpro.anomaly.fabric.topology import probe_tiers, read_topology

    topology = read_topology(path)
    missing = [h for h in names if h not in topology]
    if missing:
        raise click.ClickException(f"host {missing[0]!r} is not in the topology {path}")
    return probe_tiers(topology, names)


@anomaly.command("counters")
@click.option("--interval", default=5.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds between the two snapshots.")
@click.option("--sysfs-root", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Read sysfs from here (a recorded tree; default $DPRO_SYSFS_ROOT or /sys).")
@click.option("--ethtool", "interfaces", multiple=True, help="Also read `ethtool -S` of this interface.")
@click.option("--all", "show_all", is_flag=True, help="Show counters that did not move too.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def counters_command(interval: float, sysfs_root: Path | None, interfaces: tuple[str, ...], show_all: bool,
                     as_json: bool) -> None:
    """Rates of this host's RDMA, netdev, ethtool and GPU counters over INTERVAL seconds, and the share of
    its CPU time the hypervisor took (steal)."""
    from dpro.collectors.counters import diff, take_snapshot
    from dpro.collectors.counters.procstat import steal_share

    before = take_snapshot(sysfs_root, ethtool=interfaces)
    time.sleep(interval)
    after = take_snapshot(sysfs_root, ethtool=interfaces)
    rates = diff(before, after)
    stolen = steal_share(before.cpu_times, after.cpu_times)
    if as_json:
        click.echo(json.dumps({**rates.to_dict(), "cpu_steal_share": stolen}, indent=1))
        return
    frame = rates.to_frame()
    if not show_all and not frame.empty:
        frame = frame[frame["per_s"] != 0]
    click.echo(frame.to_string(index=False) if not frame.empty else "no counter moved")
    if stolen is not None:
        click.echo(f"CPU: the hypervisor took {100 * stolen:.1f}% of the CPU time this host's CPUs wanted (steal)")
    for note in rates.notes:
        click.echo(f"note: {note}")
