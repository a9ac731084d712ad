"""Print this host's counter snapshot as JSON: what the traffic engines run on each endpoint.

``python -m dpro.collectors.counters [--netdev IF]... [--address IP] [--rdma DEV]... [--all-rdma] [--ethtool IF]... [--gpu]``

Run behind an endpoint's command prefix (``ip netns exec h1 ...``), it reads that host's (or
namespace's) sysfs. ``--address`` adds the interface holding that IPv4 address.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import socket
import struct

from dpro.collectors.counters.snapshot import take_snapshot

SIOCGIFADDR = 0x8915


def interface_for_address(address: str) -> str | None:
    """The interface whose (primary) IPv4 address is ``address``, None when none has it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dpro.collectors.counters", description=__doc__.splitlines()[0])
    parser.add_argument("--netdev", action="append", default=[], help="interface whose statistics to read")
    parser.add_argument("--address", help="also read the interface holding this IPv4 address")
    parser.add_argument("--rdma", action="append", default=[], help="RDMA device whose ports to read")
    parser.add_argument("--all-rdma", action="store_true", help="read every RDMA device's ports")
    parser.add_argument("--ethtool", action="append", default=[], help="interface to run ethtool -S on")
    parser.add_argument("--gpu", action="store_true", help="read NVML GPU counters")
    args = parser.parse_args(argv)
    netdev, notes = list(args.netdev), []
    if args.address:
        found = interface_for_address(args.address)
        if found is None:
            notes.append(f"no interface holds {args.address}: its netdev counters are not read")
        elif found not in netdev:
            netdev.append(found)
    snap = take_snapshot(rdma=None if args.all_rdma else args.rdma, netdev=netdev, ethtool=args.ethtool, gpu=args.gpu)
    snap.notes[:0] = notes
    print(json.dumps(snap.to_dict()))


if __name__ == "__main__":
    main()
