"""The old name of :mod:`algos.engine.distributed` (``tests/test_plan.py`` reads it): the same module."""

import sys

from algos.engine import distributed

sys.modules[__name__] = distributed
