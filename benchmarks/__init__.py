"""dpro's benchmarks: ``python -m benchmarks [--quick]`` runs them all and prints one table."""
