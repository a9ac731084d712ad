"""Which hosts lost more of their CPUs to the hypervisor than the others (steal time).

A host's *stolen share* is the share of the CPU time its CPUs wanted that the hypervisor ran
something else in (:func:`dpro.collectors.counters.procstat.steal_share`). A host stands out
where its share is at least :data:`STEAL_SHARE` (in points) above the median of the other
hosts' (against none on a host alone): hosts that share one machine, or a cluster contended all
over, stand out from nothing. ``dpro diagnose`` names such a host in a run, ``dpro health`` in
its check.

    >>> stolen_hosts({"a": 0.31, "b": 0.02, "c": 0.03})
    {'a': 0.025}
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["STEAL_SHARE", "stolen_hosts"]

STEAL_SHARE = 0.1
"""How much more of the CPU time a host's CPUs wanted the hypervisor must have taken there than on
the other hosts: 10 percentage points (the 2-vCPU VM this was built on lost 0.2-47% of two busy
loops' CPU time, by the hour, and up to 36% of whole runs of the testbed's jobs, which then ran
their steps 1.2-3.2x slower; 2026-11-29). On a host alone, against none: a tenth of its CPU."""


def stolen_hosts(shares: Mapping[str, float]) -> dict[str, float]:
    """Each host whose stolen share stands out (module docstring), with the other hosts' median
    share it stands out from (0 on a host alone)."""
    out = {}
    for host, share in shares.items():
        others = [v for h, v in shares.items() if h != host]
        usual = float(np.median(others)) if others else 0.0
        if share - usual >= STEAL_SHARE - 1e-9:  # at least: 0.12 - 0.02 is 0.0999... in floats
            out[host] = usual
    return out
