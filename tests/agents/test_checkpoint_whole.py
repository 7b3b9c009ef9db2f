"""Issue 44.2 and 44.7: a checkpoint is verified whole before --resume takes it (config.json
parsed and its shapes matched against the tensors', the tokenizer files parsed, every shard,
the trainer state and its config), and damage anywhere there skips to the previous checkpoint
with a logged line naming the file. Checkpoint retention and choice, pinned by hand: how many
are kept, ``latest`` without a pointer, every shard verified."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import cut_in_half

from agents.models import tiny_causal_lm


def _usable(run):
    from algos.engine.checkpoint import usable_checkpoint

    notes = []
    return usable_checkpoint(run, log=notes.append), notes


def _edit_json(file, change):
    data = json.loads(file.read_text())
    change(data)
    file.write_text(json.dumps(data))


@pytest.mark.parametrize("change, file, why", [
    (lambda c: c.update(hidden_size=32, intermediate_size=128), "model.safetensors", "has shape"),
    (lambda c: c.update(vocab_size=c["vocab_size"] + 8), "model.safetensors", "has shape"),
    (lambda c: c.update(num_hidden_layers=2), "model.safetensors", "is missing"),
    (lambda c: c.update(num_hidden_layers=100), "config.json", "only"),  # more layers than tensors: not built
    (lambda c: c.update(num_attention_heads=4, num_key_value_heads=4), "model.safetensors", "has shape"),
    (lambda c: c.update(num_attention_heads=3), "config.json", "not divisible by num_key_value_heads 2"),
    (lambda c: c.update(num_attention_heads=3, num_key_value_heads=3, head_dim=None), "config.json",
     "hidden_size 16 is not divisible by num_attention_heads 3"),
    (lambda c: c.update(num_key_value_heads=1), "model.safetensors", "has shape"),  # k/v projections narrower
    (lambda c: c.update(num_hidden_layers=-1), "config.json", "positive integer"),
    (lambda c: c.update(hidden_size="16"), "config.json", "positive integer"),
])
def test_a_config_naming_another_shape_falls_back(two_checkpoints, change, file, why):
    older, newest = two_checkpoints
    _edit_json(newest / "config.json", change)
    chosen, notes = _usable(newest.parents[1])
    assert chosen == older
    assert notes[0].startswith(f"--resume: skipping checkpoint step_000002: {newest / file}: ") and why in notes[0]


def test_fewer_layers_in_the_config_than_in_the_weights_falls_back(tmp_path, tokenizer, torch_one_thread):
    """A two-layer model's checkpoint whose config says one layer: the second layer's tensors
    are not in the model the config builds."""
    from algos.engine.checkpoint import save_checkpoint, verify_checkpoint

    model = tiny_causal_lm(len(tokenizer), hidden_size=16, num_layers=2, num_heads=2)
    path = save_checkpoint(tmp_path, 1, model, tokenizer, torch.optim.SGD(model.parameters(), lr=0.1), {}, {})
    verify_checkpoint(path)
    _edit_json(path / "config.json", lambda c: c.update(num_hidden_layers=1))
    with pytest.raises(ValueError, match="tensor 'model.layers.1.*' is not in the model of .*config.json"):
        verify_checkpoint(path)


@pytest.mark.parametrize("damage", ["cut tokenizer.json", "tokenizer.json not a tokenizer", "cut tokenizer_config",
                                    "no tokenizer_config", "ids past the vocabulary"])
def test_a_damaged_tokenizer_falls_back(two_checkpoints, damage):
    older, newest = two_checkpoints
    if damage == "cut tokenizer.json":
        cut_in_half(newest / "tokenizer.json")
        file, why = "tokenizer.json", "not JSON"
    elif damage == "tokenizer.json not a tokenizer":
        (newest / "tokenizer.json").write_text('{"model": {"type": "nothing"}}')
        file, why = "tokenizer.json", "not a tokenizer"
    elif damage == "cut tokenizer_config":
        cut_in_half(newest / "tokenizer_config.json")
        file, why = "tokenizer_config.json", "not JSON"
    elif damage == "no tokenizer_config":
        (newest / "tokenizer_config.json").unlink()
        file, why = "tokenizer_config.json", "does not exist"
    else:  # a tokenizer that emits ids the embedding has no row for
        _edit_json(newest / "config.json", lambda c: c.update(vocab_size=100))
        from safetensors.torch import load_file, save_file

        tensors = {k: v[:100].clone() if k in ("model.embed_tokens.weight", "lm_head.weight") else v
                   for k, v in load_file(newest / "model.safetensors").items()}
        save_file(tensors, newest / "model.safetensors", metadata={"format": "pt"})
        file, why = "tokenizer.json", "outside the model's vocabulary of 100"
    chosen, notes = _usable(newest.parents[1])
    assert chosen == older
    assert notes[0].startswith(f"--resume: skipping checkpoint step_000002: {newest / file}: ") and why in notes[0]


@pytest.mark.parametrize("damage", ["cut", "list"])
def test_a_damaged_train_config_falls_back(two_checkpoints, damage):
    older, newest = two_checkpoints
    if damage == "cut":
        cut_in_half(newest / "train_config.json")
    else:
        (newest / "train_config.json").write_text("[1, 2]")
    chosen, notes = _usable(newest.parents[1])
    assert chosen == older and f"{newest / 'train_config.json'}: not " in notes[0]


def _reshard(path):
    """Re-save the checkpoint's model in several shards (an index and its files)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    (path / "model.safetensors").unlink()
    model.save_pretrained(path, max_shard_size="1MB")
    shards = sorted(path.glob("model-*.safetensors"))
    assert len(shards) >= 2 and (path / "model.safetensors.index.json").exists()
    return shards


