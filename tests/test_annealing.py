"""The shared annealing walk (:mod:`dpro.annealing`): Metropolis acceptance, stops, restarts,
states with no energy, and a seed that repeats a walk."""

from __future__ import annotations

import math
import random

import pytest

from dpro.annealing import Ending, Landscape, Visit, anneal, metropolis


class Line(Landscape[int]):
    """The integers 0 to ``size - 1``, a move one step left or right; stops after ``visits``
    visits. Energies: ``energies[x]`` (None: no value), default ``(x - 13)²``."""

    def __init__(self, size: int = 30, visits: int = 200, energies: dict[int, float | None] | None = None,
                 temperature: float = 1.0) -> None:
        self.size, self.visits, self.hot = size, visits, temperature
        self.energies = energies if energies is not None else {x: float((x - 13) ** 2) for x in range(size)}
        self.seen: set[int] = set()
        self.path: list[int] = []  # every visit
        self.starts = 0
        self.taken: list[int] = []  # every state the walk took

    def stop(self) -> bool:
        return len(self.path) >= self.visits

    def start(self, rng: random.Random) -> int | None:
        self.starts += 1
        return rng.randrange(self.size)

    def neighbour(self, state: int, rng: random.Random) -> int | None:
        return min(max(state + rng.choice((-1, 1)), 0), self.size - 1)

    def visit(self, state: int, position: int | None) -> Visit:
        self.path.append(state)
        new = state not in self.seen
        self.seen.add(state)
        return Visit.NEW if new else Visit.SEEN

    def energy(self, state: int) -> float | None:
        return self.energies[state]

    def temperature(self, moves: int) -> float:
        return max(self.hot * 0.9 ** moves, 1e-6)

    def weighed(self, state: int, accepted: bool) -> None:
        if accepted:
            self.taken.append(state)


def test_it_finds_the_minimum_and_settles_there() -> None:
    line = Line()
    assert anneal(line, random.Random(0), restart_after=1000, position=0) is Ending.STOPPED
    assert line.taken[-1] == 13 and set(line.path[-20:]) == {12, 14}  # cold: it stays at the minimum


def test_the_stop_condition_ends_the_walk() -> None:
    line = Line(visits=7)
    assert anneal(line, random.Random(1), restart_after=1000) is Ending.STOPPED
    assert len(line.path) == 7


def test_a_walk_that_finds_nothing_new_restarts_then_gives_up() -> None:
    line = Line(size=1, visits=10_000)  # one state: every proposal after the first finds nothing new
    assert anneal(line, random.Random(2), restart_after=10, give_up_after=35) is Ending.IDLE
    assert line.starts == 1 + 3  # the first start, then after 10, 20 and 30 idle proposals
    assert len(line.path) == 1 + 35


def test_a_visit_may_ask_for_a_restart() -> None:
    class Goal(Line):
        def visit(self, state: int, position: int | None) -> Visit:
            seen = super().visit(state, position)
            return Visit.RESTART if state == 13 else seen

    line = Goal(visits=300)
    anneal(line, random.Random(3), restart_after=1000)
    assert 13 in line.path and 13 not in line.taken
    assert line.starts == 1 + line.path[:-1].count(13)  # a start after each visit to 13 (but a last)


def test_skipped_states_are_not_weighed() -> None:
    class Skipping(Line):
        def visit(self, state: int, position: int | None) -> Visit:
            super().visit(state, position)
            return Visit.SKIPPED if state % 2 else Visit.NEW

    line = Skipping()
    anneal(line, random.Random(4), restart_after=1000, position=0)
    assert any(x % 2 for x in line.path) and not any(x % 2 for x in line.taken)


def test_nowhere_to_move_ends_the_walk() -> None:
    class Dead(Line):
        def neighbour(self, state: int, rng: random.Random) -> int | None:
            return None

    line = Dead()
    assert anneal(line, random.Random(5), restart_after=1000) is Ending.NOWHERE
    assert len(line.path) == 1


def test_states_with_no_energy_are_not_taken_from_states_with_one() -> None:
    energies: dict[int, float | None] = {x: None if x % 3 == 0 else float(-x) for x in range(30)}
    line = Line(energies=energies, visits=500, temperature=1e6)  # hot: any uphill move with a value is taken
    anneal(line, random.Random(6), restart_after=1000, position=1)
    assert any(x % 3 == 0 for x in line.path)
    assert not any(x % 3 == 0 for x in line.taken)


def test_metropolis() -> None:
    rng = random.Random(7)
    assert metropolis(2.0, 1.0, 1e-9, rng) and metropolis(2.0, 2.0, 1e-9, rng)  # downhill, level
    assert not metropolis(1.0, 2.0, 1e-9, rng)  # uphill, cold
    assert metropolis(None, 5.0, 1e-9, rng) and metropolis(None, None, 1.0, rng)
    assert not metropolis(1.0, None, 1e9, rng)
    taken = sum(metropolis(0.0, 1.0, 1.0, rng) for _ in range(20_000)) / 20_000
    assert taken == pytest.approx(math.exp(-1), abs=0.01)


def test_the_same_seed_walks_the_same_way() -> None:
    def walk(seed: int) -> list[int]:
        line = Line(visits=100, temperature=20.0)
        anneal(line, random.Random(seed), restart_after=5)
        return line.path

    assert walk(8) == walk(8) and walk(8) != walk(9)
