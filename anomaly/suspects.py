"""What the localization suspects, most likely first, and the API that gathers every source.

Each :class:`Suspect` names a component (``rank``, ``host``, ``gpu``, ``nic``, ``link``, ``switch``;
or ``path``, the probes between two hosts, when no topology is given to resolve it into links)
with a ``score``: how far it stands out from the noise as a robust z-score (for the fabric's
localizer, the pooled or counted ``z`` of the probes that may cross it). :func:`to_json` gives::

    {"suspects": [{"kind": "nic", "name": "h17/nic0", "rank": null, "host": "h17",
                   "score": 41.2, "evidence": {...}}, ...]}

most likely first; the list is empty when nothing stands out. :mod:`dpro.anomaly.diagnose` gathers
them from every source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["KINDS", "Suspect", "strongest", "to_json"]

KINDS = ("rank", "host", "gpu", "nic", "link", "switch", "path")


@dataclass(frozen=True)
class Suspect:
    """A component that may be at fault, with how strongly (``score``) and why (``evidence``)."""

    kind: str
    name: str
    score: float
    rank: int | None = None
    host: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"suspect kind {self.kind!r} is not one of {KINDS}")


def to_json(suspects: list[Suspect]) -> dict[str, list[dict[str, Any]]]:
    """``{"suspects": [...]}``, most likely (highest score) first."""
    ordered = sorted(suspects, key=lambda s: -s.score)
    return {"suspects": [{"kind": s.kind, "name": s.name, "rank": s.rank, "host": s.host,
                          "score": round(float(s.score), 3), "evidence": s.evidence} for s in ordered]}


def strongest(suspects: list[Suspect]) -> list[Suspect]:
    """One suspect per (kind, name), the highest score, most likely first."""
    best: dict[tuple[str, str], Suspect] = {}
    for s in suspects:
        key = (s.kind, s.name)
        if key not in best or s.score > best[key].score:
            best[key] = s
    return sorted(best.values(), key=lambda s: -s.score)