def test_every_shard_is_verified_the_second_one_too(two_checkpoints, torch_one_thread):
    from algos.engine.checkpoint import verify_checkpoint

    older, newest = two_checkpoints
    shards = _reshard(newest)
    verify_checkpoint(newest)  # whole, in shards, it passes
    cut_in_half(shards[1])
    chosen, notes = _usable(newest.parents[1])
    assert chosen == older
    assert notes[0].startswith(f"--resume: skipping checkpoint step_000002: {shards[1]}: unreadable safetensors")


def test_a_shard_index_placing_a_tensor_in_the_wrong_shard_falls_back(two_checkpoints, torch_one_thread):
    older, newest = two_checkpoints
    shards = _reshard(newest)
    index = newest / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    name = next(n for n, s in data["weight_map"].items() if s == shards[1].name)
    data["weight_map"][name] = shards[0].name
    index.write_text(json.dumps(data))
    chosen, notes = _usable(newest.parents[1])
    assert chosen == older and f"tensor {name!r} that model.safetensors.index.json places there" in notes[0]


# -------------------------------------------------------------- retention and choice (44.7)


def _save(out, steps, tokenizer, keep):
    from algos.engine.checkpoint import save_checkpoint

    model = tiny_causal_lm(len(tokenizer), hidden_size=16, num_layers=1, num_heads=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return [save_checkpoint(out, step, model, tokenizer, optimizer, {"step": step}, {}, keep=keep) for step in steps]


@pytest.mark.parametrize("keep, kept", [(1, ["step_000004"]), (2, ["step_000003", "step_000004"]),
                                        (3, ["step_000002", "step_000003", "step_000004"])])
def test_exactly_the_newest_keep_checkpoints_are_kept(tmp_path, tokenizer, torch_one_thread, keep, kept):
    from algos.engine.checkpoint import latest_checkpoint

    saved = _save(tmp_path, [1, 2, 3, 4], tokenizer, keep)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == kept
    assert (root / "latest").read_text() == "step_000004" and latest_checkpoint(tmp_path) == saved[-1]


def test_retention_counts_steps_not_names(tmp_path, tokenizer, torch_one_thread):
    """step_1000000 is newer than step_999999 (its name sorts before it)."""
    from algos.engine.checkpoint import latest_checkpoint

    _save(tmp_path, [999_998, 999_999, 1_000_000], tokenizer, keep=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["step_1000000", "step_999999"]
    (root / "latest").unlink()
    assert latest_checkpoint(tmp_path) == root / "step_1000000"


def test_latest_without_a_pointer_is_the_newest_complete_checkpoint(tmp_path, tokenizer, torch_one_thread):
    from algos.engine.checkpoint import latest_checkpoint, resolve_model_path

    saved = _save(tmp_path, [2, 4, 6], tokenizer, keep=3)
    root = tmp_path / "checkpoints"
    (root / "latest").unlink()
    assert latest_checkpoint(tmp_path) == saved[-1]
    assert resolve_model_path(str(tmp_path)) == str(saved[-1])
    (saved[-1] / "trainer_state.pt").unlink()  # the newest was cut short: not complete
    assert latest_checkpoint(tmp_path) == saved[1]
    (root / "latest").write_text("step_000006")  # a pointer to an incomplete one is not trusted either
    assert latest_checkpoint(tmp_path) == saved[1]
    (root / "latest").write_text("step_000002")  # a complete one it names wins
    assert latest_checkpoint(tmp_path) == saved[0]
    for path in saved:
        (path / "trainer_state.pt").unlink(missing_ok=True)
    assert latest_checkpoint(tmp_path) is None
