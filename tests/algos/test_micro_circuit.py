"""The micro recipe's hand-wired copy circuit (algos.recipes.micro.circuit): it copies at
initialisation, matching two tokens beats matching one where tokens recur, its look-back
heads look exactly 1 and 2 positions back, the model declares what of it stays frozen and
training inside ``algos.engine.freeze.frozen`` leaves it intact, it survives save/load, and models
it cannot wire are refused with the reason."""

import pytest
import torch

from agents.models import tiny_causal_lm
from algos.engine.freeze import frozen
from algos.recipes.micro.circuit import ROPE_THETA, frozen_entries, wire_induction_heads

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


def _train_frozen(model, ids, steps: int = 3):
    """``steps`` AdamW steps of language modelling on ``ids`` inside ``frozen``; returns
    ``moved(name, index)``: whether that slice of a parameter changed."""
    model.train()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    with frozen(model):
        for _ in range(steps):
            optimizer.zero_grad()
            model(ids, labels=ids).loss.backward()
            optimizer.step()
    params = dict(model.named_parameters())
    return lambda name, index=slice(None): not torch.equal(params[name][index], before[name][index])


def test_training_inside_frozen_keeps_the_circuit_and_moves_the_rest():
    model = _model(num_layers=3)
    ids, _ = _repeats(batch=2, length=128)
    moved = _train_frozen(model, ids)
    params = dict(model.named_parameters())
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


def test_frozen_entries_need_a_wired_model():
    with pytest.raises(ValueError, match="no wired circuit"):
        frozen_entries(_model(wired=False).config)
    assert not getattr(_model(wired=False).config, "mopd_frozen", None)  # a plain model trains whole


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


# ----------------------------------------------------------------------------- lookup heads

MARKERS, QUERIES, POINTS_TO = (2, 3, 4, 5), (6, 7, 8, 9), (2, 0, 3, 1)


def _small(lookup_heads=(0, 1)):
    model = tiny_causal_lm(512, hidden_size=128, num_layers=3, num_heads=4, seed=0,
                           max_position_embeddings=256, tie_word_embeddings=True,
                           attention_bias=True, rope_theta=ROPE_THETA)
    return wire_induction_heads(model, prev_heads=(0, 1), induction_heads=(0, 1),
                                lookup_heads=lookup_heads)


