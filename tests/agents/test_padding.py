"""Token padding: the exact batches every padding site builds (issue 18).

Each site is pinned by the tensors it hands to the model (ids, attention mask, position
ids, their dtypes), written out by hand for a few ragged inputs: a cached model's training
results depend on those batches bit for bit.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from agents.base import Observation
from agents.hf import HFPolicy
from agents.logprobs import pad_batch, sequence_logprobs, token_logprobs
from agents.models import tiny_causal_lm
from algos.batch import Row, pad_rows, score_rows
from benchmarks.perf.baselines import bare_generate, minimal_decode

pytestmark = pytest.mark.usefixtures("torch_one_thread")

VOCAB = 40
L = torch.long


class SmallTokenizer:
    """Enough of a tokenizer for HFPolicy: letters, an EOS and a pad id."""

    def __init__(self, pad_token_id, eos_token_id=1):
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + i % 26) for i in ids)


@pytest.fixture(scope="module")
def small_model():
    return tiny_causal_lm(VOCAB, hidden_size=16, num_layers=1, num_heads=2, seed=3)


def record_inputs(module):
    """The keyword arguments of every forward call of ``module``, in order (tensors copied)."""
    calls = []

    def hook(mod, args, kwargs):
        calls.append({k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})

    return calls, module.register_forward_pre_hook(hook, with_kwargs=True)


def assert_same(actual, expected):
    """Same values, shape and dtype (torch.equal alone ignores the dtype)."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.equal(actual, expected), (actual, expected)


def t(rows, dtype=L):
    return torch.tensor(rows, dtype=dtype)


def ids(values):
    return np.asarray(values, dtype=np.int64)


# ---------------------------------------------------------------------- the call sites


@pytest.mark.parametrize("pad, expected_pad", [(5, 5), (None, 1)])  # no pad token: EOS pads
def test_hf_policy_prefill_is_left_padded_with_the_pad_token(small_model, pad, expected_pad):
    policy = HFPolicy(small_model, SmallTokenizer(pad), seed=0, batch_size=8, temperature=0)
    calls, handle = record_inputs(small_model)
    try:
        policy.act([Observation(agent="a", role="searcher", token_ids=ids(p), max_new_tokens=2)
                    for p in ([11, 12, 13], [21], [31, 32])])
    finally:
        handle.remove()
    prefill = calls[0]  # rows longest first: [11 12 13], [31 32], [21]
    p = expected_pad
    assert_same(prefill["input_ids"], t([[11, 12, 13], [p, 31, 32], [p, p, 21]]))
    assert_same(prefill["attention_mask"], t([[1, 1, 1], [0, 1, 1], [0, 0, 1]]))
    assert_same(prefill["position_ids"], t([[0, 1, 2], [0, 0, 1], [0, 0, 0]]))
    assert calls[1]["input_ids"].shape == (3, 1)  # then one token per step
    assert_same(calls[1]["position_ids"], t([[3], [2], [1]]))


def test_sequence_logprobs_scores_right_padded_batches(small_model):
    seqs = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    calls, handle = record_inputs(small_model.get_decoder())
    try:
        scored = sequence_logprobs(small_model, seqs, [1, 1, 2], batch_size=2)
    finally:
        handle.remove()
    assert len(calls) == 2
    first_ids, first_mask = t([[1, 2, 3], [4, 5, 0]]), t([[1, 1, 1], [1, 1, 0]])
    assert_same(calls[0]["input_ids"], first_ids)
    assert_same(calls[0]["attention_mask"], first_mask)
    assert_same(calls[0]["position_ids"], t([[0, 1, 2], [0, 1, 1]]))
    assert_same(calls[1]["input_ids"], t([[6, 7, 8, 9]]))
    assert_same(calls[1]["attention_mask"], t([[1, 1, 1, 1]]))
    assert_same(calls[1]["position_ids"], t([[0, 1, 2, 3]]))
    # the log-probs are those of exactly that batch and those targets
    with torch.no_grad():
        first = token_logprobs(small_model, first_ids, first_mask,
                               t([[0, 1, 1], [0, 1, 0]], torch.bool)).numpy()
    assert [len(s) for s in scored] == [2, 1, 2]
    assert np.array_equal(np.concatenate(scored[:2]), first)


