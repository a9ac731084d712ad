"""A routed leaf-spine fabric of network namespaces, for tests and benchmarks.

Hosts are namespaces (as in :class:`tools.testing.netns.NetnsCluster`: their own hostname, an
``/etc/hosts`` naming every host); leaves and spines are namespaces that forward IPv4. Each leaf
has a /24 for its hosts (``10.<net>.<leaf>.0/24``, the leaf at ``.1``); each leaf–spine cable is
a /30; a leaf reaches the other leaves' /24s over every spine at once (an ECMP route, ``ip route
... nexthop via ... nexthop via ...``, hashed on addresses and ports), a spine reaches each /24
through its leaf. With ``routes="destination"`` a leaf routes by destination instead, the way
InfiniBand's fat-tree routing does: host ``d`` of another leaf (hosts numbered leaf by leaf) over
spine ``d mod spines``, a ``/32`` route each. One direction of a leaf–spine cable can be
throttled with ``tc tbf``.

    >>> with RoutedFabric(leaves=2, spines=2, hosts_per_leaf=3) as fabric:   # doctest: +SKIP
    ...     fabric.throttle_link("leaf0", "spine0", "100mbit")               # leaf0 -> spine0 only
    ...     fabric.write_topology("fabric.yaml")
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tools.testing.netns import Host, NetnsCluster, _delete_netns, _kill_netns_processes, _sh, _tbf_burst

__all__ = ["RoutedFabric"]


class RoutedFabric(NetnsCluster):
    """``leaves × hosts_per_leaf`` hosts under ``leaves`` leaf routers, every leaf cabled to each
    of ``spines`` spine routers (see the module docstring); a context manager that always cleans
    up. Hosts are numbered leaf by leaf; :meth:`popen`, :meth:`run` and
    :func:`tools.testing.netns.torchrun_across_hosts` work as on a cluster."""

    def __init__(self, leaves: int = 2, spines: int = 2, hosts_per_leaf: int = 2, *, prefix: str = "dfab",
                 net: int = 90, routes: str = "ecmp") -> None:
        if not (1 <= leaves <= 16 and 1 <= spines <= 16 and 1 <= hosts_per_leaf <= 200):
            raise ValueError("a fabric has 1-16 leaves, 1-16 spines and 1-200 hosts per leaf")
        if routes not in ("ecmp", "destination"):
            raise ValueError(f"a fabric routes by 'ecmp' or 'destination', not {routes!r}")
        self.routes = routes
        super().__init__(leaves * hosts_per_leaf, prefix=prefix, subnet=f"10.{net}.0")
        self.net = net
        self.leaves = [f"leaf{i}" for i in range(leaves)]
        self.spines = [f"spine{i}" for i in range(spines)]
        self.hosts = [Host(index=i, name=f"{prefix}-h{i}", netns=f"{self.tag}-h{i}",
                           ip=f"10.{net}.{i // hosts_per_leaf}.{10 + i % hosts_per_leaf}", veth="eth0",
                           bridge_port=f"h{i}") for i in range(leaves * hosts_per_leaf)]
        self.hosts_per_leaf = hosts_per_leaf

    def router_netns(self, router: str) -> str:
        return f"{self.tag}-{router}"

    def leaf_of(self, host: int) -> str:
        return self.leaves[host // self.hosts_per_leaf]

    def _port_netns(self, host: Host) -> str:
        """A host's veth ends in its leaf: :meth:`throttle` limits its access link both ways."""
        return self.router_netns(self.leaf_of(host.index))

    def _cable(self, leaf: int, spine: int) -> tuple[str, str]:
        """The /30 addresses of a leaf–spine cable: the leaf's end, the spine's end."""
        base = (leaf * 16 + spine) * 4
        return f"10.{self.net + 1}.{base // 256}.{base % 256 + 1}", f"10.{self.net + 1}.{base // 256}.{base % 256 + 2}"

    def _build(self) -> None:
        for router in self.leaves + self.spines:
            ns = self.router_netns(router)
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
            _sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.fib_multipath_hash_policy=1")
        self._write_etc()
        for h in self.hosts:
            leaf = h.index // self.hosts_per_leaf
            leaf_ns = self._port_netns(h)
            _sh("ip", "netns", "add", h.netns)
            _sh("ip", "link", "add", h.veth, "netns", h.netns, "type", "veth", "peer", "name", h.bridge_port,
                "netns", leaf_ns)
            _sh("ip", "-n", h.netns, "addr", "add", f"{h.ip}/24", "dev", h.veth)
            for ns, dev in ((h.netns, h.veth), (leaf_ns, h.bridge_port), (h.netns, "lo")):
                _sh("ip", "-n", ns, "link", "set", dev, "up")
            _sh("ip", "-n", h.netns, "route", "add", "default", "via", f"10.{self.net}.{leaf}.1")
        for leaf, leaf_name in enumerate(self.leaves):
            leaf_ns = self.router_netns(leaf_name)
            ports = [h.bridge_port for h in self.hosts if h.index // self.hosts_per_leaf == leaf]
            # the hosts' ports share the leaf's /24: a bridge joins them, the leaf's address on it
            _sh("ip", "-n", leaf_ns, "link", "add", "hosts", "type", "bridge")
            for port in ports:
                _sh("ip", "-n", leaf_ns, "link", "set", port, "master", "hosts")
            _sh("ip", "-n", leaf_ns, "addr", "add", f"10.{self.net}.{leaf}.1/24", "dev", "hosts")
            _sh("ip", "-n", leaf_ns, "link", "set", "hosts", "up")
            for spine, spine_name in enumerate(self.spines):
                up, down = f"up-s{spine}", f"dn-l{leaf}"
                leaf_ip, spine_ip = self._cable(leaf, spine)
                _sh("ip", "link", "add", up, "netns", leaf_ns, "type", "veth", "peer", "name", down,
                    "netns", self.router_netns(spine_name))
                _sh("ip", "-n", leaf_ns, "addr", "add", f"{leaf_ip}/30", "dev", up)
                _sh("ip", "-n", self.router_netns(spine_name), "addr", "add", f"{spine_ip}/30", "dev", down)
                _sh("ip", "-n", leaf_ns, "link", "set", up, "up")
                _sh("ip", "-n", self.router_netns(spine_name), "link", "set", down, "up")
                _sh("ip", "-n", self.router_netns(spine_name), "route", "add", f"10.{self.net}.{leaf}.0/24",
                    "via", leaf_ip)
        for leaf, leaf_name in enumerate(self.leaves):
            if self.routes == "destination":
                for h in self.hosts:
                    if h.index // self.hosts_per_leaf != leaf:
                        spine = h.index % len(self.spines)
                        _sh("ip", "-n", self.router_netns(leaf_name), "route", "add", f"{h.ip}/32",
                            "via", self._cable(leaf, spine)[1], "dev", f"up-s{spine}")
                continue
            for other in range(len(self.leaves)):
                if other == leaf:
                    continue
                hops = []
                for spine in range(len(self.spines)):
                    hops += ["nexthop", "via", self._cable(leaf, spine)[1], "dev", f"up-s{spine}"]
                _sh("ip", "-n", self.router_netns(leaf_name), "route", "add", f"10.{self.net}.{other}.0/24", *hops)

    def _destroy(self) -> None:
        super()._destroy()
        for router in self.leaves + self.spines:
            _kill_netns_processes(self.router_netns(router))
            _delete_netns(self.router_netns(router))

    def throttle_link(self, a: str, b: str, rate: str) -> None:
        """Limit what ``a`` sends to ``b`` over their cable (a leaf and a spine, either way round)
        to ``rate``; the other direction keeps its speed."""
        if a in self.leaves and b in self.spines:
            ns, dev = self.router_netns(a), f"up-s{self.spines.index(b)}"
        elif a in self.spines and b in self.leaves:
            ns, dev = self.router_netns(a), f"dn-l{self.leaves.index(b)}"
        else:
            raise ValueError(f"{a} and {b} are not a leaf and a spine of this fabric")
        _sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
            "burst", str(_tbf_burst(rate)), "latency", "100ms")

    def topology(self) -> dict:
        """The fabric in ``dpro diagnose``'s topology format (one NIC, ``eth0``, per host)."""
        links = [[f"{h.name}/eth0", self.leaf_of(h.index)] for h in self.hosts]
        links += [{"a": leaf, "b": spine, "name": f"{leaf}--{spine}"} for leaf in self.leaves for spine in self.spines]
        return {"switches": self.leaves + self.spines, "hosts": {h.name: ["eth0"] for h in self.hosts}, "links": links}

    def write_topology(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.topology(), indent=1))
        return path
