"""A latency histogram with 2 %-wide logarithmic buckets, mergeable across threads and processes."""

from __future__ import annotations

import math
from typing import Any

RATIO = 1.02  # bucket width: percentiles are within 1 % of the true value
PERCENTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99, "p99.9": 0.999}


class LatencyHistogram:
    """Counts of latencies (ns) per bucket ``floor(log(ns) / log(RATIO))``, and the exact maximum."""

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.max_ns = 0

    @property
    def count(self) -> int:
        return sum(self.buckets.values())

    def add(self, ns: int) -> None:
        """Count one latency of ``ns`` nanoseconds."""
        b = int(math.log(max(ns, 1)) / math.log(RATIO))
        self.buckets[b] = self.buckets.get(b, 0) + 1
        self.max_ns = max(self.max_ns, ns)

    def merge(self, other: LatencyHistogram) -> None:
        """Add ``other``'s counts to this histogram."""
        for b, n in other.buckets.items():
            self.buckets[b] = self.buckets.get(b, 0) + n
        self.max_ns = max(self.max_ns, other.max_ns)

    def percentiles_us(self) -> dict[str, float]:
        """``p50``, ``p90``, ``p99``, ``p99.9`` (bucket middles) and ``max``, in µs; empty when no sample."""
        total = self.count
        if not total:
            return {}
        out, seen, items = {}, 0, sorted(self.buckets.items())
        targets = iter(sorted(PERCENTILES.items(), key=lambda kv: kv[1]))
        name, q = next(targets)
        for b, n in items:
            seen += n
            while seen >= q * total:
                out[name] = min(RATIO ** (b + 0.5), self.max_ns) / 1000
                nxt = next(targets, None)
                if nxt is None:
                    return {**out, "max": self.max_ns / 1000}
                name, q = nxt
        return {**out, "max": self.max_ns / 1000}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form; :meth:`from_dict` reads it back."""
        return {"buckets": {str(b): n for b, n in self.buckets.items()}, "max_ns": self.max_ns}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LatencyHistogram:
        h = cls()
        h.buckets = {int(b): n for b, n in d["buckets"].items()}
        h.max_ns = d["max_ns"]
        return h
