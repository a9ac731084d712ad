"""Search of optimization strategies with the replayer as cost model."""
