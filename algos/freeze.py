"""The old name of :mod:`algos.engine.freeze`, for the recipes that import it by it: the same module."""

import sys

from algos.engine import freeze

sys.modules[__name__] = freeze
