"""Helpers for dpro's own tests and benchmarks: a mini-cluster of network namespaces on one machine."""
