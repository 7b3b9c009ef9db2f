"""The synthetic world: deterministic, well-formed, answerable from its own passages."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from envs.data import DATASETS, SINGLE_HOP, build_world, default_world, load_qa, read_jsonl
from envs.data.cli import main as cli_main
from envs.data.synthwiki import COMPARISON_STYLES, SPLITS, write_flashrag
from envs.data.synthwiki.names import TITLE_ADJECTIVES, TITLE_NOUNS

STYLES = {
    "nq": {"factoid"},
    "triviaqa": {"trivia"},
    "popqa": {"relation"},
    "hotpotqa": {"bridge", "comparison"},
    "2wikimultihopqa": {"comparison", "composition", "bridge_comparison"},
    "musique": {"composition"},
    "bamboogle": {"hard_two_hop"},
}


@pytest.fixture(scope="module")
def world():
    return default_world()


def every_question(world):
    for dataset in DATASETS:
        for split in SPLITS:
            yield from world.questions(dataset, split)


def title(world, pid: str) -> str:
    return world.text(pid).split("\n", 1)[0]


def test_same_seed_same_bytes_other_seed_other_world(tmp_path):
    a, b, c = default_world(), build_world(0), build_world(1)
    assert a.corpus == b.corpus
    assert a.all_questions("train") == b.all_questions("train")
    write_flashrag(a, tmp_path / "a")
    write_flashrag(b, tmp_path / "b")
    for path in sorted((tmp_path / "a").rglob("*.jsonl")):
        assert path.read_bytes() == (tmp_path / "b" / path.relative_to(tmp_path / "a")).read_bytes()
    titles_a = {row["contents"].split("\n")[0] for row in a.corpus}
    titles_c = {row["contents"].split("\n")[0] for row in c.corpus}
    assert len(titles_a & titles_c) < 0.05 * len(titles_a)
    assert a.questions("nq", "test") != c.questions("nq", "test")


def test_same_world_in_another_process(world):
    """No dependence on hash randomisation: another interpreter builds the same bytes."""
    code = (
        "import hashlib, json; from envs.data import default_world; w = default_world(); "
        "print(hashlib.sha256(json.dumps([w.corpus, [q.to_dict() for q in "
        "w.questions('musique', 'test')]]).encode()).hexdigest())"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        check=True,
    )
    payload = json.dumps([world.corpus, [q.to_dict() for q in world.questions("musique", "test")]])
    assert result.stdout.strip() == hashlib.sha256(payload.encode()).hexdigest()


def test_default_sizes():
    w = build_world(0)
    assert 1500 <= len(w.corpus) <= 3000
    for dataset in DATASETS:
        assert [len(w.questions(dataset, s)) for s in SPLITS] == [200, 50, 100]


def test_splits_are_disjoint_and_ids_unique(world):
    for dataset in DATASETS:
        questions = {s: {q.question for q in world.questions(dataset, s)} for s in SPLITS}
        assert len(questions["train"]) == 200 and len(questions["test"]) == 100
        assert not questions["train"] & questions["dev"]
        assert not questions["train"] & questions["test"]
        assert not questions["dev"] & questions["test"]
        ids = [q.id for s in SPLITS for q in world.questions(dataset, s)]
        assert len(ids) == len(set(ids))
        assert world.questions(dataset, "test")[0].id == "test_0"


def test_test_split_does_not_move_when_train_grows():
    small = build_world(0, train=7, dev=3, test=100)
    assert small.questions("musique", "test") == default_world().questions("musique", "test")
    assert [len(small.questions("musique", s)) for s in SPLITS] == [7, 3, 100]
    assert small.corpus == default_world().corpus


def test_corpus_rows_are_flashrag_passages(world):
    corpus = world.corpus
    assert len(corpus) <= 3000
    assert [row["id"] for row in corpus] == [str(i) for i in range(len(corpus))]
    for row in corpus:
        assert set(row) == {"id", "contents"}
        head, text = row["contents"].split("\n")
        assert head and head == head.strip()
        sentences = re.findall(r"[.!?](?:\s|$)", text)
        assert 2 <= len(sentences) <= 4, row
        assert head in text.split(".")[0]  # the first sentence names the subject
    per_title = Counter(row["contents"].split("\n")[0] for row in corpus)
    assert max(per_title.values()) == 2  # an entity has one or two passages
    # corpus returns copies: mutating them leaves the shared world alone
    corpus[0]["contents"] = "changed"
    assert world.corpus[0]["contents"] != "changed"


def test_names_unique_and_look_alikes_present(world):
    names = [p.name for p in world.people]
    assert len(names) == len(set(names)) == 800
    entity_names = (
        names
        + [c.name for c in world.cities]
        + [c.name for c in world.countries]
        + [o.name for o in world.orgs]
        + [w.title for w in world.works]
    )
    assert len({n.lower() for n in entity_names}) == len(entity_names)
    surnames = Counter(p.surname for p in world.people)
    assert sum(n for n in surnames.values() if n > 1) > 400  # relatives share a surname

    # near-twins: people whose names differ in one letter
    def letter_masks(name: str) -> list[str]:
        return [name[:i] + "?" + name[i + 1 :] for i in range(len(name))]

    assert len(one_off(names, letter_masks)) >= 150
    # titles that differ from another title in one ordinary word ("Garden" / "Lantern")
    vocabulary = set(TITLE_NOUNS + TITLE_ADJECTIVES)

    def masks(title: str) -> list[str]:
        words = title.split()
        return [
            " ".join(words[:i] + ["?"] + words[i + 1 :])
            for i, w in enumerate(words)
            if w in vocabulary
        ]

    assert len(one_off([w.title for w in world.works], masks)) >= 70


def one_off(names: list[str], masks) -> set[str]:
    """The names that share a mask (the name with one part blanked) with another name."""
    by_mask: dict[str, list[str]] = {}
    for name in names:
        for mask in masks(name):
            by_mask.setdefault(mask, []).append(name)
    return {name for group in by_mask.values() if len(group) > 1 for name in group}


def test_questions_are_well_formed(world):
    for dataset in DATASETS:
        styles = Counter()
        for q in world.questions(dataset, "train") + world.questions(dataset, "test"):
            meta = q.metadata
            assert q.dataset == dataset
            assert meta["style"] in STYLES[dataset]
            assert meta["hops"] == len(meta["supporting"])
            assert all(pid in world.passages for pid in meta["supporting"])
            assert len(set(meta["supporting"])) == len(meta["supporting"])
            styles[meta["style"]] += 1
        assert set(styles) == STYLES[dataset], (dataset, styles)
        hops = {q.metadata["hops"] for q in world.questions(dataset, "train")}
        assert hops == (
            {1}
            if dataset in SINGLE_HOP
            else {2, 3, 4}
            if dataset == "musique"
            else {2, 4}
            if dataset == "2wikimultihopqa"
            else {2}
        )


def test_answers_occur_in_supporting_passages(world):
    for q in every_question(world):
        texts = [world.text(pid) for pid in q.metadata["supporting"]]
        if q.metadata["style"] in COMPARISON_STYLES:
            (answer,) = q.golden_answers
            assert answer in q.question
            assert answer in [title(world, pid) for pid in q.metadata["supporting"]]
            continue
        for answer in q.golden_answers:
            assert any(answer in t for t in texts), (q, answer)
        # ... and the question does not give it away
        assert not any(a.lower() in q.question.lower() for a in q.golden_answers), q


def test_last_hop_holds_the_answer(world):
    for q in every_question(world):
        if q.metadata["style"] in COMPARISON_STYLES:
            continue
        *_, last = q.metadata["supporting"]
        assert q.golden_answers[0] in world.text(last), q


def test_single_hop_questions_name_their_subject(world):
    for dataset in SINGLE_HOP:
        for q in world.questions(dataset, "test"):
            (pid,) = q.metadata["supporting"]
            assert title(world, pid) in q.question, q


def test_some_answers_have_aliases(world):
    aliased = [q for q in every_question(world) if len(q.golden_answers) > 1]
    assert len(aliased) > 100
    rivers = [q for q in aliased if q.golden_answers[0].endswith(" River")]
    assert rivers and all(
        q.golden_answers[1] == q.golden_answers[0][: -len(" River")] for q in rivers
    )


def test_write_flashrag_reads_back_equal(tmp_path, world):
    written = write_flashrag(world, tmp_path)
    assert written["corpus.jsonl"] == len(world.corpus)
    assert read_jsonl(tmp_path / "corpus.jsonl") == world.corpus
    for dataset in DATASETS:
        for split in SPLITS:
            assert written[f"{dataset}/{split}.jsonl"] == len(world.questions(dataset, split))
            assert load_qa(dataset, split, root=tmp_path) == world.questions(dataset, split)


def test_too_small_a_world_says_so():
    with pytest.raises(ValueError, match="too few distinct nq questions: found"):
        build_world(
            0, people=60, orgs=10, works=20, cities=5, countries=2, train=0, dev=0, test=2000
        )
    with pytest.raises(ValueError, match="train must be >= 0"):
        build_world(0, train=-1)


def test_unknown_dataset_or_split(world):
    with pytest.raises(ValueError, match="unknown dataset 'wiki'"):
        world.questions("wiki", "test")
    with pytest.raises(ValueError, match="unknown split 'validation'"):
        world.questions("nq", "validation")


def test_cli_synth_writes_the_files(tmp_path, capsys):
    out = tmp_path / "synth"
    assert (
        cli_main(
            ["synth", "--out", str(out), "--seed", "3", "--train", "5", "--dev", "2", "--test", "4"]
        )
        == 0
    )
    printed = capsys.readouterr().out
    corpus = read_jsonl(out / "corpus.jsonl")
    assert f"corpus.jsonl: {len(corpus)} passages" in printed
    assert re.search(r"2wikimultihopqa\s+train\s+5\s+dev\s+2\s+test\s+4", printed)
    for dataset in DATASETS:
        assert [len(read_jsonl(out / dataset / f"{s}.jsonl")) for s in SPLITS] == [5, 2, 4]
    assert load_qa("nq", "test", root=out) == build_world(3, train=5, dev=2, test=4).questions(
        "nq", "test"
    )


def test_cli_show(tmp_path, capsys, monkeypatch):
    assert (
        cli_main(["show", "hotpotqa", "--root", "synthetic", "--split", "dev", "--limit", "2"]) == 0
    )
    printed = capsys.readouterr().out
    first = default_world().questions("hotpotqa", "dev")[0]
    assert "hotpotqa/dev from synthetic: 50 questions, showing 2" in printed
    assert f"[dev_0] {first.question}" in printed
    assert "[dev_2]" not in printed
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli_main(["show", "nq", "--root", str(tmp_path)]) == 2
    assert "no dataset directory" in capsys.readouterr().err


def test_the_geography_facts_state_what_the_corpus_says_and_the_reader_reads_them(world):
    """SynthWiki.geography(): one fact per city (country, river) and country (capital,
    language), each true to the entities, and agents.reading reads the answer off it as a
    report, as the Leader reads a Searcher's."""
    from agents.reading import Chain, resolve, sentences_of

    facts = world.geography()
    assert len(facts) == 2 * len(world.cities) + 2 * len(world.countries)
    truth = {}
    for city in world.cities:
        truth[city.name, "country"] = world.countries[city.country].name
        truth[city.name, "river"] = city.river
    for country in world.countries:
        truth[country.name, "capital"] = world.cities[country.capital].name
        truth[country.name, "language"] = country.language
    assert facts.keys() == truth.keys()
    for (entity, relation), sentence in facts.items():
        hops = resolve(Chain(entity, (relation,)), sentences_of("", sentence))
        assert [h.answer for h in hops] == [truth[entity, relation]], sentence
    port = world.cities[0]
    assert facts[port.name, "country"] == f"{port.name} is a city in {world.countries[port.country].name}."
