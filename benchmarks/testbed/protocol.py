"""The testbed's measuring protocol: configurations of emulated-device jobs on namespace hosts,
measured interleaved and repeated, recorded once each as a prediction's source.

A :class:`Config` is one job (:class:`~benchmarks.testbed.spec.JobSpec`) with DDP's settings,
the number of hosts and their links' rate. :class:`Testbed` keeps one namespace cluster per
host count for its whole life and re-shapes the links (``tc tbf`` with a small bucket,
:data:`BURST_MS`) before each run.

- :meth:`Testbed.measure` runs the job with no profiler and no dpro (rank 0 times its own
  steps) and returns the median of its steps after :data:`SKIP_STEPS`: the step time users see.
  It keeps the share of the CPU time the machine wanted that its hypervisor took meanwhile
  (:attr:`Testbed.steal`, from ``/proc/stat``): noise from outside the machine. On the 2-vCPU
  VM the testbed was built on, the same FSDP job measured 504-512 ms a step in runs that lost
  under 1% and 734-856 ms in runs that lost 24-33% (2026-11-29), so a run that lost more than
  :data:`STEAL_MAX` is run again, up to :data:`STEAL_RETRIES` times (the last one kept), and
  so is a recording (:attr:`Testbed.stolen` lists each). Before each run made again the testbed
  waits for the hypervisor to give the CPU back: it spins every CPU for :data:`SPIN_S`, pausing
  :data:`STEAL_POLL_S` between spins, until one loses at most :data:`STEAL_MAX`, and goes on
  anyway once :data:`STEAL_WAIT_S` passed (:attr:`Testbed.waits`); a run made again at once
  fell in the same spell (seed 6375's third tries lost 13-26%).
- :meth:`Testbed.record` records it with ``dpro record`` (calibrated, as users record).
- :func:`interleaved` measures every configuration ``repeats`` times, a round at a time, each
  round in a new random order, so that a slow spell of the machine falls on many
  configurations instead of on one; :func:`spread_pct` is a configuration's noise (largest over
  smallest of its medians).
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from benchmarks.testbed.spec import JobSpec
from dpro.collectors.counters.procstat import read_cpu_times, steal_share

T = TypeVar("T")

__all__ = ["STEAL_MAX", "Config", "LocalJob", "Stolen", "Testbed", "Wait", "ddp_flags", "interleaved",
           "spin_stolen_share", "spread_pct", "stolen_pct", "JOB", "SKIP_STEPS"]

JOB = Path(__file__).with_name("job.py")
EXAMPLE_CNN = (str(Path(__file__).resolve().parents[2] / "examples" / "train_lm.py"), "--arch", "cnn", "--steps", "20")
MEASURE_STEPS = 20  # steps of a measured run
SKIP_STEPS = 5  # its first steps, left out (start-up, PowerSGD's uncompressed warm-up)
RECORD_STEPS = 30
RECORD_WINDOW = ["--skip", "10", "--warmup", "2", "--steps", "5"]
RETRIES = 1  # a run whose rendezvous failed is run once more
STEAL_MAX = 0.05
STEAL_RETRIES = 2
SPIN_S = 2.0  # one spin of every CPU, read for the hypervisor's share before a run made again
STEAL_POLL_S = 15.0  # the pause between spins while the share is over STEAL_MAX
STEAL_WAIT_S = 900.0  # no spin after this: the run is made again anyway, and the log says so
BURST_MS = 1.0
"""The links' token bucket, in ms at their rate. A NIC has none: with tbf's 10 ms (375 KB at
300 Mb/s) a call that fit the bucket, refilled during the compute before it, crossed at the
veth's speed while a larger one ran at the rate, which no link model of a wire holds."""


