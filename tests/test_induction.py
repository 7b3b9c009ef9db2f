"""The hand-wired copy circuit (agents.induction): it copies at initialisation, its
previous-token heads look exactly one position back, it survives save/load, and models it
cannot wire are refused with the reason."""

import pytest
import torch

from agents.induction import ROPE_THETA, wire_induction_heads
from agents.models import tiny_causal_lm

VOCAB = 2048


def _model(wired: bool = True, **overrides):
    kwargs = dict(hidden_size=256, num_layers=2, num_heads=8, max_position_embeddings=2048,
                  tie_word_embeddings=True, attention_bias=True, rope_theta=ROPE_THETA, seed=0)
    kwargs.update(overrides)
    model = tiny_causal_lm(VOCAB, **kwargs)
    return wire_induction_heads(model) if wired else model


def _repeats(batch: int = 4, length: int = 600, span: int = 20, gap: int = 30):
    """Random tokens in which each span of ``span`` tokens comes back ``span + gap`` later;
    the mask marks the targets a copier can predict (a repeat's 2nd token on)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(10, VOCAB, (batch, length), generator=g)
    mask = torch.zeros(batch, length - 1, dtype=torch.bool)
    for start in range(0, length - 2 * span - gap, 2 * span + gap):
        again = start + span + gap
        ids[:, again:again + span] = ids[:, start:start + span]
        mask[:, again:again + span - 1] = True  # target index t predicts ids[t + 1]
    return ids, mask


def _copy_accuracy(model) -> float:
    ids, mask = _repeats()
    with torch.no_grad():
        pred = model(ids).logits[:, :-1].argmax(-1)
    return float((pred == ids[:, 1:])[mask].float().mean())


def test_wired_model_copies_at_initialisation_and_a_plain_one_does_not():
    assert _copy_accuracy(_model(wired=True)) > 0.9
    assert _copy_accuracy(_model(wired=False)) < 0.02


def test_previous_token_heads_attend_one_position_back_over_the_whole_context():
    model = _model()
    model.config._attn_implementation = "eager"
    ids = torch.randint(0, VOCAB, (1, 1100), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        attn = model(ids, output_attentions=True).attentions[0][0]  # (heads, T, T)
    back = attn[:, torch.arange(1, 1100), torch.arange(0, 1099)]  # weight on position i - 1
    assert back[:2].min() > 0.99        # heads 0 and 1 are the previous-token heads
    assert back[2:].mean() < 0.5        # the others are left as initialised


def test_wired_model_round_trips_through_save_pretrained(tmp_path):
    from transformers import LlamaForCausalLM

    model = _model()
    model.save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path).eval()
    ids, _ = _repeats(batch=1, length=200)
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded(ids).logits, atol=1e-4)


@pytest.mark.parametrize("overrides, reason", [
    (dict(tie_word_embeddings=False), "tie_word_embeddings"),
    (dict(attention_bias=False), "attention_bias"),
    (dict(rope_theta=10000.0), "rope_theta"),
    (dict(num_layers=1), "2 layers"),
])
def test_models_that_cannot_carry_the_circuit_are_refused(overrides, reason):
    with pytest.raises(ValueError, match=reason):
        _model(**overrides)


def test_head_choices_are_checked():
    model = _model(wired=False)
    with pytest.raises(ValueError, match="induction_heads"):
        wire_induction_heads(model, induction_heads=(0, 8))
