"""algos.engine.freeze: a model's saved declaration of frozen parameters is what every update honours."""

from __future__ import annotations

import pytest
import torch

from agents.models import load_causal_lm, tiny_causal_lm
from algos.engine.freeze import FROZEN_KEY, declare_frozen, declared_frozen, frozen, frozen_masks

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENTRIES = ["model.layers.0.*", "model.embed_tokens.weight[:, 24:32]",
           "model.layers.1.self_attn.q_proj.weight[0:8]", "model.layers.1.mlp.up_proj.weight[3, :]"]


def _model():
    return tiny_causal_lm(64, hidden_size=32, num_layers=2, num_heads=4, seed=3, eos_token_id=1,
                          tie_word_embeddings=True)


def _train(model, steps=3):
    """``steps`` AdamW steps of language modelling inside ``frozen``; the weights before."""
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(2, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    model.train()
    with frozen(model):
        for _ in range(steps):
            optimizer.zero_grad()
            model(ids, labels=ids).loss.backward()
            optimizer.step()
    return before


def test_declared_parts_stay_exactly_and_the_rest_trains():
    model = declare_frozen(_model(), ENTRIES)
    before = _train(model)
    after = model.state_dict()
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight",
                 "model.layers.0.input_layernorm.weight"):
        assert torch.equal(after[name], before[name]), name
    emb, emb0 = after["model.embed_tokens.weight"], before["model.embed_tokens.weight"]
    assert torch.equal(emb[:, 24:32], emb0[:, 24:32])
    assert not torch.equal(emb[:, :24], emb0[:, :24])
    q, q0 = after["model.layers.1.self_attn.q_proj.weight"], before["model.layers.1.self_attn.q_proj.weight"]
    assert torch.equal(q[0:8], q0[0:8]) and not torch.equal(q[8:], q0[8:])
    up, up0 = after["model.layers.1.mlp.up_proj.weight"], before["model.layers.1.mlp.up_proj.weight"]
    assert torch.equal(up[3], up0[3]) and not torch.equal(up[4], up0[4])
    # hooks are gone after the block: the next step moves layer 0
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    ids = torch.randint(2, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    model(ids, labels=ids).loss.backward()
    optimizer.step()
    assert not torch.equal(model.state_dict()["model.layers.0.self_attn.q_proj.weight"],
                           before["model.layers.0.self_attn.q_proj.weight"])


def test_no_declaration_trains_everything():
    model = _model()
    assert declared_frozen(model) == []
    before = _train(model)
    after = model.state_dict()
    assert all(not torch.equal(after[k], before[k]) for k in before if "rotary" not in k)


def test_masks_count_the_frozen_elements():
    model = declare_frozen(_model(), ENTRIES)
    masks = frozen_masks(model)
    assert set(masks) == {n for n, _ in model.named_parameters() if n.startswith("model.layers.0.")} | {
        "model.embed_tokens.weight", "model.layers.1.self_attn.q_proj.weight",
        "model.layers.1.mlp.up_proj.weight"}
    assert int((masks["model.embed_tokens.weight"] == 0).sum()) == 64 * 8
    assert int((masks["model.layers.1.self_attn.q_proj.weight"] == 0).sum()) == 8 * 32
    assert int((masks["model.layers.1.mlp.up_proj.weight"] == 0).sum()) == 32
    assert int(masks["model.layers.0.mlp.up_proj.weight"].sum()) == 0


def test_a_tied_name_freezes_the_shared_weight():
    model = declare_frozen(_model(), ["lm_head.weight[0:2]"])
    assert int((frozen_masks(model)["model.embed_tokens.weight"] == 0).sum()) == 2 * 32


def test_the_declaration_is_saved_with_the_model(tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    model = declare_frozen(_model(), ENTRIES)
    model.save_pretrained(tmp_path)
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "<e>": 1}, unk_token="a")),
                                  eos_token="<e>")
    tok.save_pretrained(tmp_path)
    loaded, _ = load_causal_lm(str(tmp_path))
    assert getattr(loaded.config, FROZEN_KEY) == ENTRIES
    before = _train(loaded)
    assert torch.equal(loaded.state_dict()["model.layers.0.self_attn.v_proj.weight"],
                       before["model.layers.0.self_attn.v_proj.weight"])


@pytest.mark.parametrize("entry, words", [
    ("model.layers.9.*", "matches no parameter"),
    ("model.embed_tokens.weight[:, 24:33]", "bound 33 is outside a dimension of size 32"),
    ("model.embed_tokens.weight[0, 1, 2]", "3 indices for a parameter of shape [64, 32]"),
    ("model.embed_tokens.weight[a:b]", "cannot read index 'a:b'"),
    ("model.norm.weight[32]", "index 32 is outside"),
    ("model.norm.weight[[0]]", "expected a parameter name pattern"),
])
def test_a_bad_entry_is_refused_in_one_line_that_names_it(entry, words):
    with pytest.raises(ValueError, match="mopd_frozen") as err:
        declare_frozen(_model(), [entry])
    assert words in str(err.value) and entry in str(err.value) and "\n" not in str(err.value)
    model = _model()
    model.config.mopd_frozen = [entry]  # a hand-edited config is refused when the update starts
    with pytest.raises(ValueError, match="mopd_frozen"), frozen(model):
        pass
