"""Example training jobs used by ``dpro demo``, the tests and the benchmarks."""
