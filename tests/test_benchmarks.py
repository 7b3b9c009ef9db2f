"""The evaluation suite end to end: synthetic and FlashRAG-layout data, files and numbers."""

import json

import pytest

from benchmarks.__main__ import main as bench_main
from benchmarks.suite import run_suite


def test_run_on_synthetic_writes_consistent_results(tmp_path):
    out = tmp_path / "res"
    summary = run_suite("scripted", out_dir=out, datasets=("nq", "hotpotqa"), limit=3, runs=2,
                        progress=False, log=lambda *_: None)
    records = [json.loads(x) for x in (out / "questions.jsonl").read_text().splitlines()]
    assert len(records) == 6 and all(len(r["correct"]) == 2 for r in records)
    nq = [r for r in records if r["dataset"] == "nq"]
    assert summary["datasets"]["nq"]["avg@k"] == pytest.approx(sum(sum(r["correct"]) for r in nq) / 6)
    assert summary["meta"]["runs"] == 2 and summary["meta"]["top_k"] == 3
    assert "| H-MAS scripted |" in (out / "table.md").read_text()
    assert (out / "accuracy_vs_cost.png").stat().st_size > 0 and (out / "per_dataset.png").exists()


def test_flashrag_directory_with_its_own_corpus(tmp_path, capsys):
    data = tmp_path / "data" / "hotpotqa"
    data.mkdir(parents=True)
    (data / "dev.jsonl").write_text(json.dumps(
        {"id": "h1", "question": "Where was Ada Quill born?", "golden_answers": ["Tarnby"]}) + "\n")
    corpus = tmp_path / "corpus.jsonl"
    rows = [{"id": "1", "contents": "Ada Quill\nAda Quill was born in Tarnby in 1870."},
            {"id": "2", "contents": "Tarnby\nTarnby is a town on the coast."},
            {"id": "3", "contents": "Ben Quill\nBen Quill was born in Oslen."}]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = bench_main(["run", "--policy", "scripted", "--data", str(tmp_path / "data"), "--datasets", "hotpotqa,nq",
                       "--split", "dev", "--runs", "1", "--corpus", str(corpus), "--out", str(tmp_path / "r"),
                       "--no-progress"])
    assert code == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["meta"]["skipped"] == ["nq"] and summary["meta"]["retriever"] == str(corpus)
    assert summary["datasets"]["hotpotqa"]["avg@k"] == 1.0
    assert "HotpotQA" in capsys.readouterr().out
