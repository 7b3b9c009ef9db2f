"""The paper's Table 2: the Searcher-signal ablation's runs and its table, one job a module.

- :mod:`.table`: the table read from an ablation's finished runs (``table2.json``);
- :mod:`.stats`: its comparisons with ``opd`` and their multiplicity;
- :mod:`.archive`: the archives of its per-question records (restore, publish);
- :mod:`.ablate`: the ablation's runs, scheduled and trained (``python -m benchmarks ablate``).

The modules this package replaced keep their names (``benchmarks/__init__.py``): a name any
of them offered is found here, in the module that holds it now (:func:`__getattr__`).
"""

from importlib import import_module
from typing import Any

MODULES = ("table", "stats", "archive", "ablate")


def __getattr__(name: str) -> Any:
    """``name`` from the first of :data:`MODULES` that holds it, each imported on first use
    (so importing one module of the package loads no other)."""
    for module in () if name.startswith("__") else MODULES:
        if name in (found := vars(import_module(f"{__name__}.{module}"))):
            return found[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
