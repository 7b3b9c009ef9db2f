"""SFT: the loss is the masked NLL and nothing else, it learns, rows are cut and batched
as documented, the command line trains and saves a model, and what a model declares frozen
stays frozen."""

from __future__ import annotations

import json
import random

import pytest
import torch

from agents.models import tiny_causal_lm
from algos.batch import Row
from algos.commands.sft import main
from algos.sft import batches, collate, sft, sft_loss, sft_rows
from envs.episode import Episode, Segment, save_episodes

V = 48


pytestmark = pytest.mark.usefixtures("torch_one_thread")


def segment(agent: str, pieces: list[tuple[list[int], bool]]) -> Segment:
    seg = Segment(agent=agent, role=agent.rsplit("_", 1)[0], wave=-1)
    for ids, generated in pieces:
        seg.append(ids, generated=generated)
    return seg


def episodes() -> list[Episode]:
    """Hand-made episodes: prompts (mask 0), turns the agent wrote (mask 1), env replies."""
    rng = random.Random(0)
    out = []
    for k in range(4):
        prompt = [rng.randrange(3, V) for _ in range(6)]
        turn = [5, 6, 7, 8, 9, 10, 2]  # the same answer every time: learnable
        reply = [rng.randrange(3, V) for _ in range(4)]
        out.append(Episode(question={"id": str(k)}, workflow="cascade", segments=[
            segment("searcher_0", [(prompt, False), (turn, True), (reply, False), ([11, 12, 2], True)]),
            segment("answerer_0", [(prompt[:3], False), ([13, 14, 2], True)]),
        ]))
    return out


def tiny(seed: int = 0):
    return tiny_causal_lm(V, hidden_size=32, num_layers=1, num_heads=2, seed=seed,
                          eos_token_id=2, pad_token_id=0)


