"""Per-rank traces to tables and to one global dataflow graph."""
