"""``mopd``, the console script: ``mopd agents|algos|benchmarks ...`` is ``python -m
agents|algos|benchmarks ...``, and anything else (``mopd step``, ``mopd data ...``) is
``python -m envs ...``. It lives on the top floor because it imports every package."""

from __future__ import annotations

import sys

PACKAGES = ("agents", "algos", "benchmarks")
"""The packages ``mopd <package> ...`` dispatches to (``envs`` is the default)."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    if command == "agents":
        from agents.__main__ import main as run
    elif command == "algos":
        from algos.__main__ import main as run
    elif command == "benchmarks":
        from benchmarks.__main__ import main as run
    else:
        from envs.__main__ import main as envs_main

        return envs_main(rest if command == "envs" else argv, packages=PACKAGES)
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
