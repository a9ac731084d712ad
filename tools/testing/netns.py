"""A mini-cluster of network namespaces on one Linux machine, for tests and benchmarks.

Each host of a :class:`NetnsCluster` is a network namespace with one veth interface, plugged
into a Linux bridge that lives in a namespace of its own (the *switch*), so nothing is added to
the machine's own network namespace and its firewall never sees the cluster's traffic. Processes
run in their host's namespace and in a UTS namespace of their own whose hostname is the host's
name; every host's namespace gets an ``/etc/hosts`` naming all hosts and resolves names through
it alone (``ip netns exec`` mounts ``/etc/netns/<netns>/{hosts,nsswitch.conf}`` over ``/etc``).
Links can be throttled with ``tc tbf``.

Namespaces are named ``<prefix>-<pid>-<token>-sw`` and ``<prefix>-<pid>-<token>-h<i>``, so two
clusters never collide and :func:`cleanup_stale` can tell a crashed run's leftovers (its pid is
gone) from a live cluster. Needs root, ``ip``, ``tc`` and ``unshare``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

ETC_NETNS = Path("/etc/netns")
IFNAMSIZ = 15  # longest interface name Linux accepts
# Run in the fresh UTS namespace: set the hostname, then become the command.
_SET_HOSTNAME_AND_EXEC = ("import os, socket, sys; socket.sethostname(sys.argv[1]); "
                          "os.execvp(sys.argv[2], sys.argv[2:])")
_RATE = re.compile(r"(\d+(?:\.\d+)?)([kmgt]?)(i?)(bit|bps)?", re.IGNORECASE)
FAIL_FAST_S = 30.0  # record_across_hosts: how long the other hosts may go on once one has failed
TERM_GRACE_S = 20.0  # record_across_hosts: between SIGTERM and SIGKILL


class NetnsError(RuntimeError):
    """A namespace, link or qdisc could not be set up; says which command failed and why."""


@dataclass(frozen=True)
class Host:
    """One host of the cluster."""

    index: int
    name: str  # its hostname, also the name of its veth interface
    netns: str  # its network namespace
    ip: str  # the veth's IPv4 address (a /24 shared by all hosts)
    veth: str  # its interface, inside ``netns``
    bridge_port: str  # the bridge-side end of its veth pair, inside the switch namespace


def _sh(*argv: str) -> str:
    """Run a command; its stdout, or :class:`NetnsError` with its stderr."""
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {result.stderr.strip() or f'exit code {result.returncode}'}")
    return result.stdout


def _tbf_burst(rate: str, ms: float = 10.0) -> int:
    """Bucket size in bytes for a tc rate such as ``"20mbit"``: ``ms`` worth, at least 32 KiB."""
    m = _RATE.fullmatch(rate.strip())
    if not m:
        raise ValueError(f"not a tc rate: {rate!r} (e.g. '20mbit', '500kbit', '1gbit')")
    number, scale, binary, unit = m.groups()
    base = 1024 if binary else 1000
    bits_per_unit = 8 if (unit or "").lower() == "bps" else 1
    bits_per_s = float(number) * base ** " kmgt".index(scale.lower() or " ") * bits_per_unit
    return max(int(bits_per_s / 8 * ms / 1000), 32 * 1024)


def _nsswitch_files_only() -> str:
    """This machine's nsswitch.conf with host names looked up in /etc/hosts only: the cluster has
    no DNS server, and trying the machine's (unreachable from a namespace) turns every unknown
    name into a "temporary failure" (EAI_AGAIN), which c10d warns about, instead of "not found"."""
    try:
        lines = Path("/etc/nsswitch.conf").read_text().splitlines()
    except OSError:
        lines = []
    return "".join(f"{line}\n" for line in lines if not line.startswith("hosts:")) + "hosts: files\n"


def _kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _kill_netns_processes(netns: str) -> None:
    """SIGKILL every process in a network namespace, until none is left (they may fork meanwhile)."""
    for _ in range(20):
        try:
            pids = [int(p) for p in _sh("ip", "netns", "pids", netns).split()]
        except NetnsError:
            return
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _delete_netns(netns: str) -> None:
    """Kill what runs in a namespace, delete it (with the links inside) and its /etc/netns entry
    (and /etc/netns itself once empty)."""
    _kill_netns_processes(netns)
    with contextlib.suppress(NetnsError):
        _sh("ip", "netns", "delete", netns)
    shutil.rmtree(ETC_NETNS / netns, ignore_errors=True)
    with contextlib.suppress(OSError):  # only once no namespace has an entry there
        ETC_NETNS.rmdir()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale(prefix: str = "dpro") -> None:
    """Remove what a crashed earlier cluster with this prefix left behind: its processes,
    namespaces (with their links and bridge) and ``/etc/netns`` entries. Clusters whose owning
    process is still alive are left alone."""
    own = re.compile(rf"{re.escape(prefix)}-(\d+)-[0-9a-f]+-(?:sw|h\d+)")
    try:
        listed = [line.split()[0] for line in _sh("ip", "netns", "list").splitlines() if line.strip()]
    except (NetnsError, FileNotFoundError):
        listed = []
    in_etc = [p.name for p in ETC_NETNS.iterdir()] if ETC_NETNS.is_dir() else []
    for name in sorted(set(listed) | set(in_etc)):
        m = own.fullmatch(name)
        if m and not _pid_alive(int(m.group(1))):
            _delete_netns(name)


class NetnsCluster:
    """N hosts as network namespaces on one Linux bridge; a context manager that always cleans up.

    ``rates`` throttles host links from the start (``{1: "20mbit"}``), as :meth:`throttle` does.
    """

    def __init__(self, hosts: int, *, prefix: str = "dpro", subnet: str = "10.77.0",
                 rates: dict[int, str] | None = None) -> None:
        if not 1 <= hosts <= 240:
            raise ValueError(f"hosts must be between 1 and 240, not {hosts}")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", prefix):
            raise ValueError(f"prefix must be letters and digits, starting with a letter: {prefix!r}")
        if len(f"{prefix}-h{hosts - 1}") > IFNAMSIZ:
            raise ValueError(f"prefix {prefix!r} is too long: interface names must stay within "
                             f"{IFNAMSIZ} characters")
        if not re.fullmatch(r"\d{1,3}\.\d{1,3}\.\d{1,3}", subnet):
            raise ValueError(f"subnet must be the first three octets of a /24, e.g. '10.77.0': {subnet!r}")
        self.prefix = prefix
        self.tag = f"{prefix}-{os.getpid()}-{secrets.token_hex(2)}"
        self.switch_netns = f"{self.tag}-sw"
        self.bridge = f"{prefix}-br"
        self.hosts = [Host(index=i, name=f"{prefix}-h{i}", netns=f"{self.tag}-h{i}",
                           ip=f"{subnet}.{10 + i}", veth=f"{prefix}-h{i}", bridge_port=f"{prefix}-p{i}")
                      for i in range(hosts)]
        self.rates = dict(rates or {})
        self._procs: list[subprocess.Popen] = []
        self._throttled: set[int] = set()
        self._ports = itertools.count(29500)  # a fresh master port for each job

    def __enter__(self) -> NetnsCluster:
        cleanup_stale(self.prefix)
        try:
            self._build()
        except BaseException:
            self._destroy()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._destroy()

    def _build(self) -> None:
        sw = self.switch_netns
        _sh("ip", "netns", "add", sw)
        _sh("ip", "-n", sw, "link", "add", self.bridge, "type", "bridge")
        # br_netfilter, when loaded, hands bridged frames to iptables (bridge-nf-call-iptables,
        # per namespace, on by default), where a FORWARD policy of DROP would lose them. The
        # switch namespace's iptables is empty, but switch it off there all the same.
        if Path("/proc/sys/net/bridge/bridge-nf-call-iptables").exists():
            _sh("ip", "netns", "exec", sw, "sh", "-c",
                "for f in /proc/sys/net/bridge/bridge-nf-call-*; do echo 0 > $f; done")
        _sh("ip", "-n", sw, "link", "set", self.bridge, "up")
        self._write_etc()
        for h in self.hosts:
            _sh("ip", "netns", "add", h.netns)
            # Created directly inside the two namespaces: no name ever appears in the root one.
            _sh("ip", "link", "add", h.veth, "netns", h.netns, "type", "veth", "peer", "name", h.bridge_port,
                "netns", sw)
            _sh("ip", "-n", sw, "link", "set", h.bridge_port, "master", self.bridge, "up")
            _sh("ip", "-n", h.netns, "addr", "add", f"{h.ip}/24", "dev", h.veth)
            _sh("ip", "-n", h.netns, "link", "set", h.veth, "up")
            _sh("ip", "-n", h.netns, "link", "set", "lo", "up")
        for host, rate in self.rates.items():
            self.throttle(host, rate)

    def _write_etc(self) -> None:
        """Every host's ``/etc/netns/<netns>/``: an ``/etc/hosts`` naming all hosts, and name
        resolution through files alone."""
        etc = {"hosts": "127.0.0.1 localhost\n" + "".join(f"{h.ip} {h.name}\n" for h in self.hosts),
               "nsswitch.conf": _nsswitch_files_only()}
        for h in self.hosts:
            (ETC_NETNS / h.netns).mkdir(parents=True, exist_ok=True)
            for name, text in etc.items():
                (ETC_NETNS / h.netns / name).write_text(text)

    def _port_netns(self, host: Host) -> str:
        """The namespace holding the switch-side end of a host's veth (``bridge_port``)."""
        return self.switch_netns

    def _destroy(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                _kill_group(proc.pid)
        # What left the groups (dpro record runs its job in a group of its own; orphans) is
        # still in a host's namespace.
        for netns in [h.netns for h in self.hosts] + [self.switch_netns]:
            _kill_netns_processes(netns)
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self._procs.clear()
        for netns in [h.netns for h in self.hosts] + [self.switch_netns]:
            _delete_netns(netns)

    def popen(self, host: int, argv: Sequence[str], env: dict[str, str] | None = None,
              **kwargs) -> subprocess.Popen:
        """Run argv inside host's netns AND its own UTS namespace whose hostname is host.name
        (unshare --uts), in a session of its own (killable as a group); killed on exit at the
        latest. ``kwargs`` go to :class:`subprocess.Popen`."""
        h = self.hosts[host]
        command = ["ip", "netns", "exec", h.netns, "unshare", "--uts", "--", sys.executable, "-c",
                   _SET_HOSTNAME_AND_EXEC, h.name, *map(str, argv)]
        proc = subprocess.Popen(command, env=env, start_new_session=True, **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, host: int, argv: Sequence[str], timeout: float, *, capture_output: bool = False,
            **kwargs) -> subprocess.CompletedProcess:
        """Run argv on a host (as :meth:`popen`) and wait for it; on timeout its whole process
        group is killed and :class:`subprocess.TimeoutExpired` raised."""
        if capture_output:
            kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
        with self.popen(host, argv, **kwargs) as proc:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                proc.communicate()
                raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def throttle(self, host: int, rate: str, burst_ms: float = 10.0) -> None:
        """Limit a host's link to ``rate`` (a tc rate, e.g. ``"20mbit"``) in both directions:
        a tbf qdisc on its veth (what it sends) and on the switch-side end (what it receives).
        Its bucket holds ``burst_ms`` at the rate (at least 32 KiB): what an idle link lets
        through at the veth's speed before the rate holds."""
        h = self.hosts[host]
        burst = str(_tbf_burst(rate, burst_ms))
        for netns, dev in ((h.netns, h.veth), (self._port_netns(h), h.bridge_port)):
            _sh("tc", "-n", netns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                "burst", burst, "latency", "100ms")
        self._throttled.add(host)

    def unthrottle(self, host: int) -> None:
        """Remove a host's throttling (nothing to do when it has none)."""
        if host not in self._throttled:
            return
        h = self.hosts[host]
        for netns, dev in ((h.netns, h.veth), (self._port_netns(h), h.bridge_port)):
            _sh("tc", "-n", netns, "qdisc", "del", "dev", dev, "root")
        self._throttled.discard(host)


def can_build_namespaces() -> str | None:
    """None when this machine can build a :class:`NetnsCluster` (root; ``ip``, ``tc`` and
    ``unshare``; namespaces, veth pairs, a bridge and tbf work); else why not, for pytest.skip."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    missing = [tool for tool in ("ip", "tc", "unshare") if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} on PATH"
    try:
        with NetnsCluster(1, prefix="dprocheck", rates={0: "100mbit"}) as cluster:
            result = cluster.run(0, ["uname", "-n"], timeout=30, capture_output=True, text=True)
    except (NetnsError, OSError, subprocess.SubprocessError) as e:
        return f"cannot build network namespaces here: {e}"
    if result.returncode != 0 or result.stdout.strip() != cluster.hosts[0].name:
        return f"cannot run a command in a network and UTS namespace: {result.stderr.strip()}"
    return None


def record_across_hosts(cluster: NetnsCluster, run_dir: str | os.PathLike, script_argv: Iterable[str], *,
                        nproc_per_node: int = 1, record_args: Sequence[str] = (),
                        timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """Record one torchrun job spread over every host of the cluster into ``run_dir``.

    On every host at once: ``python -m dpro record --join -o RUN_DIR <record_args> -- python -m
    torch.distributed.run ... <script_argv>`` (see :func:`torchrun_across_hosts`).
    """
    record = [sys.executable, "-m", "dpro", "record", "--join", "-o", os.fspath(run_dir), *record_args, "--"]
    return torchrun_across_hosts(cluster, script_argv, nproc_per_node=nproc_per_node, before=record, timeout=timeout)


def torchrun_across_hosts(cluster: NetnsCluster, program_argv: Iterable[str], *, nproc_per_node: int = 1,
                          no_python: bool = False, before: Sequence[str] = (), env: dict[str, str] | None = None,
                          timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """Run one torchrun job spread over every host of the cluster.

    On every host at once: ``<before> python -m torch.distributed.run [--no-python] --nnodes N
    --nproc-per-node K --node-rank i --master-addr <host 0> --master-port <port> <program_argv>``
    (static rendezvous), with ``GLOO_SOCKET_IFNAME`` set to the host's veth and ``env`` added.
    Returns one completed process per host, output captured as text. When one host fails, the
    others get :data:`FAIL_FAST_S` seconds to end before they are stopped (SIGTERM, then
    SIGKILL; whatever outlives that goes when the cluster exits). After ``timeout`` seconds, all
    are stopped that way and :class:`subprocess.TimeoutExpired` is raised.
    """
    program_argv = [str(a) for a in program_argv]
    port = next(cluster._ports)
    deadline = time.monotonic() + timeout
    with contextlib.ExitStack() as files:
        procs = []
        for h in cluster.hosts:
            argv = [*before, sys.executable, "-m", "torch.distributed.run", *(["--no-python"] if no_python else []),
                    "--nnodes", str(len(cluster.hosts)), "--nproc-per-node", str(nproc_per_node),
                    "--node-rank", str(h.index), "--master-addr", cluster.hosts[0].ip, "--master-port", str(port),
                    *program_argv]
            out, err = (files.enter_context(tempfile.TemporaryFile("w+")) for _ in range(2))
            host_env = {**os.environ, **(env or {}), "GLOO_SOCKET_IFNAME": h.veth}
            procs.append((cluster.popen(h.index, argv, env=host_env, stdout=out, stderr=err, text=True), out, err))
        stop_at = deadline
        while None in (codes := [p.poll() for p, _, _ in procs]) and time.monotonic() < stop_at:
            if any(code not in (None, 0) for code in codes):
                stop_at = min(stop_at, time.monotonic() + FAIL_FAST_S)
            time.sleep(0.1)
        timed_out = None in codes and time.monotonic() >= deadline
        _stop([p for p, _, _ in procs])
        results = []
        for p, out, err in procs:
            out.seek(0)
            err.seek(0)
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out.read(), err.read()))
    if timed_out:
        raise subprocess.TimeoutExpired(results[0].args, timeout,
                                        output="".join(r.stdout for r in results),
                                        stderr="".join(r.stderr for r in results))
    return results


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM the groups still running, then SIGKILL what is left after a grace period."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        _kill_group(p.pid, signal.SIGTERM)
    end = time.monotonic() + TERM_GRACE_S
    for p in running:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(p.pid)
            p.wait()
