"""The performance work of issue 21 changes no value: chunked log-probs give the plain
forward + cross_entropy's losses and gradients, the decoding step draws the tokens the
full-vocabulary inverse CDF draws, HFPolicy generates what a bare KV-cache loop generates,
and the retriever's index kind is one setting. No test asserts a timing (the ratios are
``python -m benchmarks perf``'s)."""

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from agents.base import Observation
from agents.hf import HFPolicy
from agents.logprobs import next_tokens, sample_from_weights, token_logprobs
from agents.models import tiny_causal_lm

VOCAB = 1000


@pytest.fixture(scope="module")
def batch():
    """Left- and right-padded rows with targets in the middle of each."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (3, 40), generator=g)
    att = torch.ones(3, 40, dtype=torch.long)
    att[0, 31:] = 0  # right padding
    att[2, :6] = 0  # left padding
    targets = att.bool().clone()
    targets[:, :10] = False
    return ids, att, targets


def reference_loss_and_grads(model, ids, att, targets, weights, temperature):
    """Independent of agents.logprobs: the model's own full logits, ``cross_entropy``, backward."""
    model.zero_grad(set_to_none=True)
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=att, position_ids=pos).logits.float()  # (B, T, V)
    predicted = logits[:, :-1][targets[:, 1:]] / temperature  # (N, V)
    nll = torch.nn.functional.cross_entropy(predicted, ids[:, 1:][targets[:, 1:]], reduction="none")
    loss = (nll * weights).sum()
    loss.backward()
    return -nll.detach(), loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_have_the_losses_and_gradients_of_cross_entropy(batch, tied, temperature):
    ids, att, targets = batch
    model = tiny_causal_lm(VOCAB, seed=1, initializer_range=0.1, tie_word_embeddings=tied)
    model.train()
    n = int(targets.sum())
    weights = torch.linspace(-1, 2, n)
    ref_logp, ref_loss, ref_grads = reference_loss_and_grads(model, ids, att, targets, weights, temperature)
    model.zero_grad(set_to_none=True)
    chunk_rows = 7  # n = 78 rows: 12 chunks, the last one short
    logp = token_logprobs(model, ids, att, targets, temperature, chunk_elements=chunk_rows * VOCAB)
    loss = (logp * weights).sum()  # = -(reference loss)
    loss.backward()
    torch.testing.assert_close(logp.detach(), ref_logp, rtol=1e-6, atol=1e-6)
    assert abs(float(loss.detach()) - float(-ref_loss)) <= 1e-6 * abs(float(ref_loss))
    for name, param in model.named_parameters():
        # d(sum w*logp) = -d(sum w*nll): compare against the reference's negated gradient
        ref = -ref_grads[name]
        rel = float((param.grad - ref).norm() / ref.norm().clamp_min(1e-30))
        assert rel <= 1e-6, (name, rel)


class LargestVocabTensor(TorchDispatchMode):
    """Records the most rows of any (rows, V) tensor an op writes (views of the
    parameters, such as the output layer's transposed weight, are not written)."""

    def __init__(self, vocab, model):
        super().__init__()
        self.vocab, self.rows = vocab, 0
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if (isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[1] == self.vocab
                    and t.untyped_storage().data_ptr() not in self.params):
                self.rows = max(self.rows, t.shape[0])
        return out


def test_the_learner_never_holds_logits_for_every_trained_token(batch):
    ids, att, targets = batch
    model = tiny_causal_lm(VOCAB, seed=1)
    model.train()
    n = int(targets.sum())
    for chunk_elements, most_rows in ((0, n), (5 * VOCAB, 5)):
        watch = LargestVocabTensor(VOCAB, model)
        with watch:
            token_logprobs(model, ids, att, targets, chunk_elements=chunk_elements).sum().backward()
        assert watch.rows == most_rows, (chunk_elements, watch.rows)


def full_cdf_sample(weights, generator):
    """The old sampler: one float64 cumulative sum over the whole vocabulary."""
    cdf = weights.double().cumsum(-1)
    total = cdf[:, -1:]
    u = torch.rand(total.shape, generator=generator, dtype=torch.float64)
    u = torch.minimum((u * total).clamp_min(torch.finfo(torch.float64).tiny), total)
    return torch.searchsorted(cdf, u).squeeze(-1)


@pytest.mark.parametrize("vocab", [7, 256, 1000, 49152])
def test_two_level_sampler_draws_what_the_full_cdf_draws(vocab):
    logits = torch.randn(64, vocab, generator=torch.Generator().manual_seed(vocab)) * 4
    logits[:, ::3] = float("-inf")  # weight 0: never drawn
    weights = logits.softmax(-1)
    for seed in range(5):
        new = sample_from_weights(weights, torch.Generator().manual_seed(seed))
        old = full_cdf_sample(weights, torch.Generator().manual_seed(seed))
        assert torch.equal(new, old)
        assert bool((weights.gather(-1, new[:, None]) > 0).all())