@dataclass(frozen=True)
class Config:
    """One configuration of a testbed job."""

    name: str
    job: JobSpec
    rate_mbit: int
    hosts: int = 2
    ranks_per_host: int = 1
    bucket_cap_mb: float = 25.0
    first_bucket_mb: float | None = None
    comm_hook: str | None = None
    accumulate: int = 1
    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    form: str = "ddp"  # ddp | fsdp | pp | tp (job.py's --form)
    reshard: bool = True  # fsdp: reshard_after_forward
    forward_prefetch: int = 0  # fsdp: units each prefetches in its forward pass
    layers_per_unit: int = 1  # fsdp: layers under one fully_shard
    replicate: int = 1  # fsdp: replicas of each shard (HSDP's mesh: replicate × ranks / replicate)
    microbatches: int = 4  # pp
    schedule: str = "gpipe"  # pp: gpipe | 1f1b
    tp: int = 2  # tp: the tensor-parallel degree (the mesh: ranks / tp × tp)

    def argv(self, steps: int) -> list[str]:
        if self.form != "ddp":
            out = [str(JOB), "--spec", self.job.to_json(), "--steps", str(steps), "--form", self.form]
            if self.form == "fsdp":
                return (out + ([] if self.reshard else ["--no-reshard"])
                        + (["--forward-prefetch", str(self.forward_prefetch)] if self.forward_prefetch else [])
                        + (["--layers-per-unit", str(self.layers_per_unit)] if self.layers_per_unit > 1 else [])
                        + (["--replicate", str(self.replicate)] if self.replicate > 1 else []))
            if self.form == "tp":
                return out + ["--tp", str(self.tp)]
            return out + ["--microbatches", str(self.microbatches), "--schedule", self.schedule]
        out = [str(JOB), "--spec", self.job.to_json(), "--steps", str(steps), "--bucket-cap-mb", str(self.bucket_cap_mb)]
        if self.first_bucket_mb is not None:
            out += ["--first-bucket-mb", str(self.first_bucket_mb)]
        if self.comm_hook:
            out += ["--comm-hook", self.comm_hook]
        if self.accumulate > 1:
            out += ["--accumulate", str(self.accumulate)]
        return out + ddp_flags(self)

    def but(self, name: str, **changes) -> Config:
        return replace(self, name=name, **changes)


def ddp_flags(config) -> list[str]:
    """DDP's flags as the testbed's job and the example take them."""
    return ((["--static-graph"] if config.static_graph else [])
            + (["--grad-as-bucket-view"] if config.gradient_as_bucket_view else []))


@dataclass(frozen=True)
class LocalJob:
    """A job of ``ranks`` processes on this host over loopback (no namespaces, no shaping), that
    writes each step's end time (ns) to ``--step-times PATH`` + ``.0``: the example's jobs."""

    name: str
    argv: tuple[str, ...]
    ranks: int = 2


