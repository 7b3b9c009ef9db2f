"""The paper-shaped CPU dry run: the ``paper`` preset's structure (a Qwen3 model, activation
checkpointing, FSDP2 over torchrun's ranks, Ray rollout workers, Stage I then Stage II) at
sizes two CPU cores can run in minutes, to catch what breaks in that wiring before a GPU
job does. It checks the wiring, not learning: the model is random.

    torchrun --standalone --nproc-per-node 2 -m algos train --preset paper_cpu --out runs/paper_cpu
"""

from __future__ import annotations

from algos.recipes import Lazy, Recipe
from algos.recipes.paper_cpu.settings import ENV, MODEL, TRAIN

RECIPE = Recipe(MODEL, ENV, TRAIN, build=Lazy("algos.recipes.paper_cpu.build:build_paper_cpu_base"),
                fresh_model=Lazy("algos.recipes.paper_cpu.build:fresh_paper_cpu_model"),
                tokenizer=Lazy("algos.recipes.micro.tokenizer:micro_tokenizer"))
