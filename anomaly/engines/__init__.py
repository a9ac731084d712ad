"""Traffic engines behind one interface (:mod:`dpro.anomaly.engines.base`): TCP anywhere,
perftest (``ib_*_bw``) and pyverbs where RDMA hardware exists."""

from __future__ import annotations

from dpro.anomaly.engines.base import Engine
from dpro.anomaly.engines.perftest import PerftestEngine
from dpro.anomaly.engines.tcp import TcpEngine
from dpro.anomaly.engines.verbs import VerbsEngine

ENGINES: dict[str, Engine] = {"tcp": TcpEngine(), "perftest": PerftestEngine(), "verbs": VerbsEngine()}


def get_engine(name: str) -> Engine:
    """The engine called ``name``; KeyError naming the known ones otherwise."""
    try:
        return ENGINES[name]
    except KeyError:
        raise KeyError(f"no engine {name!r}; known: {', '.join(ENGINES)}") from None
