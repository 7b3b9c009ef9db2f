"""Run by tests/algos/test_scaleout.py, in one process or under torchrun: one AdamW step of a small
random Llama on a fixed global batch of rows, the loss a global token-mean (each rank's rows
divided by the whole batch's token count). Under torchrun the model is sharded with FSDP2
(``algos.engine.distributed.fully_shard_model``: it averages the ranks' gradients, so each rank's
loss is multiplied by the world size) and each rank takes its rows by token count; rank 0 writes the gradient norm and the gathered updated weights under OUT.

    python tests/scaleout_fsdp_step.py OUT
    torchrun --nproc-per-node 2 tests/scaleout_fsdp_step.py OUT
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)


def main() -> int:
    from agents.models import tiny_causal_lm
    from algos.engine.distributed import from_env, fully_shard_model, shard_by_tokens

    out = Path(sys.argv[1])
    dist = from_env()
    model = tiny_causal_lm(256, hidden_size=32, num_layers=2, num_heads=2, seed=0)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 256, (n,), generator=g) for n in (9, 17, 5, 12)]  # the same on every rank
    total = sum(len(r) - 1 for r in rows)  # predicted tokens of the whole batch
    scale = 1 if dist is None else dist.world  # FSDP averages over the ranks: undo it
    mine = rows if dist is None else [rows[i] for i in shard_by_tokens([len(r) for r in rows], dist.world)[dist.rank]]
    if dist is not None:
        fully_shard_model(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for ids in mine:  # one backward per row: the ranks run as many (2 rows each here)
        logits = model(input_ids=ids[None]).logits[0, :-1]
        loss = torch.nn.functional.cross_entropy(logits.float(), ids[1:], reduction="sum") * scale / total
        loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    optimizer.step()
    if dist is not None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        state = model.state_dict()
    if dist is None or dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().clone() for k, v in state.items()}, out / "weights.pt")
        (out / "step.json").write_text(json.dumps({"grad_norm": norm, "world": int(os.environ.get("WORLD_SIZE", 1))}))
    if dist is not None:
        del model, optimizer  # the sharded model holds the group (Dist.close)
        dist.close()
    return 0


if __name__ == "__main__":
    from algos.engine.distributed import run_main

    sys.exit(run_main(main))
