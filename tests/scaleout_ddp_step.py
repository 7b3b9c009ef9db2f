"""Run by tests/algos/test_scaleout.py, in one process or under torchrun: one learner step of the
tiny preset (Stage I, two minibatches) on a fixed global batch; rank 0 writes the step's
metrics, the updated weights and a checkpoint under OUT.

    python tests/scaleout_ddp_step.py BASE OUT
    torchrun --nproc-per-node 2 tests/scaleout_ddp_step.py BASE OUT
    torchrun --nproc-per-node 2 tests/scaleout_ddp_step.py BASE OUT fail   # rank 1 raises
    torchrun --nproc-per-node 2 tests/scaleout_ddp_step.py BASE OUT fsdp   # FSDP2 (fsdp=true)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)


def main() -> int:
    from agents.hf import HFPolicy
    from agents.ray_rollout import collect_groups
    from algos.commands.presets import preset_config
    from algos.engine.distributed import from_env
    from algos.trainer import Trainer
    from envs.retrieval.lexical import WordOverlapRetriever

    base, out = sys.argv[1], Path(sys.argv[2])
    if sys.argv[3:] == ["fail"]:
        dist = from_env()
        if dist.rank == 1:
            raise ValueError("injected failure")
        dist.barrier()  # rank 0 waits for a rank that will never come
        return 0
    cfg = preset_config("tiny", stage="teacher", teacher=None, model=base, out_dir=str(out), minibatches=2,
                        learning_rate=1e-3, max_tokens_per_batch=1536, save_every=1, fsdp=sys.argv[3:] == ["fsdp"])
    trainer = Trainer(cfg, progress=False, retriever=WordOverlapRetriever())
    questions = trainer.train_questions[:4]
    sampler = HFPolicy(trainer.full_model, trainer.tokenizer, temperature=1.0, max_new_tokens=cfg.max_turn_tokens)
    groups = collect_groups(trainer.env_fn(), sampler, questions, cfg.group_size, seed=11)  # the same on every rank
    metrics = trainer.learn(groups)
    trainer.save()
    if trainer.is_main:  # (the gathered replica: under FSDP2 the trained model is sharded)
        torch.save(trainer.full_model.state_dict(), out / "weights.pt")
        (out / "step.json").write_text(json.dumps({**metrics, "world": int(os.environ.get("WORLD_SIZE", 1))}))
    dist = trainer.dist
    del trainer, sampler  # a sharded model must not outlive the group (Dist.close)
    if dist is not None:
        dist.close()
    return 0


if __name__ == "__main__":
    from algos.engine.distributed import run_main

    sys.exit(run_main(main))
