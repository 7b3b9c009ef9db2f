"""The hand-wired copy circuit (agents.induction): it copies at initialisation, matching two
tokens beats matching one where tokens recur, its look-back heads look exactly 1 and 2
positions back, training inside ``frozen_circuit`` leaves it intact, it survives
save/load, and models it cannot wire are refused with the reason."""

import pytest
import torch

from agents.induction import ROPE_THETA, frozen_circuit, wire_induction_heads
from agents.models import tiny_causal_lm

VOCAB = 2048


def _model(wired: bool = True, prev_heads=(0, 1), **overrides):
    kwargs = dict(hidden_size=256, num_layers=2, num_heads=8, max_position_embeddings=2048,
                  tie_word_embeddings=True, attention_bias=True, rope_theta=ROPE_THETA, seed=0)
    kwargs.update(overrides)
    model = tiny_causal_lm(VOCAB, **kwargs)
    return wire_induction_heads(model, prev_heads=prev_heads) if wired else model


def _repeats(batch: int = 4, length: int = 600, span: int = 20, gap: int = 30, hubs: float = 0.0):
    """Random tokens in which each span of ``span`` tokens comes back ``span + gap`` later;
    the mask marks the targets a copier can predict (a repeat's 2nd token on). A fraction
    ``hubs`` of the tokens are one of 4 "hub" tokens (like "the" or "'" in text), after
    which a one-token match is ambiguous."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(10, VOCAB, (batch, length), generator=g)
    at_hub = torch.rand(batch, length, generator=g) < hubs
    ids[at_hub] = torch.randint(10, 14, (int(at_hub.sum()),), generator=g)
    mask = torch.zeros(batch, length - 1, dtype=torch.bool)
    for start in range(0, length - 2 * span - gap, 2 * span + gap):
        again = start + span + gap
        ids[:, again:again + span] = ids[:, start:start + span]
        mask[:, again:again + span - 1] = True  # target index t predicts ids[t + 1]
    return ids, mask


def _copy_accuracy(model, hubs: float = 0.0) -> float:
    ids, mask = _repeats(hubs=hubs)
    with torch.no_grad():
        pred = model(ids).logits[:, :-1].argmax(-1)
    return float((pred == ids[:, 1:])[mask].float().mean())


def test_wired_model_copies_at_initialisation_and_a_plain_one_does_not():
    assert _copy_accuracy(_model(wired=True)) > 0.9
    assert _copy_accuracy(_model(wired=False)) < 0.02


def test_matching_two_tokens_beats_one_where_tokens_recur():
    one, two = (_copy_accuracy(_model(prev_heads=p), hubs=0.25) for p in ((0,), (0, 1)))
    assert two > 0.9 and two > one + 0.1, (one, two)


def test_look_back_heads_attend_one_and_two_positions_back_over_the_whole_context():
    model = _model()
    model.config._attn_implementation = "eager"
    ids = torch.randint(0, VOCAB, (1, 1100), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        attn = model(ids, output_attentions=True).attentions[0][0]  # (heads, T, T)
    one_back = attn[:, torch.arange(1, 1100), torch.arange(0, 1099)]
    two_back = attn[:, torch.arange(2, 1100), torch.arange(0, 1098)]
    assert one_back[0].min() > 0.99 and two_back[1].min() > 0.99
    assert one_back[2:].mean() < 0.5 and two_back[2:].mean() < 0.5  # the others: as initialised


def test_training_inside_frozen_circuit_keeps_the_circuit_and_moves_the_rest():
    model = _model(num_layers=3).train()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    ids, _ = _repeats(batch=2, length=128)
    with frozen_circuit(model):
        for _ in range(3):
            optimizer.zero_grad()
            model(ids, labels=ids).loss.backward()
            optimizer.step()
    params = dict(model.named_parameters())
    moved = lambda name, index=slice(None): not torch.equal(params[name][index], before[name][index])  # noqa: E731
    layer1 = "model.layers.1.self_attn."
    layer0_names = [name for name in params if name.startswith("model.layers.0.")]
    assert layer0_names and not any(moved(name) for name in layer0_names)  # look-back only
    assert not moved(layer1 + "k_proj.weight", slice(0, 128))   # induction heads 0-3
    assert not moved(layer1 + "v_proj.weight", slice(0, 128))
    assert not moved("model.embed_tokens.weight", (slice(None), slice(192, None)))  # S stays empty
    assert moved(layer1 + "o_proj.weight", (slice(None), slice(0, 128)))  # how much they copy
    assert moved(layer1 + "k_proj.weight", slice(128, None))     # heads 4-7 train
    assert moved("model.embed_tokens.weight", (slice(None), slice(0, 192)))
    assert moved("model.layers.2.mlp.down_proj.weight")
    # the induction heads still find the source: at a repeated token they attend to the
    # position after its earlier occurrence (the embeddings moved, but both sides of the
    # match read the same embeddings)
    model.eval()
    model.config._attn_implementation = "eager"
    span, gap = 20, 30
    with torch.no_grad():
        attn = model(ids, output_attentions=True).attentions[1][:, :4]  # (B, heads, T, T)
    again = span + gap
    rows = torch.arange(again + 2, again + span)  # 3rd token of the first repeat on
    assert (attn[:, :, rows].argmax(-1) == rows - again + 1).float().mean() > 0.9
    model(ids, labels=ids).loss.backward()  # outside the block, the hooks are gone
    assert params[layer1 + "k_proj.weight"].grad[:128].abs().sum() > 0


def test_frozen_circuit_needs_a_wired_model():
    with pytest.raises(ValueError, match="no wired circuit"):
        with frozen_circuit(_model(wired=False)):
            pass


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
