"""The vLLM policy's own logic against a fake engine with vLLM's interface (``LLM.generate``
with ``TokensPrompt`` and ``SamplingParams``, ``collective_rpc``, ``sleep``/``wake_up``);
the real engine runs in ``benchmarks/gpu_check.sh``."""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest

from agents.base import Observation
from agents.vllm_policy import VLLMPolicy, _load_weights_on_worker, require_vllm


@dataclass
class FakeParams:  # vllm.SamplingParams' fields that the policy sets
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    stop: list = field(default_factory=list)
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    seed: int | None = None
    skip_special_tokens: bool = True
    detokenize: bool = True


def fake_prompt(prompt_token_ids):
    return {"prompt_token_ids": list(prompt_token_ids)}


class FakeLLM:
    """Continues every prompt with ``script`` (token ids) and honours max_tokens, EOS and
    stop strings the way vLLM does: the token that completes a stop string is kept."""

    vllm_types = (FakeParams, fake_prompt)

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script = tokenizer, list(script)
        self.calls, self.rpcs, self.events = [], [], []
        self.loaded = []
        self.worker = SimpleNamespace(model_runner=SimpleNamespace(model=SimpleNamespace(
            load_weights=lambda weights: self.loaded.extend(name for name, _ in weights))))

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append((prompts, params))
        outs = []
        for k, p in enumerate(params):
            ids = []
            for t in self.script:
                ids.append(t)
                text = self.tokenizer.decode(ids, skip_special_tokens=False)
                if t == self.tokenizer.eos_token_id or len(ids) >= p.max_tokens or any(s in text for s in p.stop):
                    break
            logprobs = [{t: SimpleNamespace(logprob=-0.5 - 0.01 * j - k)} for j, t in enumerate(ids)]
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=tuple(ids), logprobs=logprobs)]))
        return outs

    def collective_rpc(self, method, args=()):
        self.rpcs.append(method)
        return [method(self.worker, *args)]

    def sleep(self, level=1):
        self.events.append(("sleep", level))

    def wake_up(self):
        self.events.append(("wake_up",))

    def reset_prefix_cache(self):
        self.events.append(("reset_prefix_cache",))


def _obs(tokenizer, text, agent="searcher_0", stop=("</search>", "</summary>"), budget=64, env=0):
    return Observation(agent=agent, role=agent.rsplit("_", 1)[0],
                       token_ids=np.asarray(tokenizer.encode(text), dtype=np.int64), stop=stop,
                       max_new_tokens=budget, env_index=env)


def test_prompt_ids_in_ids_and_logprobs_out_stops_and_budgets(tokenizer):
    script = tokenizer.encode("<search> Port Velm</search> more words", add_special_tokens=False)
    engine = FakeLLM(tokenizer, script)
    policy = VLLMPolicy("unused", tokenizer, temperature=0.7, top_p=0.9, max_new_tokens=5, seed=3, engine=engine)
    observations = [_obs(tokenizer, "Question one?"), _obs(tokenizer, "Question two?", budget=3, env=1),
                    _obs(tokenizer, "No room", budget=0, env=2),
                    _obs(tokenizer, "Answer it", agent="answerer_0", stop=("</answer>",), env=3)]
    policy.max_new_tokens = 40
    actions = policy.act(observations)
    assert len(engine.calls) == 1  # every live observation in one generate call
    prompts, params = engine.calls[0]
    assert [p["prompt_token_ids"] for p in prompts] == [observations[i].token_ids.tolist() for i in (0, 1, 3)]
    assert [p.max_tokens for p in params] == [40, 3, 40]  # min(turn budget, policy cap)
    assert params[0].stop == ["</search>", "</summary>"] and params[2].stop == ["</answer>"]
    assert all(p.include_stop_str_in_output and p.logprobs == 0 for p in params)
    assert all((p.temperature, p.top_p) == (0.7, 0.9) for p in params)
    assert len({p.seed for p in params}) == 3
    stop_end = tokenizer.decode(script, skip_special_tokens=False).index("</search>") + len("</search>")
    assert tokenizer.decode(actions[0].token_ids).startswith("<search> Port Velm</search>")
    assert len(tokenizer.decode(actions[0].token_ids)) >= stop_end and len(actions[0].token_ids) < len(script)
    assert actions[1].token_ids == script[:3]  # cut at the budget
    assert actions[2].token_ids == [] and actions[2].text == ""  # no room: nothing asked
    assert actions[3].token_ids == script  # no stop string of its role in the script
    assert actions[0].logprobs == pytest.approx([-0.5 - 0.01 * j for j in range(len(actions[0].token_ids))])
    assert actions[1].logprobs == pytest.approx([-1.5, -1.51, -1.52])
    assert actions[0].text == tokenizer.decode(actions[0].token_ids, skip_special_tokens=False)


