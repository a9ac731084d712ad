"""Search of optimization strategies with the replayer as cost model (``dpro optimize``).

Each pass (:mod:`dpro.optimizer.passes`) proposes settings of one kind; :mod:`.search` combines
them, predicts every combination with the cost model (:func:`dpro.analysis.whatif.predict`) and
ranks them; a :class:`~dpro.optimizer.strategy.Strategy` says what to change, in code and as
settings ``dpro record --apply`` sets at run time.
"""
