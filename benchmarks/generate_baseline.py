"""Generation throughput: ``HFPolicy.act`` against a bare ``model.generate`` on the same
prompts and the same sampling settings. Measurements only; nothing is asserted.

    python -m benchmarks.generate_baseline                      # tiny 16M Llama, 49k vocab
    python -m benchmarks.generate_baseline --model smollm2      # SmolLM2-135M-Instruct

Tokens/s counts the tokens each side really generated (up to and including EOS).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from agents.base import Observation
from agents.hf import HFPolicy
from agents.models import load_causal_lm, tiny_causal_lm
from envs.tokenizer import load_tokenizer


def make_prompts(vocab_size: int, n: int, length: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab_size, size=length, dtype=np.int64) for _ in range(n)]


def count_generated(new_tokens: torch.Tensor, eos: int) -> int:
    """Tokens up to and including the first EOS of every row of (B, T) ids."""
    total = 0
    for row in new_tokens.tolist():
        total += row.index(eos) + 1 if eos in row else len(row)
    return total


def time_policy(policy: HFPolicy, prompts: list[np.ndarray], new_tokens: int) -> tuple[int, float]:
    obs = [
        Observation(agent=f"searcher_{i}", role="searcher", token_ids=p, max_new_tokens=new_tokens)
        for i, p in enumerate(prompts)
    ]
    start = time.perf_counter()
    actions = policy.act(obs)
    return sum(len(a.token_ids) for a in actions), time.perf_counter() - start


@torch.inference_mode()
def time_generate(
    model, prompts: list[np.ndarray], new_tokens: int, temperature: float, top_p: float, eos: int
) -> tuple[int, float]:
    input_ids = torch.tensor(np.stack(prompts))  # equal lengths: no padding needed
    sampling = (
        {"do_sample": False}
        if temperature == 0
        else {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
    )
    start = time.perf_counter()
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=new_tokens,
        eos_token_id=eos,
        pad_token_id=eos,
        **sampling,
    )
    elapsed = time.perf_counter() - start
    return count_generated(out[:, input_ids.shape[1] :], eos), elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="'tiny' (default), 'smollm2', or a path")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per cell (best kept)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model == "tiny":
        tokenizer = load_tokenizer()
        # the size DESIGN.md measures: a 16M-parameter Llama with SmolLM2's vocabulary
        model = tiny_causal_lm(
            len(tokenizer),
            hidden_size=256,
            num_layers=4,
            num_heads=4,
            eos_token_id=tokenizer.eos_token_id,
            tie_word_embeddings=True,
        )
    else:
        model, tokenizer = load_causal_lm(args.model)
    eos = tokenizer.eos_token_id
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model={args.model} params={params / 1e6:.1f}M prompt_len={args.prompt_len} "
        f"new_tokens={args.new_tokens} temperature={args.temperature} top_p={args.top_p} "
        f"threads={torch.get_num_threads()}"
    )
    print(f"{'batch':>5} {'HFPolicy tok/s':>15} {'generate tok/s':>15} {'ratio':>6}")
    for batch in args.batch_sizes:
        prompts = make_prompts(len(tokenizer), batch, args.prompt_len, seed=batch)
        policy = HFPolicy(
            model,
            tokenizer,
            temperature=args.temperature,
            top_p=args.top_p,
            max_new_tokens=args.new_tokens,
            batch_size=batch,
        )
        # one untimed warm-up each, then the best of `repeats` (the least disturbed run)
        time_policy(policy, prompts, 4)
        time_generate(model, prompts, 4, args.temperature, args.top_p, eos)
        ours, theirs = 0.0, 0.0
        for _ in range(args.repeats):
            n, t = time_policy(policy, prompts, args.new_tokens)
            ours = max(ours, n / t)
            n, t = time_generate(model, prompts, args.new_tokens, args.temperature, args.top_p, eos)
            theirs = max(theirs, n / t)
        print(f"{batch:>5} {ours:>15.1f} {theirs:>15.1f} {ours / theirs:>6.2f}")


if __name__ == "__main__":
    main()
