"""The paper's Table 2, one job a module: :mod:`.runs` plans the ablation's runs, :mod:`.ablate`
trains them, :mod:`.table` reads the finished ones into the table, :mod:`.stats` compares the
variants, :mod:`.render` writes ``table2.md`` and the curves, :mod:`.archive` the per-question
archives (restore, publish), :mod:`.cli` the commands ``ablate`` and ``table2``.

The names of the modules it replaced (``benchmarks.table2``, and ``benchmarks.ablate``,
``.table2_stats``, ``.table2_archive`` by ``benchmarks/__init__.py``) are found here, each in
the module that holds it now, imported on first use (importing one module loads no other)."""

from importlib import import_module
from typing import Any

MODULES = ("table", "render", "cli", "runs", "stats", "archive", "ablate")


def __getattr__(name: str) -> Any:
    for module in () if name.startswith("__") else MODULES:
        if name in (found := vars(import_module(f"{__name__}.{module}"))):
            return found[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
