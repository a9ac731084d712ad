"""Fabric topologies as networkx graphs: read from a file, parsed from ``ibnetdiscover``, or a
generated fat tree; and the access links of each host (paths: :mod:`dpro.anomaly.fabric.routing`).

A topology is an ``nx.MultiGraph`` (two switches may be joined by several cables). Every node
has a ``kind``: ``host``, ``nic`` or ``switch``. Every edge is a link with a ``name`` unique in
the graph and, where known, ``ports``: ``{node: port number}``. A host is joined to its NICs
(a link named ``host--nic``), each NIC to one switch.

**YAML or JSON file** (:func:`read_topology`, :func:`from_spec`)::

    switches: [leaf0, leaf1, spine0]
    hosts:                        # host: its NICs (default: one NIC named nic0)
      node0: [mlx5_0]
      node1: []
    links:                        # [a, b], or a mapping with a, b and optionally
      - [node0/mlx5_0, leaf0]     # name, a_port, b_port
      - [node1, leaf1]            # a host with one NIC stands for that NIC
      - {a: leaf0, b: spine0, a_port: 17, b_port: 1, name: l0-s0}
      - [leaf1, spine0]

A NIC's node is ``host/nic``. A link without a name is named ``a[a_port]--b[b_port]`` (or
``a--b`` without ports).

**ibnetdiscover** (:func:`parse_ibnetdiscover`): its text output, ``Switch``/``Ca`` blocks whose
``[port]`` lines name the peer at the other end of each cable. A switch is named by its node
description when that is unique among switches, else by its GUID (``S-...``). A CA's node
description ``"node001 mlx5_0"`` gives host ``node001`` and NIC ``node001/mlx5_0``; when that is
not unique, the host is the CA's GUID (``H-...``).

"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import networkx as nx

from dpro.errors import DproError

__all__ = ["TopologyError", "access_links", "edge_switch", "fat_tree", "from_spec", "host_nic", "hosts", "link_name", "pods", "probe_tiers",
           "parse_ibnetdiscover", "read_topology", "validate"]

KINDS = ("host", "nic", "switch")


class TopologyError(DproError, ValueError):
    """A topology file or graph that cannot be used; the message is one line."""


def link_name(a: str, b: str, a_port: int | None = None, b_port: int | None = None) -> str:
    """``a[a_port]--b[b_port]``, leaving out unknown ports."""
    return f"{a}{'' if a_port is None else f'[{a_port}]'}--{b}{'' if b_port is None else f'[{b_port}]'}"


def _add_link(g: nx.MultiGraph, a: str, b: str, a_port: int | None = None, b_port: int | None = None,
              name: str | None = None) -> None:
    ports = {n: p for n, p in ((a, a_port), (b, b_port)) if p is not None}
    g.add_edge(a, b, name=name or link_name(a, b, a_port, b_port), ports=ports)


def _natural(name: str) -> tuple:
    """Sort key that puts ``h2`` before ``h10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def hosts(topology: nx.MultiGraph) -> list[str]:
    """The hosts, in natural order (``h2`` before ``h10``)."""
    return sorted((n for n, kind in topology.nodes(data="kind") if kind == "host"), key=_natural)


def host_nic(topology: nx.MultiGraph, host: str) -> str:
    """The NIC a host probes through: its first NIC (by name) that is cabled to a switch."""
    nics = sorted(n for n in topology[host] if topology.nodes[n].get("kind") == "nic")
    for nic in nics:
        if any(topology.nodes[p].get("kind") == "switch" for p in topology[nic]):
            return nic
    raise TopologyError(f"host {host} has no NIC cabled to a switch")


def validate(topology: nx.MultiGraph) -> nx.MultiGraph:
    """The topology itself, after checking kinds and that link names are unique."""
    bad = [n for n, kind in topology.nodes(data="kind") if kind not in KINDS]
    if bad:
        raise TopologyError(f"node {bad[0]!r} has kind {topology.nodes[bad[0]].get('kind')!r}, not one of {KINDS}")
    names = [name for _, _, name in topology.edges(data="name")]
    if None in names:
        raise TopologyError("every link needs a name")
    duplicate = next((n for n, c in Counter(names).items() if c > 1), None)
    if duplicate is not None:
        raise TopologyError(f"two links are named {duplicate!r}")
    return topology


# --- YAML / JSON -------------------------------------------------------------------------------