def test_greedy_turns_top_p_off_and_reseed_repeats_the_seeds(tokenizer):
    engine = FakeLLM(tokenizer, [tokenizer.eos_token_id])
    policy = VLLMPolicy("unused", tokenizer, temperature=0.0, top_p=0.5, engine=engine)
    obs = [_obs(tokenizer, "Q?")] * 2
    policy.reseed(7)
    policy.act(obs)
    policy.reseed(7)
    policy.act(obs)
    (_, first), (_, second) = engine.calls
    assert [p.seed for p in first] == [p.seed for p in second]
    assert first[0].top_p == 1.0 and first[0].temperature == 0.0


def test_weights_go_through_vllms_loader_and_wake_the_engine(tokenizer):
    import torch

    engine = FakeLLM(tokenizer, [tokenizer.eos_token_id])
    policy = VLLMPolicy("unused", tokenizer, engine=engine)
    policy.sleep()
    layer = torch.nn.Linear(2, 2)
    policy.load_weights(layer.named_parameters())
    assert engine.rpcs == [_load_weights_on_worker]
    assert engine.loaded == ["weight", "bias"]
    assert engine.events == [("sleep", 1), ("wake_up",), ("reset_prefix_cache",)]
    assert not policy.sleeping


def test_the_worker_loads_into_the_runners_get_model_where_it_has_one():
    loaded = []
    model = SimpleNamespace(load_weights=lambda weights: loaded.extend(name for name, _ in weights))
    runner = SimpleNamespace(get_model=lambda: model, model=None)  # vLLM V1's GPUModelRunner
    assert _load_weights_on_worker(SimpleNamespace(model_runner=runner), [("w", 1), ("b", 2)]) == 2
    assert loaded == ["w", "b"]


def test_missing_vllm_names_the_install(monkeypatch, tokenizer):
    real = builtins.__import__

    def no_vllm(name, *args, **kwargs):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("No module named 'vllm'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[vllm\]'"):
        require_vllm()
    with pytest.raises(ImportError, match="rollout_backend=vllm"):
        VLLMPolicy("some/model", tokenizer)


def test_the_engine_is_given_a_model_directory_not_an_alias(tmp_path):
    """vLLM reads model files itself: ``smollm2`` (an alias only ``load_causal_lm`` knows)
    becomes the converted copy in the cache, with its tokenizer beside the weights; a path
    or hub id passes through."""
    from pathlib import Path

    from agents.models import local_model_dir

    assert local_model_dir(str(tmp_path)) == str(tmp_path)
    assert local_model_dir("Qwen/Qwen3-4B-Instruct-2507") == "Qwen/Qwen3-4B-Instruct-2507"
    model_dir = Path(local_model_dir("SmolLM2"))
    assert (model_dir / "config.json").exists() and (model_dir / "tokenizer.json").exists()
    assert any(model_dir.glob("*.safetensors"))


def test_a_restored_state_goes_on_with_the_seeds_of_an_uninterrupted_run(tokenizer):
    """The trainer checkpoints ``get_state()``: after ``--resume`` the requests draw the
    seeds the run would have drawn, not step 1's again."""
    obs = [_obs(tokenizer, "Q?")] * 2
    engine = FakeLLM(tokenizer, [tokenizer.eos_token_id])
    through = VLLMPolicy("unused", tokenizer, temperature=1.0, seed=3, engine=engine)
    through.act(obs)
    saved = through.get_state()
    through.act(obs)
    resumed = VLLMPolicy("unused", tokenizer, temperature=1.0, seed=3, engine=FakeLLM(tokenizer, [0]))
    resumed.set_state(saved)
    resumed.act(obs)
    assert [p.seed for p in resumed.engine.calls[0][1]] == [p.seed for p in engine.calls[1][1]]
    assert [p.seed for p in engine.calls[0][1]] != [p.seed for p in engine.calls[1][1]]
