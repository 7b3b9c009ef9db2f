"""The vLLM policy's own logic against a fake engine with vLLM's interface (``LLM.generate``
with ``TokensPrompt`` and ``SamplingParams``, ``collective_rpc``, ``sleep``/``wake_up``);
the real engine runs in ``benchmarks/gpu_check.sh``."""

from __future__ import annotations

import builtins
import dataclasses
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
    policy.sampling = dataclasses.replace(policy.sampling, max_new_tokens=40)
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


# ---------------------------------------------------------------------- across vLLM's real boundary
# (tests/fake_vllm.py: a fake ``vllm`` module whose default engine lives in another process
# behind a msgpack-like encoder that refuses tensors, as vLLM V1's does)


@pytest.fixture
def model_dir(tmp_path, tokenizer):
    """What the engine loads: here only a config naming the EOS the fake answers with."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": tokenizer.eos_token_id}))
    return str(tmp_path)


def test_the_weight_push_reaches_the_engine_although_vllm_defaults_to_another_process(
        fake_vllm, model_dir, tokenizer):
    """B1: vLLM's default engine is another process, and tensors do not cross its msgpack
    boundary; the policy builds the in-process engine and its weights arrive, values and all."""
    import os

    import torch

    policy = VLLMPolicy(model_dir, tokenizer)
    layer = torch.nn.Linear(3, 2)
    policy.load_weights(layer.named_parameters())
    loaded = policy.engine.collective_rpc(fake_vllm.loaded_weights)[0]
    assert loaded == {"weight": layer.weight.reshape(-1).tolist(), "bias": layer.bias.tolist()}
    assert policy.engine.engine_state()["pid"] == os.getpid()
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_the_fake_engine_keeps_vllms_process_boundary_and_the_policy_refuses_it(
        fake_vllm, model_dir, tokenizer, monkeypatch):
    import os

    import torch

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    llm = fake_vllm.LLM(model=model_dir)
    assert llm.engine_state()["pid"] != os.getpid()  # a real other process
    with pytest.raises(TypeError, match="not serializable"):  # a callable, without the insecure switch
        llm.collective_rpc(fake_vllm.worker_pid)
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    assert llm.collective_rpc(fake_vllm.worker_pid) == [llm.engine_state()["pid"]]
    with pytest.raises(TypeError, match="torch.Tensor cannot cross"):
        llm.collective_rpc(_load_weights_on_worker, args=([("w", torch.ones(2))],))
    with pytest.raises(ValueError, match="VLLM_ENABLE_V1_MULTIPROCESSING=1: rollout_backend=vllm runs"):
        VLLMPolicy(model_dir, tokenizer)


def _core_events(policy):
    return policy.engine.llm_engine.engine_core.core.events


def test_sleep_empties_torchs_cache_and_weights_wake_before_the_kv_cache(fake_vllm, model_dir, tokenizer,
                                                                         monkeypatch):
    """B7 + S2: where wake_up takes tags, sleep discards the weights (level 2), torch's
    cache is emptied after the sleep and before each wake, and the KV cache is woken only
    after the new weights are in."""
    import torch

    import agents.vllm_policy as vp

    policy = VLLMPolicy(model_dir, tokenizer)
    monkeypatch.setattr(vp, "_empty_cache", lambda: _core_events(policy).append("empty_cache"))
    policy.sleep()
    policy.load_weights(torch.nn.Linear(2, 2).named_parameters())
    policy.act([_obs(tokenizer, "Q?")])
    assert _core_events(policy) == [("sleep", 2), "empty_cache", "empty_cache", ("wake_up", ["weights"]), "load",
                                    "empty_cache", ("wake_up", ["kv_cache"]), "reset_prefix_cache", ("generate", 1)]


def test_without_wake_tags_sleep_keeps_the_weights_and_wakes_whole(fake_vllm, model_dir, tokenizer, monkeypatch):
    import torch

    import agents.vllm_policy as vp

    monkeypatch.setattr(fake_vllm, "LLM", fake_vllm.LLMWithoutTags)  # a vLLM whose wake_up takes no tags
    policy = VLLMPolicy(model_dir, tokenizer)
    monkeypatch.setattr(vp, "_empty_cache", lambda: _core_events(policy).append("empty_cache"))
    policy.sleep()
    policy.load_weights(torch.nn.Linear(2, 2).named_parameters())
    assert _core_events(policy) == [("sleep", 1), "empty_cache", "empty_cache", ("wake_up", None), "load",
                                    "reset_prefix_cache"]


def test_act_on_a_sleeping_engine_wakes_it_or_refuses_without_weights(fake_vllm, model_dir, tokenizer,
                                                                      monkeypatch):
    """B2: level 1 keeps the weights, so act wakes the engine and generates; after level 2
    the engine has none until load_weights, and act says so instead of generating garbage."""
    policy = VLLMPolicy(model_dir, tokenizer)
    policy.sleep()
    with pytest.raises(RuntimeError, match="level 2"):
        policy.act([_obs(tokenizer, "Q?")])
    policy.close()
    monkeypatch.setattr(fake_vllm, "LLM", fake_vllm.LLMWithoutTags)
    policy = VLLMPolicy(model_dir, tokenizer)
    policy.sleep()
    [action] = policy.act([_obs(tokenizer, "Q?")])
    assert action.token_ids == [tokenizer.eos_token_id] and not policy.sleeping


def test_engine_settings_are_read_off_engine_args_and_raw_logprobs_are_not_passed_off(
        fake_vllm, model_dir, tokenizer, monkeypatch):
    """C1 + W3: ``logprobs_mode`` is asked for where ``vllm.EngineArgs`` has it (not found by
    retrying on any TypeError); without it the behaviour log-probs are None, not raw ones."""
    policy = VLLMPolicy(model_dir, tokenizer, temperature=0.7, max_model_len=320)
    assert fake_vllm.BUILT[-1]["logprobs_mode"] == "processed_logprobs"
    assert fake_vllm.BUILT[-1]["max_model_len"] == 320 and fake_vllm.BUILT[-1]["enable_sleep_mode"] is True
    assert policy.act([_obs(tokenizer, "Q?")])[0].logprobs == [-0.25]
    policy.close()
    monkeypatch.setattr(fake_vllm, "EngineArgs", fake_vllm.EngineArgsBefore0102)
    old = VLLMPolicy(model_dir, tokenizer, temperature=0.7)
    assert "logprobs_mode" not in fake_vllm.BUILT[-1]
    [action] = old.act([_obs(tokenizer, "Q?")])
    assert action.token_ids == [tokenizer.eos_token_id] and action.logprobs is None
    old.close()
    built = len(fake_vllm.BUILT)
    with pytest.raises(ValueError, match=r"no engine setting \['max_num_seqz'\]"):
        VLLMPolicy(model_dir, tokenizer, max_num_seqz=8)
    calls = []

    def failing_build(self, model, **kwargs):
        calls.append(kwargs)
        raise TypeError("raised deep inside the engine's build")

    monkeypatch.setattr(fake_vllm.LLM, "__init__", failing_build)
    with pytest.raises(TypeError, match="deep inside"):
        VLLMPolicy(model_dir, tokenizer)
    assert len(calls) == 1 and len(fake_vllm.BUILT) == built  # not retried without logprobs_mode


def test_close_shuts_the_engine_down_so_the_next_one_can_be_built(fake_vllm, model_dir, tokenizer):
    """B3: vLLM allows one sleep-mode engine per process (the fake asserts as vLLM does)."""
    first = VLLMPolicy(model_dir, tokenizer)
    with pytest.raises(AssertionError, match="one instance per process"):
        VLLMPolicy(model_dir, tokenizer)
    first.close()
    assert first.engine is None
    second = VLLMPolicy(model_dir, tokenizer)
    assert second.act([_obs(tokenizer, "Q?")])[0].token_ids == [tokenizer.eos_token_id]
    second.close()


def test_where_the_platform_has_no_sleep_mode_the_engine_stays_awake_and_says_so(
        fake_vllm, model_dir, tokenizer, monkeypatch, capsys):
    """vLLM's CPU build: sleep mode is refused by vLLM itself there, so it is not asked for;
    the policy cannot sleep, one line says so, and what it was built with says it too.
    Asking for it anyway is refused in one line."""
    from types import SimpleNamespace

    cpu = SimpleNamespace(is_cpu=lambda: True, is_sleep_mode_available=lambda: False)
    monkeypatch.setattr(fake_vllm, "platforms", SimpleNamespace(current_platform=cpu), raising=False)
    policy = VLLMPolicy(model_dir, tokenizer)
    assert "enable_sleep_mode" not in fake_vllm.BUILT[-1]  # vLLM refuses it on such a platform
    assert policy.can_sleep is False and policy.engine_info["sleep_mode"] is False
    assert policy.engine_info["platform"] == "cpu"
    assert capsys.readouterr().err.count("sleep mode is CUDA-only") == 1
    policy.close()
    with pytest.raises(ValueError, match="no sleep mode on this platform"):
        VLLMPolicy(model_dir, tokenizer, enable_sleep_mode=True)
    off = VLLMPolicy(model_dir, tokenizer, enable_sleep_mode=False)  # a CUDA user may turn it off too
    assert off.can_sleep is False
    off.close()