def read_topology(path: str | os.PathLike) -> nx.MultiGraph:
    """A topology from a YAML or JSON file (see the module docstring) or ``ibnetdiscover`` output."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise TopologyError(f"cannot read topology {path}: {e.strerror}") from None
    if _looks_like_ibnetdiscover(text):
        return parse_ibnetdiscover(text)
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise TopologyError(f"{path} is neither YAML/JSON nor ibnetdiscover output: {str(e).splitlines()[0]}") from None
    if not isinstance(spec, dict):
        raise TopologyError(f"{path}: a topology file is a mapping with switches, hosts and links")
    try:
        return from_spec(spec)
    except TopologyError as e:
        raise TopologyError(f"{path}: {e}") from None
    except (TypeError, AttributeError, ValueError) as e:  # a field of the wrong shape
        raise TopologyError(f"{path}: not a topology (switches: [...], hosts: {{host: [nic, ...]}}, "
                            f"links: [[a, b], ...]): {e}") from None


def from_spec(spec: dict[str, Any]) -> nx.MultiGraph:
    """A topology from the mapping a YAML or JSON topology file holds."""
    g = nx.MultiGraph()
    g.add_nodes_from((str(s) for s in spec.get("switches") or []), kind="switch")
    host_spec = spec.get("hosts") or {}
    if isinstance(host_spec, list):
        host_spec = {h: None for h in host_spec}
    for host, nics in host_spec.items():
        host = str(host)
        g.add_node(host, kind="host")
        for nic in nics if nics else ["nic0"]:
            g.add_node(f"{host}/{nic}", kind="nic")
            _add_link(g, host, f"{host}/{nic}")
    for link in spec.get("links") or []:
        if isinstance(link, dict):
            a, b = link.get("a"), link.get("b")
            ports, name = (link.get("a_port"), link.get("b_port")), link.get("name")
        elif isinstance(link, (list, tuple)) and len(link) == 2:
            (a, b), ports, name = link, (None, None), None
        else:
            raise TopologyError(f"a link is [a, b] or a mapping with a and b, not {link!r}")
        _add_link(g, _endpoint(g, a), _endpoint(g, b), *ports, name=name)
    return validate(g)


def _endpoint(g: nx.MultiGraph, name: Any) -> str:
    name = str(name)
    if name not in g:
        raise TopologyError(f"link end {name!r} is no switch, host or host/nic")
    if g.nodes[name]["kind"] == "host":
        nics = [n for n in g[name] if g.nodes[n]["kind"] == "nic"]
        if len(nics) != 1:
            raise TopologyError(f"host {name} has {len(nics)} NICs: name the NIC (host/nic) in its links")
        return nics[0]
    return name


# --- ibnetdiscover -----------------------------------------------------------------------------

_NODE_LINE = re.compile(r'^(Switch|Ca|Rt)\s+(\d+)\s+"([SHR]-[0-9a-fA-Fx]+)"\s*(?:#\s*"([^"]*)")?')
_PORT_LINE = re.compile(r'^\[(\d+)\](?:\([0-9a-fA-Fx]+\))?\s+"([SHR]-[0-9a-fA-Fx]+)"\[(\d+)\]')


def _looks_like_ibnetdiscover(text: str) -> bool:
    return any(_NODE_LINE.match(line) for line in text.splitlines()[:200])


def parse_ibnetdiscover(text: str) -> nx.MultiGraph:
    """A topology from the text ``ibnetdiscover`` prints (see the module docstring).

    Each cable is listed from both of its ends; it becomes one link. Routers (``Rt``) are
    taken as switches.
    """
    nodes: dict[str, tuple[str, str]] = {}  # guid -> (kind, description)
    cables: dict[tuple, tuple] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        node = _NODE_LINE.match(line)
        if node:
            kind, _, current, description = node.groups()
            nodes[current] = ("nic" if kind == "Ca" else "switch", (description or "").strip())
            continue
        port = _PORT_LINE.match(line)
        if port and current is not None:
            ends = sorted([(current, int(port.group(1))), (port.group(2), int(port.group(3)))])
            cables[tuple(ends)] = tuple(ends)
    if not nodes:
        raise TopologyError("no Switch or Ca block found in the ibnetdiscover output")
    names = _ib_names(nodes)
    g = nx.MultiGraph()
    for guid, (kind, _) in nodes.items():
        g.add_node(names[guid], kind=kind, guid=guid)
        if kind == "nic":
            host = names[guid].rsplit("/", 1)[0]
            g.add_node(host, kind="host")
            _add_link(g, host, names[guid])
    for (a, a_port), (b, b_port) in sorted(cables.values()):
        if a not in names or b not in names:
            missing = a if a not in names else b
            raise TopologyError(f"a cable leads to {missing}, which has no block of its own")
        _add_link(g, names[a], names[b], a_port, b_port)
    return validate(g)


def _ib_names(nodes: dict[str, tuple[str, str]]) -> dict[str, str]:
    """Node names: descriptions where unique, else GUIDs; CAs as ``host/nic``."""
    switch_descriptions = Counter(d for kind, d in nodes.values() if kind == "switch" and d)
    nic_names = {}
    for guid, (kind, description) in nodes.items():
        if kind == "nic":
            host, _, nic = description.partition(" ")
            nic_names[guid] = f"{host}/{nic.strip() or 'nic0'}" if host else ""
    nic_counts = Counter(nic_names.values())
    names = {}
    for guid, (kind, description) in nodes.items():
        if kind == "switch":
            names[guid] = description if switch_descriptions.get(description) == 1 else guid
        else:
            names[guid] = nic_names[guid] if nic_names[guid] and nic_counts[nic_names[guid]] == 1 else f"{guid}/nic0"
    return names


# --- fat trees ---------------------------------------------------------------------------------


def fat_tree(n_hosts: int, radix: int = 32) -> nx.MultiGraph:
    """A k-ary fat tree of switches with ``radix`` ports, populated with ``n_hosts`` hosts of one NIC.

    Up to ``radix**2 / 2`` hosts: two levels (``leaf*`` and ``spine*``; every leaf has
    ``radix/2`` hosts and one cable to each of the ``radix/2`` spines). Beyond, up to
    ``radix**3 / 4``: three levels, pods of ``radix/2`` ToRs (``tor<pod>.<i>``) and aggregation
    switches (``agg<pod>.<j>``), every ToR cabled to every aggregation switch of its pod, and
    ``(radix/2)**2`` core switches (``core<j>.<c>``, aggregation switch ``j`` of each pod to
    cores ``j.*``). Only the pods and ToRs needed are built, the last ToR possibly partly filled.
    Hosts are ``h<i>`` (zero-padded), NICs ``h<i>/nic0``.
    """
    if radix < 4 or radix % 2:
        raise TopologyError(f"the switch radix must be an even number >= 4, not {radix}")
    half = radix // 2
    if not 2 <= n_hosts <= half * radix * half:
        raise TopologyError(f"a fat tree of radix {radix} holds 2 to {half * radix * half} hosts, not {n_hosts}")
    g = nx.MultiGraph()
    width = len(str(n_hosts - 1))
    n_edge = math.ceil(n_hosts / half)
    two_level = n_hosts <= half * radix
    edges = [f"leaf{i}" for i in range(n_edge)] if two_level else \
        [f"tor{i // half}.{i % half}" for i in range(n_edge)]
    g.add_nodes_from(edges, kind="switch")
    for i in range(n_hosts):
        host, nic, edge = f"h{i:0{width}d}", f"h{i:0{width}d}/nic0", edges[i // half]
        g.add_node(host, kind="host")
        g.add_node(nic, kind="nic")
        _add_link(g, host, nic)
        _add_link(g, nic, edge, 1, i % half + 1)
    if two_level:
        spines = [f"spine{j}" for j in range(half)]
        g.add_nodes_from(spines, kind="switch")
        for i, leaf in enumerate(edges):
            for j, spine in enumerate(spines):
                _add_link(g, leaf, spine, half + j + 1, i + 1)
        return g
    pods = math.ceil(n_edge / half)
    cores = [[f"core{j}.{c}" for c in range(half)] for j in range(half)]
    g.add_nodes_from(itertools.chain(*cores), kind="switch")
    for pod in range(pods):
        aggs = [f"agg{pod}.{j}" for j in range(half)]
        g.add_nodes_from(aggs, kind="switch")
        for i, tor in enumerate(edges[pod * half:(pod + 1) * half]):
            for j, agg in enumerate(aggs):
                _add_link(g, tor, agg, half + j + 1, i + 1)
        for j, agg in enumerate(aggs):
            for c, core in enumerate(cores[j]):
                _add_link(g, agg, core, half + c + 1, pod + 1)
    return g


# --- access -------------------------------------------------------------------------------------


def edge_switch(topology: nx.MultiGraph, nic: str) -> str:
    """The switch a NIC is cabled to (the first by name)."""
    return min(n for n in topology[nic] if topology.nodes[n]["kind"] == "switch")


def pods(topology: nx.MultiGraph) -> dict[str, str]:
    """Each edge switch's pod, named by its first edge switch: edge switches cabled to the same
    switches above them (a fat tree's pod; all leaves of a leaf-spine fabric)."""
    edges = {s for n, kind in topology.nodes(data="kind") if kind == "nic" for s in topology[n]
             if topology.nodes[s]["kind"] == "switch"}
    above = {e: frozenset(n for n in topology[e] if topology.nodes[n]["kind"] == "switch" and n not in edges)
             for e in edges}
    first: dict[frozenset[str], str] = {}
    for e in sorted(edges, key=_natural):
        first.setdefault(above[e], e)
    return {e: first[above[e]] for e in edges}


def probe_tiers(topology: nx.MultiGraph, names: list[str]) -> list[dict[str, str]]:
    """Each host's edge switch and each host's pod: the groups a probe schedule keeps probes
    of a round apart by (:func:`dpro.anomaly.fabric.schedule.probe_rounds`)."""
    edges = {h: edge_switch(topology, host_nic(topology, h)) for h in names}
    pod = pods(topology)
    return [edges, {h: pod[e] for h, e in edges.items()}]


def access_links(topology: nx.MultiGraph, host: str, nic: str) -> list[str]:
    """The host's two access links: host--NIC and NIC--switch (the first such cable by name)."""
    switch = edge_switch(topology, nic)
    return [min(d["name"] for d in topology.get_edge_data(host, nic).values()),
            min(d["name"] for d in topology.get_edge_data(nic, switch).values())]