class Testbed:
    """Namespace clusters (one per host count, built on first use), kept until :meth:`close`."""

    def __init__(self, log: Callable[[str], None] | None = None, steal_retries: int = STEAL_RETRIES) -> None:
        self._clusters: dict[int, object] = {}
        self.log = log or (lambda m: print(m, file=sys.stderr, flush=True))
        self.retried: list[str] = []
        self.steal: dict[str, list[float | None]] = {}  # per configuration, each kept measurement's stolen share
        self.stolen: list[Stolen] = []  # the runs run again for the CPU the hypervisor took
        self.steal_retries = steal_retries
        self.waits: list[Wait] = []  # before each run made again

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for cluster in self._clusters.values():
            cluster.__exit__(None, None, None)
        self._clusters.clear()

    def _cluster(self, config: Config):
        from tools.testing.netns import NetnsCluster

        cluster = self._clusters.get(config.hosts)
        if cluster is None:
            cluster = NetnsCluster(config.hosts, prefix=f"tb{config.hosts}", subnet=f"10.78.{config.hosts}")
            cluster.__enter__()
            self._clusters[config.hosts] = cluster
        for host in range(config.hosts):
            cluster.throttle(host, f"{config.rate_mbit}mbit", burst_ms=BURST_MS)
        return cluster

    def _run(self, config: Config, what: str, start: Callable[[object], list[subprocess.CompletedProcess]]) -> None:
        for attempt in range(RETRIES + 1):
            done = start(self._cluster(config))
            if not any(r.returncode for r in done):
                return
            if attempt < RETRIES:
                self.retried.append(f"{what} {config.name}")
                self.log(f"testbed: {what} {config.name} failed; once more")
        raise RuntimeError(f"{what} {config.name}: " + " | ".join(r.stderr.strip()[-400:] for r in done))

    def repeated(self) -> list[str]:
        """What was run again, one line per reason (a failed start, the CPU the hypervisor took),
        and the waits for the CPU before the runs made again."""
        lines = [f"runs repeated after a failed start: {', '.join(self.retried)}"] if self.retried else []
        if self.stolen:
            lines.append(f"runs repeated for the CPU the hypervisor took (over {100 * STEAL_MAX:g}%): "
                         f"{', '.join(map(str, self.stolen))}")
        if self.waits:
            gave_up = sum(w.gave_up for w in self.waits)
            lines.append(f"checks of the CPU before them: {len(self.waits)}, "
                         f"{sum(w.seconds for w in self.waits):.0f} s in all "
                         f"({sum(w.spins for w in self.waits)} spins of {SPIN_S:g} s), "
                         f"the longest {max(w.seconds for w in self.waits):.0f} s"
                         + (f"; {gave_up} went on after {STEAL_WAIT_S:g} s, still over {100 * STEAL_MAX:g}%"
                            if gave_up else ""))
        return lines

    def measure(self, config: Config | LocalJob) -> float:
        """The median step time (ms) of one run with no profiler, after its first :data:`SKIP_STEPS`;
        the share of the CPU time wanted meanwhile that the hypervisor took goes to :attr:`steal`."""
        ms, share = self._unstolen(config, "measuring", lambda: self._measure(config))
        self.steal.setdefault(config.name, []).append(share)
        return ms

    def _unstolen(self, config: Config | LocalJob, what: str, run: Callable[[], T]) -> tuple[T, float | None]:
        """``run()``'s result and the share of the CPU time wanted meanwhile that the hypervisor
        took; run again while that is over :data:`STEAL_MAX`, up to ``steal_retries`` times, each
        time once the hypervisor gave the CPU back (:meth:`_wait_for_cpu`)."""
        for _ in range(self.steal_retries):
            out, share = _stolen_during(run)
            if share is None or share <= STEAL_MAX:
                return out, share
            self.stolen.append(Stolen(what, config.name, share, out))
            self.log(f"testbed: {self.stolen[-1]}; once more, once the CPU is back")
            self._wait_for_cpu()
        return _stolen_during(run)

    def _wait_for_cpu(self) -> None:
        """Spin every CPU (:func:`spin_stolen_share`), pausing :data:`STEAL_POLL_S` between spins,
        until a spin loses at most :data:`STEAL_MAX` to the hypervisor or :data:`STEAL_WAIT_S`
        passed; the wait goes to :attr:`waits`."""
        start, spins = time.monotonic(), 1
        while (share := spin_stolen_share(SPIN_S)) is not None and share > STEAL_MAX:
            if time.monotonic() - start >= STEAL_WAIT_S:
                self.log(f"testbed: the hypervisor still took {100 * share:.0f}% after {STEAL_WAIT_S:g} s; on anyway")
                break
            time.sleep(STEAL_POLL_S)
            spins += 1
        self.waits.append(Wait(time.monotonic() - start, spins, share))

    def _measure(self, config: Config | LocalJob) -> float:
        from tools.testing.netns import torchrun_across_hosts

        with tempfile.TemporaryDirectory(prefix="dpro-testbed-") as tmp:
            times = Path(tmp) / "steps"
            if isinstance(config, LocalJob):
                subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                f"--nproc-per-node={config.ranks}", *config.argv, "--step-times", str(times)],
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
                ends = [int(line) for line in Path(f"{times}.0").read_text().split()]
                return statistics.median(b - a for a, b in zip(ends[SKIP_STEPS:], ends[SKIP_STEPS + 1:])) / 1e6
            self._run(config, "measuring", lambda c: torchrun_across_hosts(
                c, [*config.argv(MEASURE_STEPS), "--step-times", times], timeout=600,
                nproc_per_node=getattr(config, "ranks_per_host", 1)))
            if not isinstance(config, Config):  # the example's job: each rank's step ends, in PATH.<rank>
                ends = [int(line) for line in Path(f"{times}.0").read_text().split()]
                return statistics.median(b - a for a, b in zip(ends[SKIP_STEPS:], ends[SKIP_STEPS + 1:])) / 1e6
            steps = [int(line) for line in times.read_text().split()]
        return statistics.median(steps[SKIP_STEPS:]) / 1e6

    def record(self, config: Config, run_dir: Path) -> Path:
        """Record the configuration with ``dpro record`` into ``run_dir``."""
        from tools.testing.netns import record_across_hosts

        def start(cluster):
            if run_dir.exists():  # a failed attempt's partial run
                subprocess.run(["rm", "-rf", str(run_dir)], check=True)
            probe = ["--probe"] if config.form == "pp" else []  # a pipeline's micro-batch probe
            return record_across_hosts(cluster, run_dir, config.argv(RECORD_STEPS), record_args=RECORD_WINDOW + probe,
                                       nproc_per_node=config.ranks_per_host, timeout=600)

        self._unstolen(config, "recording", lambda: self._run(config, "recording", start))
        return run_dir