def test_next_tokens_log_probs_are_the_log_softmax_of_the_chosen_tokens():
    logits = torch.randn(8, 500, generator=torch.Generator().manual_seed(3)) * 3
    for temperature in (0.0, 1.0, 0.6):
        tokens, logp = next_tokens(logits, temperature, 1.0, torch.Generator().manual_seed(0))
        full = (logits / (temperature or 1.0)).log_softmax(-1)
        if temperature == 0:
            assert torch.equal(tokens, logits.argmax(-1))
        torch.testing.assert_close(logp, full.gather(-1, tokens[:, None]).squeeze(-1), rtol=0, atol=1e-6)


def bare_decode(model, prompt, steps, temperature, seed):
    """A minimal KV-cache loop for one prompt, written here: prefill, then one token at a time."""
    generator = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        tokens, logps = [], []
        for _ in range(steps):
            token, logp = next_tokens(out.logits[:, -1], temperature, 1.0, generator)
            tokens.append(int(token))
            logps.append(float(logp))
            out = model(input_ids=token[:, None], cache=out.cache, use_cache=True)
    return tokens, logps


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_policy_generates_what_a_bare_kv_cache_loop_generates(temperature):
    model = tiny_causal_lm(VOCAB, seed=2, initializer_range=0.1)

    class Tok:  # the policy needs only ids and decoding here
        eos_token_id = VOCAB + 5
        pad_token_id = 0

        def decode(self, ids, skip_special_tokens=False):
            return " ".join(map(str, ids))

    prompt = [5, 17, 256, 9, 31]
    policy = HFPolicy(model, Tok(), temperature=temperature, seed=4, max_new_tokens=12)
    obs = Observation(agent="leader_0", role="leader", token_ids=np.array(prompt), env_index=0,
                      max_new_tokens=12, stop=())
    [action] = policy.act([obs])
    tokens, logps = bare_decode(model, prompt, 12, temperature, seed=4)
    assert action.token_ids == tokens
    np.testing.assert_allclose(action.logprobs, logps, rtol=0, atol=1e-5)


def test_stop_strings_decode_only_tokens_that_can_complete_one():
    model = tiny_causal_lm(16, seed=2)  # 16 ids: 40 tokens repeat some

    class Tok:
        eos_token_id = 99
        pad_token_id = 0
        calls = 0

        def decode(self, ids, skip_special_tokens=False):
            Tok.calls += 1
            return "".join(chr(0x4E00 + i) for i in ids)  # one character per token

    policy = HFPolicy(model, Tok(), temperature=1.0, seed=0, max_new_tokens=40)
    obs = Observation(agent="leader_0", role="leader", token_ids=np.array([1, 2, 3]), env_index=0,
                      max_new_tokens=40, stop=("</never>",))
    [action] = policy.act([obs])
    assert len(action.token_ids) == 40
    # one decode per distinct token id (its own text; the 40th ends the turn by its budget
    # first) plus the action's text: not one per step
    assert Tok.calls == len(set(action.token_ids[:-1])) + 1 < 40
    # a stop string that the sampled tokens do complete still ends the turn at that token
    k = 9
    stop = Tok().decode(action.token_ids[k - 1 : k + 1])
    policy = HFPolicy(model, Tok(), temperature=1.0, seed=0, max_new_tokens=40)
    obs = Observation(agent="leader_0", role="leader", token_ids=np.array([1, 2, 3]), env_index=0,
                      max_new_tokens=40, stop=(stop,))
    [stopped] = policy.act([obs])
    first = next(j for j in range(40) if stop in Tok().decode(action.token_ids[: j + 1]))
    assert stopped.token_ids == action.token_ids[: first + 1]


def test_index_kind_is_a_setting_with_an_automatic_default(tmp_path, monkeypatch):
    from algos.config import TrainConfig
    from envs.retrieval import dense
    from envs.retrieval.factory import make_retriever

    class RandomVectors(dense.DenseRetriever):
        def _load_or_encode_passages(self):
            v = np.random.default_rng(0).standard_normal((len(self.passages), 8)).astype(np.float32)
            return v / np.linalg.norm(v, axis=1, keepdims=True), True

    rows = [{"id": str(i), "contents": f"T{i}\ntext {i}"} for i in range(200)]
    assert RandomVectors(rows, cache_dir=tmp_path).index_kind == "flat"
    monkeypatch.setattr(dense, "AUTO_APPROXIMATE_FROM", 150)
    assert RandomVectors(rows, cache_dir=tmp_path).index_kind == "hnsw"
    assert RandomVectors(rows, cache_dir=tmp_path, index="flat").index_kind == "flat"
    with pytest.raises(ValueError, match="a server chooses its own index"):
        make_retriever("http://localhost:1", index="hnsw")
    with pytest.raises(ValueError, match="retriever index 'fast'"):
        make_retriever(tmp_path / "c.jsonl", index="fast")
    with pytest.raises(ValueError, match="retriever_index"):
        TrainConfig(teacher="base", retriever_index="fast")
