#!/usr/bin/env bash
# The day a GPU machine is at hand (issue 42.6): one call, at most 8 minutes on one H200 from a bare
# machine (Python 3.12, torch with CUDA, transformers 5.17, no vLLM, no network), at most 64 MiB sent.
#
#   bash benchmarks/gpu_day.sh prepare   # HERE, once: wheels into .gpu/ (git-ignored), size checked
#   bash benchmarks/gpu_day.sh run       # THERE, from the repository root, with .gpu carried
#
# run does, each step under its own timeout (30 + 200 + 130 + 110 s), logs and JSON into $OUT (or out/):
#   1. installs the carried wheels with --no-index --no-deps into .site (nothing from the network);
#   2. python -m benchmarks.gpu_check --backends hf: its preflight names anything still missing,
#      then the tiny preset's Stage II on CUDA (HF rollouts, bf16 autocast over float32, TF32,
#      the chunked head, Teacher scoring, fused AdamW);
#   3. a one-rank torchrun of tiny with FSDP2 (MixedPrecisionPolicy bf16/fp32), activation
#      checkpointing, the boolean logits_to_keep path (transformers from constraints.txt), NCCL,
#      a validation and the gathered optimizer save;
#   4. python -m benchmarks.gpu_probe: a Qwen3-4B-shaped update with random weights, its measured
#      backward and optimizer-step peaks printed beside the plan's, fused (the trainer's) and then
#      foreach (review N1: the step's temporary, ~15 GiB more).
# docs/scaleout.md ("The GPU day") has the one device call to make.
set -uo pipefail
cd "$(dirname "$0")/.."
LIMIT_BYTES=${GPU_DAY_LIMIT_BYTES:-$((64 * 1024 * 1024))}
WHEELS=(gymnasium farama-notifications pettingzoo faiss-cpu fastapi starlette pydantic pydantic-core
        annotated-types typing-inspection uvicorn opentelemetry-api transformers)
# The H200 image (see the device notes) already has torch, numpy, tokenizers, safetensors, huggingface-hub,
# tqdm, anyio, h11, click, annotated-doc, cloudpickle, typing-extensions, zipp, jinja2, pyarrow, matplotlib,
# sentence-transformers; gpu_check's preflight names whatever is still missing.

sizes() {  # bytes of what a call carries: the tracked and untracked-not-ignored tree, and .gpu
  local tree gpu
  tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  gpu=$(du -cb .gpu 2>/dev/null | tail -1 | cut -f1)
  echo "$tree ${gpu:-0}"
}

check_size() {
  read -r tree gpu < <(sizes)
  local total=$((tree + gpu))
  echo "gpu_day: carried: checkout $((tree / 1024)) KiB + .gpu $((gpu / 1024)) KiB = $((total / 1024 / 1024)) MiB" \
       "of $((LIMIT_BYTES / 1024 / 1024)) MiB"
  if [ "$total" -gt "$LIMIT_BYTES" ]; then
    echo "gpu_day: too large to carry ($total bytes > $LIMIT_BYTES)" >&2
    return 1
  fi
}

prepare() {
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
  mkdir -p .gpu
  # the versions this checkout is tested with: the installed ones here (constraints.txt)
  mapfile -t PINS < <(python3 - "${WHEELS[@]}" <<'EOF'
import importlib.metadata as m, sys
for name in sys.argv[1:]:
    try:
        print(f"{name}=={m.version(name)}")
    except m.PackageNotFoundError:
        sys.exit(f"gpu_day: {name} is not installed here: run scripts/install.sh first")
EOF
  ) || return 1
  rm -f .gpu/*.whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .gpu "${PINS[@]}" || return 1
  ls .gpu/*.whl | sed 's|.*/|gpu_day: wheel |'
  check_size
}

run() {
  local out="${OUT:-out}"
  mkdir -p "$out"
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
  timeout 30 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target .site .gpu/*.whl || { echo "gpu_day: wheel install failed" >&2; return 1; }
  export PYTHONPATH="$PWD/.site:$PWD"
  python3 -c "import sys, torch, transformers; print('gpu_day:', sys.version.split()[0], 'torch', torch.__version__, \
'transformers', transformers.__version__)" | tee "$out/versions.txt"
  local status=0
  echo "== 1. gpu_check (HF)"
  timeout 200 python3 -m benchmarks.gpu_check --steps 3 --backends hf --out runs/gc 2>&1 | tee "$out/gpu_check.log" \
    || status=1
  cp runs/gc/gpu_check.json "$out/" 2>/dev/null
  echo "== 2. torchrun: tiny, FSDP2, bf16, checkpointing"
  timeout 130 torchrun --standalone --nproc-per-node 1 -m algos train --preset tiny --stage team --teacher base \
    --steps 2 --out runs/fsdp --set device=cuda --set dtype=bfloat16 --set fsdp=true \
    --set gradient_checkpointing=true --set eval_every=2 --set save_every=2 2>&1 | tee "$out/fsdp.log" || status=1
  cp runs/fsdp/metrics.jsonl "$out/fsdp_metrics.jsonl" 2>/dev/null
  echo "== 3. Qwen3-4B-shaped update: measured peaks beside the plan's"
  timeout 70 python3 -m benchmarks.gpu_probe --shape qwen3-4b --tokens 16384 --steps 2 --json "$out/probe.json" \
    2>&1 | tee "$out/probe.log" || status=1
  timeout 40 python3 -m benchmarks.gpu_probe --shape qwen3-4b --tokens 2048 --steps 2 --optimizer foreach \
    --json "$out/probe_foreach.json" 2>&1 | tee "$out/probe_foreach.log" || status=1
  echo "gpu_day: done (status $status); figures in $out"
  return $status
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  size) check_size ;;
  *) echo "usage: bash benchmarks/gpu_day.sh prepare|run|size" >&2; exit 2 ;;
esac