def full_loss(model, input_ids, attention_mask, targets):
    """The masked NLL written out by hand from the full logits."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
    logp = logits[:, :-1].log_softmax(-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    mask = targets[:, 1:].float()
    return -(logp * mask).sum() / mask.sum()


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_loss_is_the_hand_computed_masked_nll_and_so_are_its_gradients():
    rows = sft_rows(episodes(), max_len=64)
    input_ids, attention_mask, targets = collate(rows)
    model = tiny()
    loss = sft_loss(model, input_ids, attention_mask, targets)
    loss.backward()
    ours = grads(model)
    model.zero_grad()
    expected = full_loss(model, input_ids, attention_mask, targets)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    for name, grad in grads(model).items():
        torch.testing.assert_close(ours[name], grad, rtol=1e-4, atol=1e-7, msg=name)


def test_tokens_outside_the_mask_get_no_gradient():
    # Rows whose loss-masked tokens agree but whose trailing unmasked tokens differ (an env
    # reply after the last turn, and its padding) give the same gradients, bit for bit.
    rows = sft_rows(episodes(), max_len=64)
    input_ids, attention_mask, targets = collate(rows)
    width = input_ids.shape[1]
    tail = torch.full((len(rows), 5), 0, dtype=torch.long)
    a = torch.cat([input_ids, tail + 3], 1)
    b = torch.cat([input_ids, tail + 40], 1)
    mask = torch.cat([attention_mask, torch.ones_like(tail)], 1)
    tgt = torch.cat([targets, torch.zeros_like(tail, dtype=torch.bool)], 1)
    model = tiny()
    sft_loss(model, a, mask, tgt).backward()
    first = grads(model)
    model.zero_grad()
    sft_loss(model, b, mask, tgt).backward()
    for name, grad in grads(model).items():
        assert torch.equal(first[name], grad), name
    assert (a[:, :width] == input_ids).all()
    # and the unmasked tokens are not trained on: flipping a target off changes the loss
    tgt2 = tgt.clone()
    row, col = tgt2.nonzero()[0].tolist()
    tgt2[row, col] = False
    with torch.no_grad():
        assert sft_loss(model, a, mask, tgt2).item() != sft_loss(model, a, mask, tgt).item()


def test_context_weight_scores_every_real_token_at_that_weight():
    input_ids, attention_mask, targets = collate(sft_rows(episodes(), max_len=64))
    model = tiny()
    with torch.no_grad():
        ours = sft_loss(model, input_ids, attention_mask, targets, context_weight=0.25).item()
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logp = logits[:, :-1].log_softmax(-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        real = attention_mask[:, 1:].bool()
        weights = torch.where(targets[:, 1:], 1.0, 0.25) * real
        expected = (-(logp * weights).sum() / weights.sum()).item()
        plain = sft_loss(model, input_ids, attention_mask, targets).item()
    assert ours == pytest.approx(expected, rel=1e-5)
    assert ours != pytest.approx(plain, rel=1e-3)


def test_sft_lowers_the_loss_and_moves_every_parameter():
    model = tiny()
    data = episodes()
    batch = collate(sft_rows(data, max_len=64))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        start = sft_loss(model, *batch).item()
    losses = sft(model, data, epochs=30, lr=1e-2, batch_tokens=64, progress=False)
    with torch.no_grad():
        end = sft_loss(model, *batch).item()
    assert len(losses) >= 30 and all(isinstance(x, float) for x in losses)
    assert end < 0.5 * start
    assert not model.training
    for name, p in model.named_parameters():
        assert not torch.equal(before[name], p.detach()), f"{name} did not change"


def test_same_seed_same_losses():
    a = sft(tiny(), episodes(), epochs=2, lr=1e-2, batch_tokens=64, seed=3, progress=False)
    b = sft(tiny(), episodes(), epochs=2, lr=1e-2, batch_tokens=64, seed=3, progress=False)
    assert a == b


def test_rows_keep_late_masked_tokens_drop_what_carries_no_loss_and_dedupe():
    seg = segment("searcher_0", [([3] * 10, False), ([4, 5], True), ([6] * 5, False),
                                 ([7, 8], True), ([9] * 3, False)])
    ep = Episode(question={"id": "q"}, workflow="cascade", segments=[
        seg, segment("answerer_0", [([3, 4], False)]), segment("answerer_1", [([3, 4], False)])])
    [row] = sft_rows([ep], max_len=100)
    ids, mask = row.token_ids.tolist(), row.mask.astype(int).tolist()
    assert ids == seg.token_ids[:19] and ids[-2:] == [7, 8]  # trailing env tokens dropped
    assert mask == seg.loss_mask[:19]
    [row] = sft_rows([ep], max_len=8)  # cut from the left, the last turn kept
    assert row.token_ids.tolist() == [5, 6, 6, 6, 6, 6, 7, 8]
    assert row.mask.astype(int).tolist() == [0, 0, 0, 0, 0, 0, 1, 1]
    twice = Episode(question={"id": "q"}, workflow="cascade", segments=[seg, seg])
    assert len(sft_rows([twice], 100)) == 1 and len(sft_rows([twice], 100, dedupe=False)) == 2
    with pytest.raises(ValueError, match="nothing to train on"):
        sft(tiny(), [Episode(question={}, workflow="cascade", segments=[
            segment("answerer_0", [([3, 4], False)])])], progress=False)


def test_batches_hold_every_row_once_within_the_token_budget():
    rng = random.Random(0)
    rows = [Row([1] * n, [0] + [1] * (n - 1)) for n in (rng.randrange(2, 40) for _ in range(50))]
    out = batches(rows, 100, random.Random(1))
    assert sorted(i for b in out for i in b) == list(range(50))
    for b in out:
        assert len(b) == 1 or len(b) * max(len(rows[i].token_ids) for i in b) <= 100


def test_out_of_vocabulary_ids_are_refused():
    ep = Episode(question={"id": "q"}, workflow="cascade",
                 segments=[segment("answerer_0", [([3], False), ([V + 5], True)])])
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        sft(tiny(), [ep], progress=False)


def test_command_line_trains_and_saves(tmp_path):
    from transformers import AutoModelForCausalLM

    from algos.recipes.micro.tokenizer import micro_tokenizer

    tokenizer = micro_tokenizer()
    model_dir = tmp_path / "base"
    tiny_causal_lm(len(tokenizer), hidden_size=32, num_layers=1, num_heads=2,
                   eos_token_id=tokenizer.eos_token_id).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = tmp_path / "episodes.jsonl"
    save_episodes(data, episodes())
    out = tmp_path / "out"
    assert main(["--episodes", str(data), "--model", str(model_dir), "--epochs", "2",
                 "--lr", "1e-2", "--out", str(out), "--no-progress"]) == 0
    record = json.loads((out / "sft.json").read_text())
    assert record["steps"] == len(record["losses"]) > 0 and record["epochs"] == 2
    trained = AutoModelForCausalLM.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    assert not torch.equal(trained.lm_head.weight, base.lm_head.weight)
    assert (out / "tokenizer.json").exists()
    with pytest.raises(SystemExit):
        main(["--model", "micro"])  # neither --episodes nor --preset
    # --skip-search reaches the micro build, which checks it before building anything.
    with pytest.raises(ValueError, match="skip_search must be in"):
        main(["--preset", "micro", "--skip-search", "1.5", "--no-progress"])
    with pytest.raises(ValueError, match="facts must be an integer >= 0"):
        main(["--preset", "micro", "--facts", "-2", "--recall", "--no-progress"])
    with pytest.raises(ValueError, match="known_worlds"):
        main(["--preset", "micro", "--known-worlds", "0,9", "--no-progress"])
    with pytest.raises(ValueError, match="skip_known must be in"):
        main(["--preset", "micro", "--skip-known", "1.5", "--no-progress"])
    with pytest.raises(ValueError, match="recall_practice needs recall"):
        main(["--preset", "micro", "--recall-practice", "150", "--no-progress"])
    with pytest.raises(SystemExit):
        main(["--preset", "micro", "--known-worlds", "zero"])


def test_the_command_lines_micro_model_is_wired_like_the_presets_base():
    from algos.commands.sft import starting_model

    model, tokenizer = starting_model("micro")
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.induction == {"prev_heads": [0, 1], "induction_heads": [0, 1, 2, 3],
                                      "lookup_heads": [0, 1, 2, 3], "lookup_layer": 2}


def test_sft_keeps_a_wired_copy_circuit_frozen_and_trains_the_rest():
    from algos.recipes.micro.circuit import ROPE_THETA, wire_induction_heads

    model = tiny_causal_lm(V, hidden_size=128, num_layers=3, num_heads=4, seed=0,
                           tie_word_embeddings=True, attention_bias=True, rope_theta=ROPE_THETA)
    wire_induction_heads(model, induction_heads=(0, 1), lookup_heads=(0, 1))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    sft(model, episodes(), epochs=3, lr=1e-2, batch_tokens=64, progress=False)
    params = dict(model.named_parameters())
    moved = lambda name, rows=slice(None): not torch.equal(params[name][rows], before[name][rows])  # noqa: E731
    assert not any(moved(n) for n in params if n.startswith("model.layers.0."))
    assert not moved("model.layers.2.self_attn.k_proj.weight", slice(0, 64))  # lookup keys
    assert moved("model.layers.2.self_attn.q_proj.weight", slice(0, 64))      # lookup queries
    assert moved("model.layers.2.mlp.down_proj.weight")


def test_text_rows_train_every_token_after_the_first_beside_the_episodes():
    from algos.sft import text_rows

    rows = text_rows([[2, 20, 21, 22, 23]])
    assert rows[0].mask.tolist() == [False, True, True, True, True]
    with pytest.raises(ValueError, match="at least 2 tokens"):
        text_rows([[2]])
    fact = torch.tensor([[2, 20, 21, 22, 23]])

    def fact_nll(model):
        with torch.no_grad():
            return sft_loss(model, fact, torch.ones_like(fact), torch.tensor([[0, 1, 1, 1, 1]]).bool()).item()

    without, with_fact = tiny(), tiny()
    sft(without, episodes(), epochs=20, lr=1e-2, batch_tokens=64, progress=False)
    sft(with_fact, episodes(), epochs=20, lr=1e-2, batch_tokens=64, rows=rows, progress=False)
    assert fact_nll(with_fact) < 0.5 * fact_nll(without)  # learnt only where it was given