@dataclass(frozen=True)
class Stolen:
    """A run set aside for the CPU the hypervisor took during it: what it was, its share, its result
    (a measurement's median step, ms; None for a recording)."""

    what: str
    name: str
    share: float
    result: float | None

    def __str__(self) -> str:
        got = f", {self.result:.1f} ms" if isinstance(self.result, float) else ""
        return f"{self.what} {self.name}: {100 * self.share:.0f}% of the CPU stolen{got}"


@dataclass(frozen=True)
class Wait:
    """A wait for the CPU before a run made again: its length (s, the spins' included), the
    spins, the last one's stolen share (None where unknown)."""

    seconds: float
    spins: int
    share: float | None

    @property
    def gave_up(self) -> bool:
        """Whether it went on still over :data:`STEAL_MAX` (after :data:`STEAL_WAIT_S`)."""
        return self.share is not None and self.share > STEAL_MAX


def _stolen_during(run: Callable[[], T]) -> tuple[T, float | None]:
    """``run()``'s result and the share of the CPU time wanted meanwhile that the hypervisor took."""
    before, _ = read_cpu_times()
    out = run()
    return out, steal_share(before, read_cpu_times()[0])


def spin_stolen_share(seconds: float) -> float | None:
    """Spin every CPU this process may run on for ``seconds`` (one busy process each) and return
    the share of that time the hypervisor took; None where ``/proc/stat`` has no steal."""
    return _stolen_during(lambda: _spin_every_cpu(seconds))[1]


def _spin_every_cpu(seconds: float) -> None:
    """One busy process for ``seconds`` on each CPU this process may run on; none outlives it."""
    spin = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    spinners: list[subprocess.Popen] = []
    try:
        for _ in range(len(os.sched_getaffinity(0))):
            spinners.append(subprocess.Popen([sys.executable, "-c", spin]))
        for p in spinners:
            p.wait()
    finally:
        for p in spinners:
            if p.poll() is None:
                p.kill()
                p.wait()


def interleaved(testbed: Testbed, configs: Iterable[Config | LocalJob], repeats: int, seed: int,
                record_into: Path | None = None, sources: Iterable[str] = ()) -> dict[str, list[float]]:
    """Measure every configuration ``repeats`` times, round by round, each round in a new random
    order (from ``seed``); in the first round, also record the configurations named in
    ``sources`` into ``record_into/<name>``. Each configuration's medians, in ms."""
    configs = list(configs)
    sources = set(sources)
    order = random.Random(seed)
    out: dict[str, list[float]] = {c.name: [] for c in configs}
    total = repeats * len(configs) + len(sources)
    done = 0
    for round_ in range(repeats):
        shuffled = configs[:]
        order.shuffle(shuffled)
        for config in shuffled:
            if round_ == 0 and config.name in sources and record_into is not None:
                done += 1
                testbed.log(f"testbed: recording {config.name} ({done}/{total})")
                testbed.record(config, record_into / config.name)
            done += 1
            out[config.name].append(testbed.measure(config))
            stolen = stolen_pct((testbed.steal.get(config.name) or [None])[-1])
            testbed.log(f"testbed: {config.name} round {round_ + 1}: {out[config.name][-1]:.1f} ms ({done}/{total})"
                        + (f", {stolen}% of the CPU stolen" if stolen else ""))
    return out


def stolen_pct(share: float | None) -> str:
    """A stolen share as a whole percentage; blank where unknown."""
    return "" if share is None else f"{100 * share:.0f}"


def spread_pct(medians: list[float]) -> float:
    """A configuration's noise: its largest median over its smallest, less one, in %."""
    return 100 * (max(medians) / min(medians) - 1)
