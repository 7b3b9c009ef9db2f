"""How one update runs on 1..K processes, below the method: :mod:`~algos.engine.update` (chunks,
one ``Totals`` per minibatch, all-or-nothing rollback), :mod:`~algos.engine.distributed` (``Dist``,
the ``Replicated`` / ``Sharded`` layouts), ``precision``, ``freeze``, ``checkpoint``. It runs rows
and knows no roles, trainer or recipe: of ``algos`` it imports only ``losses`` and ``batch``."""
