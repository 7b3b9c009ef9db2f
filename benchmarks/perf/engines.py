"""The vLLM section (``python -m benchmarks perf --vllm``, in the vLLM venv): vLLM's engine on
the same greedy rollouts as HF, side by side in one run. ``collect`` with a
:class:`~agents.vllm_policy.VLLMPolicy` against ``collect`` with the
:class:`~agents.hf.HFPolicy`; and vLLM replaying the recorded policy calls (same prompts,
same lengths) against the minimal KV-cache loop and ``model.generate``."""

from __future__ import annotations

import tempfile
from typing import Any

from benchmarks.perf.baselines import bare_generate, minimal_decode
from benchmarks.perf.harness import Bench, TimedPolicy, call, figure, interleaved

CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM's CPU attention takes (0.32); a model with another one fails at the first
forward, so the section is skipped for it."""


def head_size(config: Any) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def vllm_rollouts(bench: Bench, dtype: str = "float32") -> None:
    """Greedy rollouts of ``bench.model`` through vLLM and through HF, timed in turn. Skipped
    in one line where vLLM is not installed or cannot run the model."""
    import importlib.util

    from agents.collect import collect
    from agents.hf import HFPolicy
    from agents.vllm_policy import VLLMPolicy

    s = bench.settings
    if importlib.util.find_spec("vllm") is None:
        bench.log("  skipped: vllm is not installed (bash scripts/install_vllm.sh builds a venv with vLLM's CPU build)")
        return
    size = head_size(bench.model.config)
    if size not in CPU_HEAD_SIZES:
        bench.log(f"  skipped: head size {size} (vLLM's CPU attention takes {CPU_HEAD_SIZES}); try --model micro")
        return
    questions = bench.pick(s.questions)
    env_fn = bench.env_fn(max_turn_tokens=s.max_turn_tokens, max_waves=1, num_candidates=s.num_candidates)
    hf = HFPolicy(bench.model, bench.tokenizer, temperature=0.0, max_new_tokens=s.max_turn_tokens,
                  batch_size=16, seed=s.seed)
    pad = bench.tokenizer.pad_token_id if bench.tokenizer.pad_token_id is not None else hf.eos_token_id
    with tempfile.TemporaryDirectory(prefix="mopd-perf-vllm-") as folder:
        bench.model.save_pretrained(folder)
        bench.tokenizer.save_pretrained(folder)
        engine = VLLMPolicy(folder, bench.tokenizer, temperature=0.0, max_new_tokens=s.max_turn_tokens,
                            seed=s.seed, dtype=dtype, enforce_eager=True,
                            max_model_len=min(4096, bench.model.config.max_position_embeddings))
        try:
            recorded = TimedPolicy(hf, record=True)
            collect(env_fn, recorded, questions, s.group_size, seed=s.seed)
            vllm_recorded = TimedPolicy(engine, record=True)
            collect(env_fn, vllm_recorded, questions, s.group_size, seed=s.seed)
            calls = recorded.calls
            params = engine._vllm_types()[0]

            def replay() -> None:  # vLLM on the recorded prompts, each to its recorded length
                from vllm.inputs import TokensPrompt

                for prompts, lengths in calls:
                    live = [(p, n) for p, n in zip(prompts, lengths) if n > 0]
                    engine.engine.generate(
                        [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p, _ in live],
                        [params(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True) for _, n in live],
                        use_tqdm=False)

            t = interleaved({
                "hf": call(collect, env_fn, hf, questions, s.group_size, seed=s.seed),
                "vllm": call(collect, env_fn, engine, questions, s.group_size, seed=s.seed),
                "replay": replay,
                "minimal": call(minimal_decode, bench.model, calls, hf.batch_size, pad, 0.0, 1.0,
                                s.seed),
                "generate": call(bare_generate, bench.model, calls, hf.batch_size, pad,
                                 hf.eos_token_id),
            }, s.reps)
        finally:
            engine.close()
    same = sum(a == b for call_a, call_b in zip(recorded.outputs, vllm_recorded.outputs)
               for (a, _), (b, _) in zip(call_a, call_b))
    turns = sum(len(c) for c in recorded.outputs)
    bench.details["engine.vllm"] = {"dtype": dtype, "env_copies": len(questions) * s.group_size,
                                    "policy_calls": len(calls), "turns": turns,
                                    "turns_equal_to_hf_greedy": int(same), "enforce_eager": True}
    what = f"{len(questions) * s.group_size} env copies, greedy, {dtype}"
    bench.add("engine.vllm.collect_vs_hf", figure(
        t["vllm"], t["hf"], f"collect with VLLMPolicy / with HFPolicy, {what}"))
    bench.add("engine.vllm.replay_vs_minimal", figure(
        t["replay"], t["minimal"], "vLLM on the recorded prompts and lengths / minimal KV-cache loop"))
    bench.add("engine.vllm.replay_vs_generate", figure(
        t["replay"], t["generate"], "vLLM on the recorded prompts and lengths / model.generate"))

