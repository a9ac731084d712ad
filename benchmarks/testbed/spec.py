"""Emulated-device jobs drawn from a seed (:class:`JobSpec`), run by :mod:`benchmarks.testbed.job`.

A job is a stack of layers, each with a parameter count and a forward time made of a fixed part
and a part per sample (so gradient accumulation changes it in a known way); the backward takes
``backward_ratio`` times the forward. Some jobs have a large first layer (an embedding) or a
large last one (a head), so DDP's buckets come out uneven.

    >>> spec = draw_job(7)
    >>> spec.batch, len(spec.layers) >= 4
    (8, True)
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field

__all__ = ["JobSpec", "Layer", "draw_job"]

BATCH = 8  # divisible by every accumulation the benchmarks use (1, 2, 4)
COLUMNS = 64  # each layer's weight is a (params / COLUMNS) x COLUMNS matrix (job.py's COLUMNS, which runs alone)


@dataclass(frozen=True)
class Layer:
    params: int  # float32 parameters
    forward_fixed_us: float
    forward_per_sample_us: float


@dataclass(frozen=True)
class JobSpec:
    seed: int
    layers: tuple[Layer, ...]
    backward_ratio: float
    batch: int = BATCH
    shape: str = field(default="even")  # even | embedding | head: where a large layer sits

    @property
    def grad_bytes(self) -> int:
        return 4 * sum(layer.params for layer in self.layers)

    @property
    def compute_ms(self) -> float:
        """One step's held time (forward and backward, the whole batch)."""
        forward = sum(l.forward_fixed_us + l.forward_per_sample_us * self.batch for l in self.layers)
        return forward * (1 + self.backward_ratio) / 1e3

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def describe(self) -> str:
        return (f"seed {self.seed}: {len(self.layers)} layers ({self.shape}), {self.grad_bytes / 2**20:.1f} MiB of "
                f"gradients, {self.compute_ms:.0f} ms held a step, backward {self.backward_ratio:.1f}x forward")


def draw_job(seed: int, *, compute_ms: tuple[float, float] = (60, 140),
             grad_mib: tuple[float, float] = (2.0, 6.0)) -> JobSpec:
    """A job drawn from ``seed``: 4-10 layers, a step's held time within ``compute_ms``, its
    gradients within ``grad_mib``; a third of the jobs even, a third with a large first layer, a
    third with a large last layer; 20-60% of each layer's forward time scales with the batch."""
    rng = random.Random(seed)
    n = rng.randint(4, 10)
    shape = rng.choice(("even", "embedding", "head"))
    weights = [rng.uniform(0.5, 1.5) for _ in range(n)]
    if shape != "even":
        weights[0 if shape == "embedding" else -1] *= rng.uniform(4, 8)
    total_params = rng.uniform(*grad_mib) * 2**20 / 4
    params = [max(1024, int(total_params * w / sum(weights))) for w in weights]
    backward_ratio = rng.uniform(1.5, 2.5)
    forward_us = rng.uniform(*compute_ms) * 1e3 / (1 + backward_ratio)
    shares = [rng.uniform(0.5, 1.5) for _ in range(n)]
    layers = []
    for p, s in zip(params, shares):
        t = forward_us * s / sum(shares)
        per_sample = rng.uniform(0.2, 0.6)
        layers.append(Layer(p, round(t * (1 - per_sample), 1), round(t * per_sample / BATCH, 1)))
    return JobSpec(seed, tuple(layers), round(backward_ratio, 2), shape=shape)