def _pointer_batch(generator, batch=32, length=32):
    """Random tokens with the four markers at odd positions, each followed by a value; the
    last token is one of four queries, and the target is the value after the marker that
    query points to (``POINTS_TO``): a lookup an induction head cannot do, since the query
    token itself never occurred before."""
    ids = torch.randint(10, 512, (batch, length), generator=generator)
    which = torch.randint(0, 4, (batch,), generator=generator)
    targets = torch.empty(batch, dtype=torch.long)
    for b in range(batch):
        at = torch.randperm(length // 2 - 2, generator=generator)[:4] * 2 + 1
        ids[b, at] = torch.tensor(MARKERS)
        ids[b, -1] = QUERIES[which[b]]
        targets[b] = ids[b, at[POINTS_TO[which[b]]] + 1]
    return ids, targets


def test_lookup_heads_learn_where_to_copy_from_their_queries_alone():
    model = _small().train()
    lookup = model.model.layers[2].self_attn
    assert not lookup.q_proj.weight[:64].any()  # heads 0-1 start looking everywhere alike
    optimizer = torch.optim.Adam([lookup.q_proj.weight, lookup.q_proj.bias], lr=1e-2)
    g = torch.Generator().manual_seed(0)

    def measure():
        """(accuracy, the lookup heads' attention on the target's position) at the query."""
        ids, targets = _pointer_batch(torch.Generator().manual_seed(99), batch=128)
        model.config._attn_implementation = "eager"  # the one that returns attentions
        with torch.no_grad():
            out = model(ids, output_attentions=True)
        model.config._attn_implementation = "sdpa"
        at = torch.stack([(row == t).nonzero()[0] for row, t in zip(ids, targets)])[:, 0]
        attention = out.attentions[2][torch.arange(len(ids)), :2, -1, at]  # (B, 2)
        hits = out.logits[:, -1].argmax(-1) == targets
        return float(hits.float().mean()), float(attention.mean())

    accuracy_before, attention_before = measure()
    for _ in range(40):
        ids, targets = _pointer_batch(g)
        loss = torch.nn.functional.cross_entropy(model(ids).logits[:, -1], targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    accuracy_after, attention_after = measure()
    assert attention_before < 0.1 and attention_after > 0.7, (attention_before, attention_after)
    assert accuracy_before < 0.05 and accuracy_after > 0.3, (accuracy_before, accuracy_after)


def test_frozen_keeps_lookup_keys_values_and_the_space_they_read():
    model = _small()
    moved = _train_frozen(model, _pointer_batch(torch.Generator().manual_seed(1), batch=4)[0])
    params = dict(model.named_parameters())
    layer2 = "model.layers.2."
    assert not moved(layer2 + "self_attn.k_proj.weight", slice(0, 64))  # lookup heads 0-1
    assert not moved(layer2 + "self_attn.v_proj.weight", slice(0, 64))
    assert not moved(layer2 + "input_layernorm.weight")
    for name in ("model.layers.1.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        assert moved(name) and not params[name][64:].any()  # nothing but layer 0 writes into S
    assert moved(layer2 + "self_attn.q_proj.weight", slice(0, 64))  # what to look up trains
    assert moved(layer2 + "self_attn.o_proj.weight", (slice(None), slice(0, 64)))


def test_lookup_layout_survives_save_pretrained(tmp_path):
    from transformers import LlamaForCausalLM

    model = _small()
    model.save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.induction == {"prev_heads": [0, 1], "induction_heads": [0, 1],
                                       "lookup_heads": [0, 1], "lookup_layer": 2}
    assert loaded.config.mopd_frozen == model.config.mopd_frozen  # the freeze travels with it


def test_lookup_layer_must_follow_the_induction_heads():
    model = tiny_causal_lm(512, hidden_size=128, num_layers=3, num_heads=4, seed=0,
                           tie_word_embeddings=True, attention_bias=True, rope_theta=ROPE_THETA)
    with pytest.raises(ValueError, match="lookup_layer=1"):
        wire_induction_heads(model, prev_heads=(0,), induction_heads=(0,), lookup_heads=(0,),
                             lookup_layer=1)


def test_the_micro_layout_declares_exactly_its_circuit():
    """The micro base's layout (hidden 256, 8 heads of 32, look-back heads 0-1, induction and
    lookup heads 0-3, lookup layer 2), written out by hand."""
    from types import SimpleNamespace

    config = SimpleNamespace(hidden_size=256, num_attention_heads=8, induction={
        "prev_heads": [0, 1], "induction_heads": [0, 1, 2, 3], "lookup_heads": [0, 1, 2, 3],
        "lookup_layer": 2})
    rows = ["0:32", "32:64", "64:96", "96:128"]
    expected = ["model.embed_tokens.weight[:, 192:]", "model.layers.1.input_layernorm.weight",
                "model.layers.0.*"]
    for r in rows:
        expected += [f"model.layers.1.self_attn.{p}.{k}[{r}]"
                     for p in ("q_proj", "k_proj", "v_proj") for k in ("weight", "bias")]
    expected += ["model.layers.2.input_layernorm.weight",
                 "model.layers.1.self_attn.o_proj.weight[192:, :]",
                 "model.layers.1.mlp.down_proj.weight[192:, :]"]
    for r in rows:
        expected += [f"model.layers.2.self_attn.{p}.{k}[{r}]"
                     for p in ("k_proj", "v_proj") for k in ("weight", "bias")]
    assert frozen_entries(config) == expected


def test_a_wired_model_freezes_the_elements_the_circuit_needs():
    """Frozen element counts of a wired 256-wide model (2 look-back, 4 induction heads), by hand."""
    from algos.engine.freeze import frozen_masks

    model = _model(num_layers=3)
    masks = frozen_masks(model)
    zeros = {name: int((mask == 0).sum()) for name, mask in masks.items()}
    layer0 = sum(p.numel() for n, p in model.named_parameters() if n.startswith("model.layers.0."))
    assert sum(v for n, v in zeros.items() if n.startswith("model.layers.0.")) == layer0
    assert zeros["model.embed_tokens.weight"] == VOCAB * 64        # S: the last 2 x 32 dims
    assert zeros["model.layers.1.input_layernorm.weight"] == 256
    for proj in ("q_proj", "k_proj", "v_proj"):                    # heads 0-3: 128 rows
        assert zeros[f"model.layers.1.self_attn.{proj}.weight"] == 128 * 256
        assert zeros[f"model.layers.1.self_attn.{proj}.bias"] == 128
    assert "model.layers.1.self_attn.o_proj.weight" not in zeros   # how much they copy trains
    assert not any(n.startswith("model.layers.2.") for n in zeros)  # no lookup heads
