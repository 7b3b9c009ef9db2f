"""HFPolicy: exact behaviour log-probs, turn endings, reproducibility; sequence_logprobs."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from agents.base import Observation, Policy
from agents.hf import HFPolicy
from agents.logprobs import nucleus_logprobs, sample_from_logprobs, sequence_logprobs
from agents.models import tiny_causal_lm
from envs.tokenizer import load_tokenizer

SMOLLM2_EOS = 2


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    # initializer_range 0.2: peaked enough that top-p really truncates (~7k of 49k tokens
    # in the nucleus) and greedy choices are far from ties.
    return tiny_causal_lm(len(tokenizer), eos_token_id=SMOLLM2_EOS, initializer_range=0.2)


class CharTokenizer:
    """A stand-in tokenizer for small vocabularies: token i is one letter."""

    pad_token_id = 0

    def __init__(self, eos_token_id: int):
        self.eos_token_id = eos_token_id

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + i % 26) for i in ids)


def make_obs(token_ids, max_new_tokens=256, stop=()):
    return Observation(
        agent="searcher_0",
        role="searcher",
        token_ids=np.asarray(token_ids, dtype=np.int64),
        stop=tuple(stop),
        max_new_tokens=max_new_tokens,
    )


def random_prompts(lengths, vocab=49152, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, size=n) for n in lengths]


def teacher_forced_logits(model, prompt, generated):
    seq = torch.tensor(np.concatenate([prompt, generated]))[None]
    with torch.no_grad():
        logits = model(seq).logits[0].double()
    return logits[len(prompt) - 1 : len(seq[0]) - 1]  # row k predicts generated[k]


def test_logprobs_equal_teacher_forced_scoring_under_left_padding(model, tokenizer):
    prompts = random_prompts([5, 23, 11, 2])
    budgets = [12, 20, 7, 16]  # rows finish at different steps, so the batch shrinks
    policy = HFPolicy(model, tokenizer, seed=1, batch_size=8)
    assert isinstance(policy, Policy)
    actions = policy.act([make_obs(p, m) for p, m in zip(prompts, budgets, strict=True)])

    assert [len(a.token_ids) for a in actions] == budgets
    seqs = [np.concatenate([p, a.token_ids]) for p, a in zip(prompts, actions, strict=True)]
    starts = [len(p) for p in prompts]
    scored = sequence_logprobs(model, seqs, starts, batch_size=4)
    for action, ref in zip(actions, scored, strict=True):
        assert len(action.logprobs) == len(ref)
        np.testing.assert_allclose(action.logprobs, ref, atol=1e-4, rtol=0)
    # right padding does not change the scores either
    alone = sequence_logprobs(model, seqs, starts, batch_size=1)
    for a, b in zip(scored, alone, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_logprobs_are_those_of_the_tempered_nucleus(model, tokenizer):
    temperature, top_p = 0.7, 0.9
    prompts = random_prompts([6, 14, 3], seed=1)
    policy = HFPolicy(model, tokenizer, temperature=temperature, top_p=top_p, seed=3)
    actions = policy.act([make_obs(p, 10) for p in prompts])

    for prompt, action in zip(prompts, actions, strict=True):
        logits = teacher_forced_logits(model, prompt, action.token_ids).numpy()
        for k, token in enumerate(action.token_ids):
            z = logits[k] / temperature
            p = np.exp(z - z.max())
            p /= p.sum()
            order = np.argsort(-p, kind="stable")
            mass_before = np.cumsum(p[order]) - p[order]
            nucleus = order[mass_before < top_p]
            assert 1 < len(nucleus) < len(p) // 2  # truncation actually happens
            assert token in nucleus
            expected = np.log(p[token] / p[nucleus].sum())
            assert abs(action.logprobs[k] - expected) < 1e-4


def test_nucleus_keeps_the_top_token_and_renormalises():
    logp = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.97, 0.01, 0.01, 0.01]]))
    out = nucleus_logprobs(logp, 0.8)
    np.testing.assert_allclose(out.exp()[0].numpy(), [0.625, 0.375, 0, 0], atol=1e-6)
    np.testing.assert_allclose(out.exp()[1].numpy(), [1, 0, 0, 0], atol=1e-6)


def test_sampling_draws_from_the_given_distribution():
    probs = torch.tensor([0.0, 0.5, 0.2, 0.0, 0.3])
    logp = probs.log().expand(20_000, -1)
    tokens = sample_from_logprobs(logp, torch.Generator().manual_seed(0))
    freq = np.bincount(tokens.numpy(), minlength=5) / len(tokens)
    assert freq[0] == freq[3] == 0
    np.testing.assert_allclose(freq, probs.numpy(), atol=0.015)


def test_stop_string_ends_the_turn_at_the_completing_token(model, tokenizer):
    prompt = random_prompts([9], seed=2)[0]
    greedy = HFPolicy(model, tokenizer, temperature=0, max_new_tokens=30)
    full = greedy.act([make_obs(prompt)])[0].token_ids
    assert len(full) == 30
    # a stop string that straddles two generated tokens, from the middle of the turn
    pieces = [tokenizer.decode([t]) for t in full]
    k = next(i for i in range(8, 28) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2)
    stop = pieces[k][-1] + pieces[k + 1][:1]
    expected_end = next(j for j in range(len(full)) if stop in tokenizer.decode(full[: j + 1]))
    assert expected_end <= k + 1

    [action] = greedy.act([make_obs(prompt, stop=("never-generated-xyz", stop))])
    assert list(action.token_ids) == list(full[: expected_end + 1])
    assert stop in action.text and stop not in tokenizer.decode(action.token_ids[:-1])


def test_stop_string_in_the_prompt_does_not_end_the_turn(model, tokenizer):
    prompt = random_prompts([12], seed=4)[0]
    greedy = HFPolicy(model, tokenizer, temperature=0, max_new_tokens=15)
    full = greedy.act([make_obs(prompt)])[0]
    stop = tokenizer.decode(prompt[3:5])
    assert stop not in full.text
    [action] = greedy.act([make_obs(prompt, stop=(stop,))])
    assert list(action.token_ids) == list(full.token_ids)


def test_eos_ends_the_turn_and_is_kept():
    vocab = 64
    small = tiny_causal_lm(vocab, initializer_range=0.2, seed=5)
    prompt = random_prompts([7], vocab=vocab, seed=5)[0]
    never = CharTokenizer(eos_token_id=vocab + 1)  # an EOS the model cannot produce
    full = HFPolicy(small, never, temperature=0, max_new_tokens=20).act([make_obs(prompt)])[0]
    full_ids = list(full.token_ids)
    k = next(i for i in range(1, 20) if full_ids[i] not in full_ids[:i])
    eos = full_ids[k]

    policy = HFPolicy(small, CharTokenizer(eos_token_id=eos), temperature=0, max_new_tokens=20)
    other = random_prompts([4], vocab=vocab, seed=6)[0]
    action, _ = policy.act([make_obs(prompt), make_obs(other)])
    assert list(action.token_ids) == full_ids[: k + 1]
    assert action.token_ids[-1] == eos
    np.testing.assert_allclose(action.logprobs, full.logprobs[: k + 1], atol=1e-5)


def test_max_new_tokens_per_observation(model, tokenizer):
    prompts = random_prompts([4, 8, 6, 5], seed=7)
    policy = HFPolicy(model, tokenizer, max_new_tokens=5, seed=0)
    actions = policy.act([make_obs(p, m) for p, m in zip(prompts, [3, 9, 0, 5], strict=True)])
    assert [len(a.token_ids) for a in actions] == [3, 5, 0, 5]
    assert [len(a.logprobs) for a in actions] == [3, 5, 0, 5]
    assert actions[2].text == ""


def test_same_seed_same_tokens(model, tokenizer):
    prompts = random_prompts([5, 9], seed=8)
    obs = [make_obs(p, 12) for p in prompts]
    first = HFPolicy(model, tokenizer, seed=11).act(obs)
    again = HFPolicy(model, tokenizer, seed=11).act(obs)
    other = HFPolicy(model, tokenizer, seed=12).act(obs)
    assert [list(a.token_ids) for a in first] == [list(a.token_ids) for a in again]
    assert [a.logprobs for a in first] == [a.logprobs for a in again]
    assert [list(a.token_ids) for a in first] != [list(a.token_ids) for a in other]


def test_greedy_batch_equals_one_at_a_time(model, tokenizer):
    prompts = random_prompts([3, 17, 8], seed=9)
    obs = [make_obs(p, 14) for p in prompts]
    batched = HFPolicy(model, tokenizer, temperature=0, batch_size=3).act(obs)
    policy = HFPolicy(model, tokenizer, temperature=0, batch_size=1)
    single = [policy.act([o])[0] for o in obs]
    for a, b in zip(batched, single, strict=True):
        assert list(a.token_ids) == list(b.token_ids)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
        assert a.text == b.text == tokenizer.decode(a.token_ids)
    # greedy log-probs are the plain (temperature 1) ones
    scored = sequence_logprobs(
        model,
        [np.concatenate([p, a.token_ids]) for p, a in zip(prompts, batched, strict=True)],
        [len(p) for p in prompts],
    )
    for a, ref in zip(batched, scored, strict=True):
        np.testing.assert_allclose(a.logprobs, ref, atol=1e-4)


def test_invalid_arguments_are_refused(model, tokenizer):
    with pytest.raises(ValueError, match="tokenizer"):
        HFPolicy(model)
    with pytest.raises(ValueError, match="top_p"):
        HFPolicy(model, tokenizer, top_p=0)
    with pytest.raises(ValueError, match="empty context"):
        HFPolicy(model, tokenizer).act([make_obs([])])
    with pytest.raises(ValueError, match="start 0"):
        sequence_logprobs(model, [[5, 6, 7]], [0])


@pytest.mark.slow
def test_smollm2_answers_a_chat_prompt():
    from agents.models import load_causal_lm

    model, tokenizer = load_causal_lm("smollm2")
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    policy = HFPolicy(model, tokenizer, temperature=0, max_new_tokens=16)
    [action] = policy.act([make_obs(ids)])
    assert action.text.strip()
    assert "paris" in action.text.lower()
    logprobs = np.asarray(action.logprobs)
    assert np.isfinite(logprobs).all() and (logprobs <= 0).all()
    [ref] = sequence_logprobs(model, [list(ids) + list(action.token_ids)], [len(ids)])
    np.testing.assert_allclose(logprobs, ref, atol=1e-3)


def test_the_perf_baselines_legacy_decoding_runs_its_own_step(model, tokenizer, monkeypatch):
    """``benchmarks.perf.baselines.legacy_policy`` is the "before" of the decode figures: it
    must draw through its full-CDF step (a searchsorted over the whole vocabulary), not
    today's ``next_tokens`` (once it did, silently, and the figure compared a step with
    itself); and today's step is back in place afterwards."""
    import agents.hf
    from benchmarks.perf.baselines import legacy_policy

    searched = []
    real = torch.searchsorted
    monkeypatch.setattr(torch, "searchsorted", lambda cdf, *a, **kw: searched.append((cdf.shape[-1], cdf.dtype))
                        or real(cdf, *a, **kw))
    today = agents.hf.next_tokens
    prompts = random_prompts([5, 9], seed=2)
    before = legacy_policy(HFPolicy(model, tokenizer, temperature=0.7, seed=4, max_new_tokens=6))
    legacy = before.act([make_obs(p, 6) for p in prompts])
    full_cdf = (len(tokenizer), torch.float64)  # one draw a step, over the whole vocabulary
    assert searched == [full_cdf] * max(len(a.token_ids) for a in legacy) and agents.hf.next_tokens is today
    searched.clear()
    now = HFPolicy(model, tokenizer, temperature=0.7, seed=4, max_new_tokens=6).act([make_obs(p, 6) for p in prompts])
    assert now and full_cdf not in searched  # today's step searches only the nucleus' head
