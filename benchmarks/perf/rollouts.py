"""The decoding and collect sections: ``collect`` with an HFPolicy against the minimal
KV-cache loop, the replaced decoding step and ``model.generate`` (greedy and sampled), and
batched against one env copy at a time, with the model and with the scripted team."""

from __future__ import annotations

from typing import Any

from benchmarks.perf.baselines import bare_generate, legacy_policy, minimal_decode
from benchmarks.perf.harness import Bench, TimedEnvFn, TimedPolicy, Trial, call, figure, interleaved


def model_rollouts(bench: Bench, temperature: float, top_p: float = 1.0) -> None:
    """Decoding with the model, greedy (``temperature=0``; then also batched against one env
    copy at a time) or sampled, on the same prompts and lengths on every side."""
    from agents.collect import collect
    from agents.hf import HFPolicy

    s = bench.settings
    mode = "greedy" if temperature == 0 else "sampled"
    questions = bench.pick(s.questions)
    env_fn = bench.env_fn(max_turn_tokens=s.max_turn_tokens, max_waves=1,
                          num_candidates=s.num_candidates)
    policy = HFPolicy(bench.model, bench.tokenizer, temperature=temperature, top_p=top_p,
                      max_new_tokens=s.max_turn_tokens, batch_size=16, seed=s.seed)
    before = legacy_policy(policy)
    pad = bench.tokenizer.pad_token_id if bench.tokenizer.pad_token_id is not None else policy.eos_token_id
    recorded = TimedPolicy(policy, record=True)  # the warm-up round's batched collect

    def run(which: Any, max_envs: int | None) -> Trial:
        def trial() -> dict[str, float]:
            which.generator.manual_seed(s.seed)  # every round draws the same tokens
            timed = recorded if which is policy and max_envs is None and not recorded.calls else TimedPolicy(which)
            make = TimedEnvFn(env_fn)
            groups = collect(make, timed, questions, s.group_size, seed=s.seed, max_envs=max_envs)
            return {"policy": timed.seconds, "construct": make.seconds,
                    "output_tokens": sum(ep.output_tokens for g in groups for ep in g)}
        return trial

    trials = {"collect": run(policy, None), "before": run(before, None),
              "minimal": call(minimal_decode, bench.model, recorded.calls, policy.batch_size, pad,
                              temperature, top_p, s.seed),
              "generate": call(bare_generate, bench.model, recorded.calls, policy.batch_size, pad,
                               policy.eos_token_id, temperature, top_p)}
    if mode == "greedy":
        trials["sequential"] = run(policy, 1)
    t = interleaved(trials, s.reps)
    # the limit generated exactly what the policy generated
    replay = minimal_decode(bench.model, recorded.calls, policy.batch_size, pad, temperature, top_p, s.seed)
    got = [[tokens for tokens, _ in call_out] for call_out in recorded.outputs]
    mismatched = sum(a != b for call_a, call_b in zip(got, replay) for a, b in zip(call_a, call_b))
    copies = len(questions) * s.group_size
    bench.details[f"decode.{mode}"] = {
        "env_copies": copies, "temperature": temperature, "top_p": top_p,
        "policy_calls": len(recorded.calls), "turns": sum(len(lengths) for _, lengths in recorded.calls),
        "output_tokens": sum(sum(lengths) for _, lengths in recorded.calls),
        "turns_differing_from_minimal_loop": int(mismatched),
        "output_tokens_before": t["before.output_tokens"][-1],
        **({"output_tokens_sequential": t["sequential.output_tokens"][-1]} if mode == "greedy" else {})}
    if mismatched:
        bench.log(f"  warning: {mismatched} turns differ between the policy and the minimal loop")
    what = f"{copies} env copies, {mode}" + (f" at temperature {temperature}" if temperature else "")
    bench.add(f"decode.{mode}.collect_vs_minimal", figure(
        t["collect"], t["minimal"], f"collect (HFPolicy) / minimal KV-cache loop, same prompts and tokens, {what}"))
    bench.add(f"decode.{mode}.policy_vs_minimal", figure(
        t["collect.policy"], t["minimal"], "HFPolicy.act time inside that collect / minimal loop"))
    bench.add(f"decode.{mode}.before_vs_after", figure(
        t["before"], t["collect"], "collect with the replaced decoding step / with this one"))
    bench.add(f"decode.{mode}.before_collect_vs_minimal", figure(
        t["before"], t["minimal"], "collect with the replaced decoding step / minimal loop"))
    bench.add(f"decode.{mode}.peer.generate_vs_minimal", figure(
        t["generate"], t["minimal"], "peer: model.generate on the same prompts and lengths / minimal loop"))
    if mode != "greedy":
        return
    outside = [a - p for a, p in zip(t["collect"], t["collect.policy"])]
    bench.add("env.outside_policy_share", figure(
        outside, t["collect"], "(collect - policy) / collect: env, collector, env construction"))
    bench.add("env.construction_share", figure(
        t["collect.construct"], t["collect"], f"making the {copies} envs inside collect / collect"))
    bench.add("collect.batched_speedup.model", figure(
        t["sequential"], t["collect"], f"collect max_envs=1 / batched, {copies} copies, HFPolicy"))


def scripted_rollouts(bench: Bench) -> None:
    """Section 2 with the scripted team and the dense retriever, and env construction."""
    from agents.collect import collect
    from agents.scripted import ScriptedPolicy

    s = bench.settings
    questions = bench.pick(s.questions)
    env_fn = bench.env_fn()
    policy = ScriptedPolicy(seed=s.seed)
    copies = len(questions) * s.group_size

    def run(max_envs: int | None) -> Trial:
        def trial() -> dict[str, float]:
            make = TimedEnvFn(env_fn)
            collect(make, policy, questions, s.group_size, seed=s.seed, max_envs=max_envs)
            return {"construct": make.seconds}
        return trial

    t = interleaved({"batched": run(None), "sequential": run(1)}, s.reps)
    bench.add("collect.batched_speedup.scripted", figure(
        t["sequential"], t["batched"], f"collect max_envs=1 / batched, {copies} copies, scripted team + MiniLM"))
    bench.add("collect.env_construction_share.scripted", figure(
        t["batched.construct"], t["batched"], f"making the {copies} envs inside the batched scripted collect / it"))
