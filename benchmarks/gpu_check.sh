#!/usr/bin/env bash
# The scale-out GPU check (issue 28.8): the tiny preset's Stage II end to end on one CUDA GPU
# with the HF and then the vLLM rollout backend (vLLM only where it imports), bf16 compute
# over float32 weights; prints generated tokens/s per second of rollout + weight sync for
# both, the end-to-end step-time ratio, the step split and peak memory, and writes
# runs/gpu_check/gpu_check.json after each backend. No downloads, no package index: on a
# bare GPU machine, from the checkout's root,
#   pip install --no-index --find-links WHEELS faiss-cpu fastapi uvicorn   # whatever it names as missing
#   bash benchmarks/gpu_check.sh        # = timeout 480 python -m benchmarks.gpu_check --steps 3
# It first names each missing piece (module and wheel, or no visible GPU) in one line and stops.
# BACKENDS=hf,vllm (the default) picks the backends, STEPS and OUT the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
timeout 480 python -m benchmarks.gpu_check --steps "${STEPS:-3}" --backends "${BACKENDS:-hf,vllm}" \
  --out "${OUT:-runs/gpu_check}"