def test_pad_rows_right_pads_ids_mask_and_targets():
    rows = [Row([3, 4, 5], [1, 1, 0]), Row([6], [1]), Row([7, 8], [0, 1])]
    input_ids, attention, targets = pad_rows(rows, pad_id=9)
    assert_same(input_ids, t([[3, 4, 5], [6, 9, 9], [7, 8, 9]]))
    assert_same(attention, t([[1, 1, 1], [1, 0, 0], [1, 1, 0]]))
    assert_same(targets, t([[0, 1, 0], [0, 0, 0], [0, 1, 0]], torch.bool))  # column 0 never
    default_pad, _, _ = pad_rows(rows)
    assert_same(default_pad, t([[3, 4, 5], [6, 0, 0], [7, 8, 0]]))


def test_score_rows_feeds_pad_rows_batches(small_model):
    rows = [Row([3, 4, 5, 6], [0, 0, 1, 1]), Row([7, 8], [0, 1])]
    calls, handle = record_inputs(small_model.get_decoder())
    try:
        scored = score_rows(small_model, rows, pad_id=9)
    finally:
        handle.remove()
    assert len(calls) == 1  # shortest row first
    assert_same(calls[0]["input_ids"], t([[7, 8, 9, 9], [3, 4, 5, 6]]))
    assert_same(calls[0]["attention_mask"], t([[1, 1, 0, 0], [1, 1, 1, 1]]))
    assert_same(calls[0]["position_ids"], t([[0, 1, 1, 1], [0, 1, 2, 3]]))
    assert [len(s) for s in scored] == [2, 1]


def test_prompted_critic_left_pads_with_zero(tokenizer):
    from algos.critic import PromptedCritic

    model = tiny_causal_lm(len(tokenizer), hidden_size=16, num_layers=1, num_heads=2, seed=4)
    critic = PromptedCritic(model, tokenizer, batch_size=2)
    prompts = {"a": [11, 12, 13], "b": [21], "c": [31, 32]}
    critic.prompt = lambda question, task, report: prompts[question]
    calls, handle = record_inputs(model)
    try:
        scores = critic.scores([("a", "", ""), ("b", "", ""), ("c", "", "")])
    finally:
        handle.remove()
    assert len(calls) == 2  # batches in the given order, padded with 0 (not the pad token)
    batch_ids, batch_mask = t([[11, 12, 13], [0, 0, 21]]), t([[1, 1, 1], [0, 0, 1]])
    batch_pos = t([[0, 1, 2], [0, 0, 0]])
    assert_same(calls[0]["input_ids"], batch_ids)
    assert_same(calls[0]["attention_mask"], batch_mask)
    assert_same(calls[0]["position_ids"], batch_pos)
    assert_same(calls[1]["input_ids"], t([[31, 32]]))
    assert_same(calls[1]["attention_mask"], t([[1, 1]]))
    assert_same(calls[1]["position_ids"], t([[0, 1]]))
    with torch.no_grad():
        logits = model(input_ids=batch_ids, attention_mask=batch_mask, position_ids=batch_pos).logits[:, -1].float()
    pair = torch.stack([logits[:, critic.yes], logits[:, critic.no]], -1).softmax(-1)
    assert scores[:2] == pair[:, 0].tolist()


RECORDED = [([ids([11, 12]), ids([21, 22, 23]), ids([31]), ids([41, 42])], [2, 1, 3, 0])]
"""One recorded policy call: four prompts and how many tokens each turn had."""


