import sys

from benchmarks import table2

for _old in ("ablate", "table2_stats", "table2_archive"):  # modules that became the package benchmarks.table2
    sys.modules[f"{__name__}.{_old}"] = globals()[_old] = table2
