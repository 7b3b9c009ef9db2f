"""The learner section: ``Trainer.update`` against a plain forward + backward (time, and
peak memory per trained token before and after chunked log-probs), and the Teacher's
``score_rows`` against a no-grad forward."""

from __future__ import annotations

import importlib.util
import tempfile
from typing import Any

import numpy as np

from benchmarks.perf.baselines import bare_forward, full_vocabulary_logits, plain_fwd_bwd
from benchmarks.perf.harness import Bench, Figure, call, figure, interleaved, peak_memory


def learner(bench: Bench) -> None:
    """The section's figures (the module's docstring) into ``bench``."""
    from agents.collect import collect
    from agents.scripted import ScriptedPolicy
    from algos.advantages import AdvantageContext
    from algos.batch import Row, pad_rows, rows_from_episodes, score_rows
    from algos.config import TrainConfig
    from algos.roles import assign_advantages
    from algos.trainer import Trainer

    s = bench.settings
    groups = collect(bench.env_fn(), ScriptedPolicy(seed=s.seed), bench.pick(2), 2, seed=s.seed)
    every = rows_from_episodes(groups, s.max_row_tokens)
    rows = every[:: max(1, len(every) // s.rows)][: s.rows]  # Leader, Searcher and Answerer rows
    pad = bench.tokenizer.pad_token_id if bench.tokenizer.pad_token_id is not None else 0
    device = next(bench.model.parameters()).device
    with tempfile.TemporaryDirectory(prefix="mopd-perf-") as out:
        config = TrainConfig(stage="team", teacher=None, searcher_signal="outcome", kl_coef=0.0,
                             model=s.model, out_dir=out, group_size=2, seed=s.seed,
                             train_datasets=("nq",), val_datasets=("nq",), val_per_dataset=1)
        trainer = Trainer(config, progress=False, model=bench.model, tokenizer=bench.tokenizer,
                          retriever=bench.retriever)
        for row, logp in zip(rows, score_rows(bench.model, rows, pad_id=pad)):
            row.old_logp = logp
        assign_advantages(rows, trainer.rules, AdvantageContext(groups=groups, beta=config.beta))
        for row in rows:  # scripted rows may hold all-zero advantages; the cost is the same
            row.trained = True
        ids, mask, targets = (t.to(device) for t in pad_rows(rows, pad))
        tokens = int(targets.sum())

        def update_before(batch: list[Any] = rows) -> None:
            with full_vocabulary_logits():
                trainer.update(batch)

        bench.model.train()
        t = interleaved({
            "update": call(trainer.update, rows),
            "update_before": update_before,
            "fwd_bwd": call(plain_fwd_bwd, bench.model, ids, mask, targets),
            "score": call(score_rows, bench.model, rows, max_tokens=config.max_tokens_per_batch, pad_id=pad),
            "forward": call(bare_forward, bench.model, ids, mask, targets),
        }, s.reps)

        # Peak memory per trained token: the slope between the rows as they are and the same
        # rows with every token trained, so the context (the decoder's activations,
        # attention) and what does not grow at all (gradients, AdamW's moments) drop out.
        dense = [Row(r.token_ids, np.ones_like(r.mask), r.segment, r.episode, r.group) for r in rows]
        for row, logp in zip(dense, score_rows(bench.model, dense, pad_id=pad)):
            row.old_logp = logp
            row.advantages = np.linspace(-1.0, 1.0, len(logp))
        sides = {"after": trainer.update, "before": update_before,
                 "fwd_bwd": lambda rs: plain_fwd_bwd(bench.model, *(x.to(device) for x in pad_rows(rs, pad)))}
        memory: dict[str, dict[str, float]] = {}
        for name, fn in sides.items():
            fn(dense)  # warm-up: allocations that persist (optimizer state) happen here
            # the lower of two peaks: what else the process allocates meanwhile only adds to one
            p1, p2 = (min(peak_memory(lambda fn=fn, rs=rs: fn(rs), device) for _ in range(2)) for rs in (rows, dense))
            n1, n2 = tokens, sum(r.num_targets for r in dense)
            memory[name] = {"peak_mb_generated_tokens": p1 / 2**20, "peak_mb_every_token": p2 / 2**20,
                            "trained_tokens": [n1, n2], "mb_per_trained_token": (p2 - p1) / max(1, n2 - n1) / 2**20}
        bench.model.zero_grad(set_to_none=True)
        bench.model.eval()
        if trainer.writer is not None:
            trainer.writer.close()
    trl = ("not installed: no TRL figure" if importlib.util.find_spec("trl") is None else
           "installed, not measured by this suite (docs/performance.md has a measured comparison)")
    bench.details["learner"] = {
        "rows": len(rows), "padded_shape": list(ids.shape), "trained_tokens": tokens,
        "context_tokens": int(mask.sum()), "max_tokens_per_batch": config.max_tokens_per_batch,
        "memory": memory, "peers": {"trl": trl}}
    bench.add("learner.update_vs_fwd_bwd", figure(
        t["update"], t["fwd_bwd"], f"Trainer.update / plain forward + cross_entropy + backward, same {len(rows)} "
        f"rows ({tokens} trained tokens); tokens/s ratio = 1 / this"))
    bench.add("learner.update.before_vs_after", figure(
        t["update_before"], t["update"], "Trainer.update with full-vocabulary logits / with chunked log-probs"))
    after, before, plain = (memory[k]["mb_per_trained_token"] for k in ("after", "before", "fwd_bwd"))
    n1, n2 = memory["after"]["trained_tokens"]
    bench.add("learner.memory.mb_per_trained_token", Figure(
        after, after, after, f"peak memory per trained token of Trainer.update, MB (slope from {n1} to {n2} "
        "trained tokens in the same rows; not a ratio)"))
    bench.add("learner.memory.before_vs_after", Figure(
        before / after, before / after, before / after,
        f"peak MB per trained token with full-vocabulary logits ({before:.3f}) / chunked ({after:.3f})"))
    bench.add("learner.memory.update_vs_fwd_bwd", Figure(
        after / plain, after / plain, after / plain,
        f"peak MB per trained token, Trainer.update / plain forward + cross_entropy + backward ({plain:.3f})"))
    bench.add("teacher.score_rows_vs_forward", figure(
        t["score"], t["forward"], "score_rows / a no-grad forward of the same rows as one padded batch"))
