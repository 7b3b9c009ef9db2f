"""The paper's Table 2, one job a module (docs/layout.md). The names of the modules it replaced
(``benchmarks.ablate``, ``.table2_stats``, ``.table2_archive``: ``benchmarks/__init__.py``) are
found here, in the module that holds each now, imported on first use."""

from importlib import import_module
from typing import Any

MODULES = ("table", "render", "cli", "runs", "stats", "archive", "ablate")


def __getattr__(name: str) -> Any:
    for module in () if name.startswith("__") else MODULES:
        if name in (found := vars(import_module(f"{__name__}.{module}"))):
            return found[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
