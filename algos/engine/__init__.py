"""How one update runs on 1..K processes, below the method: :mod:`~algos.engine.update` (chunks,
one ``Totals`` per minibatch, all-or-nothing rollback), :mod:`~algos.engine.distributed` (the
process group ``Dist``, the ``Replicated`` / ``Sharded`` layouts), :mod:`~algos.engine.freeze`
(declared frozen parameters). It runs rows and knows no roles, no trainer and no recipe:
of ``algos`` it imports only ``losses`` and ``batch`` (``tests/test_layering.py``)."""
