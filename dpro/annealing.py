"""A simulated-annealing walk over a discrete space, shared by the optimizer's strategy search
and the anomaly search.

The caller describes the space as a :class:`Landscape`: where a walk starts, a move from a
state, what visiting a state costs and teaches (a prediction, a measurement), the energy to
lower, the temperature, and when to stop. :func:`anneal` walks it: each step proposes a move
(or a fresh start), visits it, and takes it by the Metropolis rule (:func:`metropolis`): always
downhill or level, uphill by ``Δ`` with probability ``exp(-Δ / T)``. An energy may be None (no
value: the prediction failed, the run measured nothing); such a state is taken only by a walk
whose own state has no value either. A walk that keeps proposing states seen before restarts
from a fresh start, and gives up after a longer while; a visit may also ask for a restart.

scipy's ``dual_annealing`` anneals continuous, bounded vectors, with no discrete moves, no
missing energies and no restarts the caller controls; hence this short walk. The walk draws
its randomness from the ``rng`` it is given only, so a seed repeats a walk.
"""

from __future__ import annotations

import math
import random
from enum import Enum
from typing import Protocol, TypeVar

__all__ = ["Ending", "Landscape", "Visit", "anneal", "metropolis"]

State = TypeVar("State")


class Visit(Enum):
    """What a visit to a state found (:meth:`Landscape.visit`)."""

    NEW = "new"  # evaluated for the first time: the move is weighed, and the walk is not idle
    SEEN = "seen"  # evaluated before: the move is weighed, and the walk idles
    SKIPPED = "skipped"  # nothing to learn there: the move is not weighed, and the walk idles
    RESTART = "restart"  # the walk starts afresh after it (it found what it looks for): not weighed


class Ending(Enum):
    """Why :func:`anneal` returned."""

    STOPPED = "stopped"  # the landscape said stop (:meth:`Landscape.stop`)
    IDLE = "idle"  # ``give_up_after`` proposals in a row found nothing new
    NOWHERE = "nowhere"  # no state to start from or to move to


class Landscape(Protocol[State]):
    """The discrete space a walk explores, and when to stop exploring it (subclass it to keep
    the default :meth:`weighed`)."""

    def stop(self) -> bool:
        """Whether the walk ends now (a budget spent, the space covered)."""

    def start(self, rng: random.Random) -> State | None:
        """Where a walk starts or restarts; None when there is nowhere."""

    def neighbour(self, state: State, rng: random.Random) -> State | None:
        """A move from ``state``; None when there is none."""

    def visit(self, state: State, position: State | None) -> Visit:
        """Go to ``state`` from the walk's ``position`` (None on a start): evaluate it if new."""

    def energy(self, state: State) -> float | None:
        """The energy of a visited ``state`` now, lower is better; None when it has no value."""

    def temperature(self, moves: int) -> float:
        """The temperature after ``moves`` moves since the walk last started (positive)."""

    def weighed(self, state: State, accepted: bool) -> None:
        """The walk took ``state`` (``accepted``) or stayed where it was; by default nothing to do."""


def metropolis(old: float | None, new: float | None, temperature: float, rng: random.Random) -> bool:
    """Whether a walk at energy ``old`` moves to energy ``new``: always downhill or level, uphill
    by ``Δ`` with probability ``exp(-Δ / temperature)``; a state with no value (None) is taken only
    from one with none, and any state with a value is taken from one with none."""
    if new is None:
        return old is None
    if old is None or new <= old:
        return True
    return rng.random() < math.exp((old - new) / temperature)


def anneal(landscape: Landscape[State], rng: random.Random, *, restart_after: int,
           give_up_after: int | None = None, position: State | None = None) -> Ending:
    """Walk ``landscape`` from ``position`` (default: a start) until it says stop, restarting after
    every ``restart_after`` proposals in a row that found nothing new (:attr:`Visit.SEEN`,
    :attr:`Visit.SKIPPED`) and giving up after ``give_up_after`` such proposals."""
    idle = moves = 0
    while not landscape.stop():
        if give_up_after is not None and idle >= give_up_after:
            return Ending.IDLE
        if idle and idle % restart_after == 0:
            position = None
        starting = position is None
        candidate = landscape.start(rng) if position is None else landscape.neighbour(position, rng)
        if candidate is None:
            return Ending.NOWHERE
        visit = landscape.visit(candidate, position)
        idle = idle + 1 if visit in (Visit.SEEN, Visit.SKIPPED) else 0
        if visit is Visit.RESTART:
            position = None
        elif visit is not Visit.SKIPPED:
            accepted = position is None or metropolis(
                landscape.energy(position), landscape.energy(candidate), landscape.temperature(moves), rng)
            landscape.weighed(candidate, accepted)
            if accepted:
                position = candidate
        moves = 0 if starting else moves + 1
    return Ending.STOPPED