def test_minimal_decode_prefill_is_left_padded(small_model):
    calls, handle = record_inputs(small_model)
    try:
        tokens = minimal_decode(small_model, RECORDED, batch_size=2, pad_id=9, temperature=0.0,
                                top_p=1.0, seed=0)
    finally:
        handle.remove()
    assert [len(x) for x in tokens[0]] == [2, 1, 3, 0]
    prefills = [c for c in calls if "logits_to_keep" in c]  # the steps pass the cache instead
    # longest first: [21 22 23] with [11 12]; then [31] alone ([41 42] has no tokens)
    assert len(prefills) == 2
    assert_same(prefills[0]["input_ids"], t([[21, 22, 23], [9, 11, 12]]))
    assert_same(prefills[0]["attention_mask"], t([[1, 1, 1], [0, 1, 1]]))
    assert_same(prefills[0]["position_ids"], t([[0, 1, 2], [0, 0, 1]]))
    assert_same(prefills[1]["input_ids"], t([[31]]))
    assert_same(prefills[1]["attention_mask"], t([[1]]))
    assert_same(prefills[1]["position_ids"], t([[0]]))


def test_bare_generate_left_pads(small_model, monkeypatch):
    seen = []
    monkeypatch.setattr(small_model, "generate",
                        lambda input_ids, **kw: seen.append((input_ids, kw["attention_mask"], kw)),
                        raising=False)
    bare_generate(small_model, RECORDED, batch_size=2, pad_id=9, eos_id=1)
    # longest first: [21 22 23] with [11 12]; then [41 42] with [31]
    assert len(seen) == 2
    assert_same(seen[0][0], t([[21, 22, 23], [9, 11, 12]]))
    assert_same(seen[0][1], t([[1, 1, 1], [0, 1, 1]]))
    assert seen[0][2]["max_new_tokens"] == 2
    assert_same(seen[1][0], t([[41, 42], [9, 31]]))
    assert_same(seen[1][1], t([[1, 1], [0, 1]]))
    assert seen[1][2]["max_new_tokens"] == 3


# ---------------------------------------------------------------------- the helper


def test_pad_batch_right():
    batch_ids, mask, pos = pad_batch([[3, 4, 5], np.array([6]), torch.tensor([7, 8])], 9)
    assert_same(batch_ids, t([[3, 4, 5], [6, 9, 9], [7, 8, 9]]))
    assert_same(mask, t([[1, 1, 1], [1, 0, 0], [1, 1, 0]]))
    assert_same(pos, t([[0, 1, 2], [0, 0, 0], [0, 1, 1]]))  # a right pad repeats the last position


def test_pad_batch_left():
    batch_ids, mask, pos = pad_batch([[3, 4, 5], np.array([6]), torch.tensor([7, 8])], 9, "left")
    assert_same(batch_ids, t([[3, 4, 5], [9, 9, 6], [9, 7, 8]]))
    assert_same(mask, t([[1, 1, 1], [0, 0, 1], [0, 1, 1]]))
    assert_same(pos, t([[0, 1, 2], [0, 0, 0], [0, 0, 1]]))


def test_pad_batch_of_flags_and_empty_rows():
    flags = [np.array([False, True, True]), np.array([], dtype=bool), np.array([True])]
    padded, mask, _ = pad_batch(flags, False, dtype=torch.bool)
    assert_same(padded, t([[0, 1, 1], [0, 0, 0], [1, 0, 0]], torch.bool))
    assert_same(mask, t([[1, 1, 1], [0, 0, 0], [1, 0, 0]]))
    left, _, _ = pad_batch(flags, True, "left", dtype=torch.bool)
    assert_same(left, t([[0, 1, 1], [1, 1, 1], [1, 1, 1]], torch.bool))


def test_pad_batch_refuses_nothing_and_unknown_sides():
    with pytest.raises(ValueError, match="no sequences"):
        pad_batch([], 0)
    with pytest.raises(ValueError, match="side"):
        pad_batch([[1]], 0, "middle")
