"""The memory plan against a measured peak (issue 42.6): one update of a randomly initialised
model of a given shape (no download), bfloat16 autocast over float32 weights, activation
checkpointing, the learner's log-prob path (``agents.logprobs.token_logprobs``) and its AdamW
(fused on CUDA, ``algos.engine.precision.adamw``; ``--optimizer foreach`` for PyTorch's default), and
beside each measured peak the plan's prediction for the same shape (``algos.commands.plan``):

    python -m benchmarks.gpu_probe --shape qwen3-4b --tokens 16384          # on a GPU
    python -m benchmarks.gpu_probe --shape tiny --tokens 256 --device cpu   # the wiring, on CPU

On CUDA the peaks are ``torch.cuda.max_memory_allocated`` (what PyTorch's allocator handed out;
the plan's headroom covers the rest); on CPU the process's peak resident memory over its memory
before the phase (a rough figure: the allocator is glibc's). One line per step and phase:
``backward peak X GiB (plan Y)``, ``step peak X GiB (plan Y)``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

SHAPES = {
    # Qwen/Qwen3-4B-Instruct-2507's config.json (algos.commands.plan.KNOWN_ARCHS)
    "qwen3-4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True,
                     max_position_embeddings=40960),
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 intermediate_size=256, vocab_size=2000, tie_word_embeddings=True, max_position_embeddings=4096),
}
GIB = 2**30


def predicted(shape: dict, tokens: int, device: str, fused: bool) -> dict[str, float]:
    """The plan's bytes for this update (Stage I: no Teacher; nothing generates): GiB held at the
    backward's and the optimizer step's peaks."""
    from algos.commands.plan import Arch, memory_plan
    from algos.config import TrainConfig

    arch = Arch.from_config({"model_type": "qwen3", **shape})
    cfg = TrainConfig(model="probe", stage="teacher", device=device, dtype="bfloat16", max_tokens_per_batch=tokens,
                      gradient_checkpointing=True)
    plan = memory_plan(cfg, 1, 1024, arch=arch, fused=fused)
    return {"backward": plan.total("backward") / GIB, "step": plan.total("optimizer step") / GIB,
            "params": arch.params}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-4b")
    parser.add_argument("--tokens", type=int, default=16384, help="tokens in the update's chunk (rows of 8192)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--optimizer", choices=("auto", "foreach", "fused"), default="auto",
                        help="auto: the trainer's choice (fused on CUDA)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if not 2 <= args.tokens <= 1 << 20 or not 1 <= args.steps <= 10:
        print("gpu_probe: error: --tokens in [2, 1048576], --steps in [1, 10]", file=sys.stderr)
        return 2
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from agents.logprobs import token_logprobs
    from algos.engine.precision import fused_adamw, precision_for

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("gpu_probe: error: no CUDA device (--device cpu runs the wiring)", file=sys.stderr)
        return 2
    shape = SHAPES[args.shape]
    fused = fused_adamw(args.device) if args.optimizer == "auto" else args.optimizer == "fused"
    plan = predicted(shape, args.tokens, args.device, fused)
    precision = precision_for(args.device, "bfloat16")
    precision.configure()
    torch.manual_seed(0)
    with torch.device(args.device):
        model = Qwen3ForCausalLM(Qwen3Config(**shape))
    model.float().train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    kwargs = {"fused": True} if fused else {"foreach": True}
    optimizer = precision.adamw(model.parameters(), lr=1e-6, **kwargs)
    row = min(args.tokens, 8192)
    ids = torch.randint(0, shape["vocab_size"], (max(1, args.tokens // row), row), device=args.device)
    attention = torch.ones_like(ids)
    targets = torch.zeros_like(ids, dtype=torch.bool)
    targets[:, 1:] = True

    def peak() -> float:  # once the device finished what was queued
        if cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / GIB
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # kB on Linux

    print(f"gpu_probe: {args.shape} ({plan['params']:,} parameters), {ids.shape[0]} x {row} tokens, bfloat16 over "
          f"float32, checkpointing, AdamW {'fused' if fused else 'foreach'}, {args.device}", flush=True)
    figures = []
    for step in range(args.steps):
        start = time.perf_counter()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        base = 0.0 if cuda else int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / GIB
        with precision.compute(cache=False):
            logp = token_logprobs(model, ids, attention, targets)
        (-logp.mean()).backward()
        backward = peak() - base
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        optimizer.step()
        step_peak = peak() - base
        optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - start
        figures.append({"step": step, "backward_gib": backward, "step_gib": step_peak, "seconds": seconds,
                        "plan_backward_gib": plan["backward"], "plan_step_gib": plan["step"]})
        print(f"step {step}: backward peak {backward:.2f} GiB (plan {plan['backward']:.2f}), optimizer-step peak "
              f"{step_peak:.2f} GiB (plan {plan['step']:.2f}), {seconds:.1f} s", flush=True)
    if not cuda:
        print("gpu_probe: on CPU the peaks are resident memory over the process's before each step: step 0's "
              "has no AdamW moments yet, later steps hold them", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
