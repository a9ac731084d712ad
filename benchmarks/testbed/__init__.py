"""The quiet testbed (benchmarks and tests only, never installed): emulated-device jobs
(:mod:`~benchmarks.testbed.spec`, :mod:`~benchmarks.testbed.job`), namespace hosts with shaped
links and the interleaved measuring protocol (:mod:`~benchmarks.testbed.protocol`), the frozen
model (:mod:`~benchmarks.testbed.frozen`); ``python -m benchmarks testbed`` prints its noise
floor (:mod:`~benchmarks.testbed.noise`)."""


def run(quick: bool = False) -> list[dict]:
    """The noise-floor benchmark (:func:`benchmarks.testbed.noise.run`)."""
    from benchmarks.testbed.noise import run as noise

    return noise(quick)
