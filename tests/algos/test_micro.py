"""The micro preset: its tokenizer round-trips what the env writes and knows ChatML, its
model fits the tokenizer, and a tiny build runs end to end into a model that reloads and
writes protocol tags."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import QUESTION, WORLD, Doc, KeywordRetriever

from algos.recipes.micro.build import build_micro_base
from algos.recipes.micro.episodes import EosScripted, micro_env_fn, spaced_tags
from algos.recipes.micro.model import micro_model
from algos.recipes.micro.settings import ENV
from algos.recipes.micro.tokenizer import (
    PROTOCOL_TOKENS,
    SPECIAL_TOKENS,
    micro_tokenizer,
    train_micro_tokenizer,
)
from envs import protocol as P
from envs.chat import ChatFormat
from envs.retrieval import MemoRetriever

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def tok():
    return micro_tokenizer()


def test_tokenizer_shape_special_tokens_and_chatml(tok):
    assert len(tok) == 4096
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>"
    assert tok.pad_token_id != tok.eos_token_id
    chat = ChatFormat(tok)
    assert chat.chatml and chat.end_id == tok.eos_token_id
    for token in SPECIAL_TOKENS + PROTOCOL_TOKENS:
        ids = tok.encode(token, add_special_tokens=False)
        assert len(ids) == 1, (token, ids)
        assert tok.decode(ids) == token
    # the env decodes turns without special tokens: tags must survive that
    ids = tok.encode("<search>Kessa</search><|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "<search>Kessa</search>"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_tokenizer_round_trips_what_the_env_writes(tok):
    chat = ChatFormat(tok)
    texts = [render.format(max_searchers=2, max_waves=2, max_searches=2)
             for render in P.SYSTEM_PROMPTS.values()]
    texts += list(P.FORMAT_REMINDERS.values())
    texts += [P.render_passages([Doc("1", "Velmora Quist", "Velmora Quist was born in 1901."),
                                 Doc("2", "Zoë Café", "«Zoë» — a café in Ostria; née 1876.\n\tIt is.")]),
              P.render_reports([(1, "Who is the father of X?", "Y is."), (2, "Z?", "")]),
              "Waves left: 1. Report: Evidence: Doc 1(Title: T) text  double  spaces\n\n"]
    for text in texts:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    system, user = texts[0], "Question: In which country was Velmora Quist born?"
    assert tok.decode(chat.prompt(system, user)) == (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert tok.decode(chat.observation(texts[-1])) == (
        f"\n<|im_start|>user\n{texts[-1]}<|im_end|>\n<|im_start|>assistant\n")
    # fitted to the protocol: the system prompts cost about a token per word
    words = len(texts[0].split())
    assert len(tok.encode(texts[0], add_special_tokens=False)) < 1.6 * words


def test_tokenizer_is_deterministic(tok):
    again = train_micro_tokenizer()
    assert again.get_vocab() == tok.get_vocab()
    text = P.SYSTEM_PROMPTS[P.LEADER] + " Maren Tolvik 1976"
    assert again.encode(text) == tok.encode(text)


def test_scripted_team_plays_the_micro_env_and_closes_dispatches_with_eos(tok):
    from agents.collect import collect

    env_fn = micro_env_fn(tok, "hierarchical", KeywordRetriever(WORLD), questions=[QUESTION])
    [[ep]] = collect(env_fn, EosScripted(tok), [QUESTION])
    assert ep.team_em == 1.0 and ep.invalid_turns == 0 and ep.num_searches >= 1
    assert ep.num_waves <= ENV["max_waves"]
    for seg in ep.segments:
        assert len(seg.token_ids) <= ENV["max_context_tokens"]
    leader = ep.segments_of(P.LEADER)[0]
    # the wave's EOS is generated (mask 1); a Searcher's closing EOS is the env's (mask 0)
    ends = [i for i, t in enumerate(leader.token_ids) if t == tok.eos_token_id and leader.loss_mask[i]]
    assert ends, "the Leader's dispatch turn should end in a generated EOS"
    searcher = ep.segments_of(P.SEARCHER)[0]
    assert all(not m for t, m in zip(searcher.token_ids, searcher.loss_mask)
               if t == tok.eos_token_id)


def test_spaced_tags_let_a_name_after_a_tag_share_its_tokens_with_the_passage(tok):
    turn = "<answer>Ludina Tovar</answer>"
    assert spaced_tags(turn) == "<answer> Ludina Tovar</answer>"
    assert spaced_tags("<summary> Already spaced.</summary>") == "<summary> Already spaced.</summary>"
    assert spaced_tags("no tags <b>here</b>") == "no tags <b>here</b>"
    passage = tok.encode("a novel by Ludina Tovar.", add_special_tokens=False)
    name = lambda text: tok.encode(text, add_special_tokens=False)[1:-1]  # noqa: E731  (between the tags)
    assert name(spaced_tags(turn)) == passage[3:-1] and name(turn) != passage[3:-1]
    assert P.parse_answerer(spaced_tags(turn)).text == "Ludina Tovar"


def test_memo_retriever_asks_each_query_once():
    inner = KeywordRetriever(WORLD)
    memo = MemoRetriever(inner)
    first = memo.search(["Port Velm", "Ostria capital", "Port Velm"], 2)
    assert first == inner.search(["Port Velm", "Ostria capital", "Port Velm"], 2)
    calls = inner.calls
    assert memo.search(["Ostria capital"], 2) == [first[1]] and inner.calls == calls


def test_micro_model_fits_the_tokenizer(tok):
    model = micro_model(tok)
    config = model.config
    assert config.vocab_size == len(tok)
    assert config.eos_token_id == tok.eos_token_id and config.pad_token_id == tok.pad_token_id
    assert config.max_position_embeddings >= 2048
    assert (config.hidden_size, config.num_hidden_layers) == (256, 4)
    assert 5e6 < sum(p.numel() for p in model.parameters()) < 8e6
    again = micro_model(tok)
    assert torch.equal(model.lm_head.weight, again.lm_head.weight)


def synthetic_keyword_retriever():
    from envs.data.synthwiki import default_world

    return KeywordRetriever([Doc(r["id"], *r["contents"].split("\n", 1))
                             for r in default_world().corpus])


def test_tiny_build_end_to_end(tmp_path, tok):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agents.hf import HFPolicy
    from envs.observation import observe_awaiting

    out = tmp_path / "micro"
    path = build_micro_base(out, episodes_per_dataset=1, epochs=12, lr=1e-2, batch_tokens=2048,
                            hidden_size=64, num_layers=3, num_heads=2, only_correct=False,
                            induction=True, lookup=True, worlds=(0,),
                            retriever=synthetic_keyword_retriever(), progress=False)
    assert path == out
    record = json.loads((out / "micro_build.json").read_text())
    assert record["episodes"] == 14 and record["steps"] == len(record["losses"])
    assert record["losses"][-1] < 0.7 * record["losses"][0]
    stamp = (out / "micro_build.json").stat().st_mtime_ns
    assert build_micro_base(out, episodes_per_dataset=1, retriever=object()) == out  # reused
    assert (out / "micro_build.json").stat().st_mtime_ns == stamp

    model = AutoModelForCausalLM.from_pretrained(out)
    loaded = AutoTokenizer.from_pretrained(out)
    assert loaded.get_vocab() == tok.get_vocab()
    env = micro_env_fn(loaded, "cascade", KeywordRetriever(WORLD), questions=[QUESTION])()
    env.reset(seed=0)
    [obs] = observe_awaiting(env)
    [action] = HFPolicy(model, loaded, temperature=0).act([obs])
    assert action.token_ids and isinstance(action.text, str)
    # SFT made the protocol likely: a Searcher's opening tag scores far better than before
    from agents.logprobs import sequence_logprobs

    turn = loaded.encode("<search>", add_special_tokens=False)
    seq = list(obs.token_ids) + turn
    start = len(obs.token_ids)
    assert model.config.induction["lookup_layer"] == 2
    untrained = micro_model(loaded, hidden_size=64, num_layers=3, num_heads=2, induction=True,
                            lookup=True)
    trained_lp = sequence_logprobs(model, [seq], [start])[0].sum()
    untrained_lp = sequence_logprobs(untrained, [seq], [start])[0].sum()
    assert trained_lp > untrained_lp + 1.0, (trained_lp, untrained_lp)


def test_the_base_imitates_right_episodes_and_every_skipped_search():
    from agents.scripted import SKIPPED_REPORT
    from algos.recipes.micro.episodes import imitated
    from envs.episode import Episode

    right = Episode({}, "cascade", team_em=1.0, reports=["Ana was born in Velm."])
    wrong = Episode({}, "cascade", team_em=0.0, reports=["Ana was born in 1901."])
    skipped = Episode({}, "hierarchical", team_em=0.0, reports=["Ana was born in Velm.", SKIPPED_REPORT])
    assert imitated([right, wrong, skipped]) == [right, skipped]
    recalled = Episode({}, "cascade", team_em=0.0, reports=["Velm is a city in Oskar."])
    assert imitated([wrong, recalled]) == []
    assert imitated([wrong, recalled], recalled=["Velm is a city in Oskar."]) == [recalled]


def test_closed_book_practice_keeps_the_right_episodes_with_a_recalled_fact():
    from algos.recipes.micro.episodes import recalled_right
    from envs.episode import Episode

    fact = "Velm is a city in Oskar."
    right = Episode({}, "hierarchical", team_em=1.0, reports=["Ana was born in Velm.", fact])
    wrong = Episode({}, "hierarchical", team_em=0.0, reports=["Ana was born in Velm.", fact])
    searched = Episode({}, "hierarchical", team_em=1.0, reports=["Ana was born in Velm."])
    assert recalled_right([right, wrong, searched], [fact]) == [right]
    assert recalled_right([right], []) == []


def test_fact_rows_are_each_worlds_geography_as_the_words_after_summary(tok):
    from algos.recipes.micro.episodes import fact_rows, spaced_tags
    from algos.recipes.micro.tokenizer import synthetic_world

    facts = list(synthetic_world(0).geography().values())
    rows = fact_rows(tok, [0], 2)
    assert len(rows) == 2 * len(facts) == 280
    first = rows[0].token_ids.tolist()
    report = tok.encode(spaced_tags(f"<summary>{facts[0]}</summary>"), add_special_tokens=False)
    assert first[0] == tok.eos_token_id and first[1:] == report[1:-1]  # what a report from memory writes
    assert rows[len(facts)].token_ids.tolist() == first and rows[0].mask[1:].all()


def test_fact_recall_scores_the_object_tokens_only(tok):
    """A model that predicts every next token recalls every fact; one that is wrong only on
    the words between subject and object still does; one wrong on rivers' objects recalls the
    rest."""
    from types import SimpleNamespace

    from algos.recipes.micro.measure import fact_recall
    from algos.recipes.micro.tokenizer import synthetic_world

    world = synthetic_world(0)
    rivers = {tuple(tok.encode(" " + c.river + ".", add_special_tokens=False)) for c in world.cities}

    class Peeking:
        def __init__(self, wrong_at):
            self.wrong_at = wrong_at

        def __call__(self, ids):
            seq = ids[0].tolist()
            logits = torch.zeros(1, len(seq), tok.vocab_size)
            for i, nxt in enumerate(seq[1:] + [0]):
                logits[0, i, 0 if self.wrong_at(seq, i) else nxt] = 1.0
            return SimpleNamespace(logits=logits)

    def river_object(seq, i):
        return any(tuple(seq[-len(r):]) == r and i >= len(seq) - len(r) - 1 for r in rivers)

    assert fact_recall(Peeking(lambda seq, i: False), tok)["all"] == 1.0
    assert fact_recall(Peeking(lambda seq, i: i == 2), tok)["all"] == 1.0  # the wording, given
    figures = fact_recall(Peeking(river_object), tok)
    assert figures["river"] == 0.0 and figures["country"] == figures["capital"] == 1.0
    assert figures["all"] == pytest.approx(1 - len(world.cities) / len(world.geography()))


@pytest.mark.parametrize("workflow", ["cascade", "hierarchical"])
def test_skip_probability_is_summary_against_search_at_each_first_searcher_turn(tok, workflow):
    from algos.recipes.micro.episodes import questions
    from algos.recipes.micro.measure import searcher_skip_probability
    from envs.observation import observe_awaiting

    model = micro_model(tok, hidden_size=64, num_layers=2, num_heads=2).eval()
    retriever = synthetic_keyword_retriever()
    probabilities = searcher_skip_probability(model, tok, workflow=workflow, per_dataset=1,
                                              retriever=retriever)
    # Cascade: one Searcher per question; hierarchical: one per sub-task of the scripted wave.
    assert len(probabilities) == 7 if workflow == "cascade" else len(probabilities) >= 7
    # By hand for the first question: its first Searcher context, the two tags' logits.
    env = micro_env_fn(tok, workflow, retriever)()
    env.reset(seed=0, options={"question": questions("dev", 1)[0]})
    observations = observe_awaiting(env)
    if workflow == "hierarchical":
        env.step(EosScripted(tok).act(observations)[0])
        observations = observe_awaiting(env)
    first = next(o for o in observations if o.role == P.SEARCHER)
    with torch.no_grad():
        logits = model(torch.tensor([list(first.token_ids)])).logits[0, -1].double()
    search, summary = (logits[tok.convert_tokens_to_ids(t)].item() for t in ("<search>", "<summary>"))
    assert probabilities[0] == pytest.approx(1 / (1 + math.exp(search - summary)), abs=1e-12)
    assert all(0 < p < 1 for p in probabilities)


def test_lookup_heads_need_the_induction_circuit(tok):
    with pytest.raises(ValueError, match="lookup=True needs induction=True"):
        micro_model(tok, lookup=True)


def test_default_build_needs_the_default_retriever():
    with pytest.raises(ValueError, match="explicit out_dir"):
        build_micro_base(retriever=object())
    with pytest.raises(ValueError, match="skip_search must be in"):
        build_micro_base(skip_search=1.5)


def test_an_older_build_gets_its_circuits_freeze_declared_on_reuse(tmp_path, tok):
    """A base built before models declared their frozen parameters is reused as it is, with
    the declaration its wired circuit implies written into its config (RL then keeps the
    circuit frozen, as before); a base without a circuit gets none."""
    from algos.engine.freeze import FROZEN_KEY
    from algos.recipes.micro.circuit import frozen_entries

    for wired in (True, False):
        out = tmp_path / f"old-{wired}"
        model = micro_model(tok, hidden_size=64, num_layers=3, num_heads=2, induction=wired,
                            lookup=wired)
        model.save_pretrained(out)
        tok.save_pretrained(out)
        (out / "micro_build.json").write_text("{}")
        config = json.loads((out / "config.json").read_text())
        assert (FROZEN_KEY in config) == wired
        config.pop(FROZEN_KEY, None)
        (out / "config.json").write_text(json.dumps(config))
        weights = sorted(p.read_bytes() for p in out.glob("*.safetensors"))
        assert build_micro_base(out, retriever=object(), progress=False) == out
        again = json.loads((out / "config.json").read_text())
        if wired:
            assert again[FROZEN_KEY] == frozen_entries(model.config) == model.config.mopd_frozen
        else:
            assert FROZEN_KEY not in again
        assert {k: v for k, v in again.items() if k != FROZEN_KEY} == config
        assert sorted(p.read_bytes() for p in out.glob("*.safetensors")) == weights


def test_run_skip_probabilities_measures_each_finished_runs_start_and_end(tok, tmp_path, monkeypatch):
    """Each finished run's starting model and final checkpoint, in its stage's workflow, as
    searcher_skip_probability measures them; written beside the run and read back after."""
    import numpy as np

    import algos.recipes.micro.measure as measure
    from algos.mechanism import SKIP_FILE
    from algos.recipes.micro.mechanism import run_skip_probabilities

    retriever = synthetic_keyword_retriever()
    models = {}
    for name, seed in (("base", 0), ("teacher_final", 1), ("opd_final", 2)):
        models[name] = micro_model(tok, hidden_size=64, num_layers=2, num_heads=2, seed=seed).eval()
    base = tmp_path / "base"
    models["base"].save_pretrained(base)
    tok.save_pretrained(base)
    for variant, stage, final in (("teacher", "teacher", "teacher_final"), ("opd", "team", "opd_final")):
        run = tmp_path / "abl" / "seed0" / variant
        checkpoint = run / "checkpoints" / "step_000004"
        models[final].save_pretrained(checkpoint)
        tok.save_pretrained(checkpoint)
        (checkpoint / "trainer_state.pt").write_bytes(b"")
        (run / "run.json").write_text(json.dumps({"config": {"stage": stage, "model": str(base)}}))
    (tmp_path / "abl" / "seed0" / "none").mkdir()  # not finished: no run.json
    restored = tmp_path / "abl" / "seed0" / "base"  # finished, restored from archives: no checkpoint
    restored.mkdir()
    (restored / "run.json").write_text(json.dumps({"config": {"stage": "team", "model": str(base)}}))

    figures = run_skip_probabilities(tmp_path / "abl", per_dataset=1, retriever=retriever, progress=False)

    def expected(model, workflow):
        return float(np.mean(measure.searcher_skip_probability(model, tok, workflow=workflow, split="dev",
                                                               per_dataset=1, retriever=retriever)))

    assert sorted(figures) == ["seed0/opd", "seed0/teacher"]
    opd, teacher = figures["seed0/opd"], figures["seed0/teacher"]
    assert (opd["workflow"], teacher["workflow"], opd["final_step"]) == ("hierarchical", "cascade", 4)
    assert opd["step0"] == pytest.approx(expected(models["base"], "hierarchical"), abs=1e-6)
    assert opd["final"] == pytest.approx(expected(models["opd_final"], "hierarchical"), abs=1e-6)
    assert teacher["step0"] == pytest.approx(expected(models["base"], "cascade"), abs=1e-6)
    assert teacher["final"] == pytest.approx(expected(models["teacher_final"], "cascade"), abs=1e-6)
    assert opd["final"] != opd["step0"]
    saved = json.loads((tmp_path / "abl" / "seed0" / "opd" / SKIP_FILE).read_text())
    assert saved == opd and not (restored / SKIP_FILE).exists()
    monkeypatch.setattr(measure, "searcher_skip_probability", lambda *a, **k: pytest.fail("measured again"))
    assert run_skip_probabilities(tmp_path / "abl", per_dataset=1, retriever=retriever, progress=False) == figures


def test_closed_book_settings_key_a_base_only_when_set():
    """``facts``, ``recall``, ``known_worlds`` and ``skip_known`` at their defaults leave the cache key as it was (the bases
    built before them are found); set, each is another base. (Look-ups only: nothing built.)"""
    def where(**options):
        with pytest.raises(FileNotFoundError) as missing:
            build_micro_base(build=False, threads=1, progress=False, **options)
        return str(missing.value).split(" for these")[0]

    plain = where()
    assert where(facts=0, recall=False) == plain
    assert len({plain, where(facts=30), where(recall=True), where(facts=30, recall=True)}) == 4
    assert where(known_worlds=None, skip_known=None) == plain
    assert len({plain, where(known_worlds=(0,)), where(known_worlds=[0, 0]), where(skip_known=0.4)}) == 3
    assert where(recall=True, recall_practice=0) == where(recall=True) != where(recall=True, recall_practice=150)
    with pytest.raises(ValueError, match="recall_practice needs recall"):
        build_micro_base(build=False, threads=1, recall_practice=150)
    with pytest.raises(ValueError, match="recall_practice must be an integer"):
        build_micro_base(build=False, threads=1, recall=True, recall_practice=-1)
    with pytest.raises(ValueError, match="known_worlds"):
        build_micro_base(build=False, threads=1, known_worlds=(7,))
    with pytest.raises(ValueError, match="skip_known"):
        build_micro_base(build=False, threads=1, skip_known=2.0)
    with pytest.raises(ValueError, match="facts must be an integer >= 0"):
        build_micro_base(build=False, threads=1, facts=-1)
