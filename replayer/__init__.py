"""Discrete-event replay of the global dataflow graph."""
