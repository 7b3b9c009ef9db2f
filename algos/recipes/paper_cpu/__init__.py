"""The paper-shaped CPU dry run: the ``paper`` preset's structure (a Qwen3 model, activation
checkpointing, FSDP2 over torchrun's ranks, Ray rollout workers, Stage I then Stage II) at
sizes two CPU cores can run in minutes, to catch what breaks in that wiring before a GPU
job does. It checks the wiring, not learning: the model is random.

- ``settings``: the model name, the Qwen3 shape, env shape and training settings;
- ``preset``: those settings and the hooks the preset registry and the command line call;
- ``build``: a ``Qwen3ForCausalLM`` built from a shrunk ``Qwen3Config`` over the micro
  tokenizer (nothing downloaded), saved once and cached.

    torchrun --standalone --nproc-per-node 2 -m algos train --preset paper_cpu --out runs/paper_cpu
"""
