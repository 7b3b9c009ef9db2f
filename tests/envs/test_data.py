"""QA loaders: FlashRAG layout, JSONL and parquet, real-data quirks, helpful errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from envs.data import (
    DATASETS,
    MULTI_HOP,
    SINGLE_HOP,
    QAItem,
    default_world,
    load_qa,
    read_jsonl,
    write_jsonl,
)

REALDATA = Path("/work/shared/realdata")

ITEMS = [
    QAItem("test_0", "who wrote the novel Night over Kessa", ["Maren Tolvik"], "nq"),
    QAItem(
        "test_1",
        "what year was Kessa founded",
        ("1204", "AD 1204"),
        "nq",
        metadata={"style": "factoid", "hops": 1, "supporting": ["12"]},
    ),
    QAItem("test_2", "Who composed 'Velmira'? \u00e9\u00e8", "Ivo Dansk", "nq"),
]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def good_row(i: int) -> str:
    return json.dumps({"id": f"test_{i}", "question": f"question {i}?", "golden_answers": ["a"]})


# ----------------------------------------------------------------------------- QAItem


def test_dataset_names():
    assert len(DATASETS) == 7
    assert SINGLE_HOP == ("nq", "triviaqa", "popqa")
    assert MULTI_HOP == ("hotpotqa", "2wikimultihopqa", "musique", "bamboogle")


def test_qaitem_normalises_answers_and_hashes():
    item = QAItem("1", "q?", ["x", "y"], "nq", metadata={"hops": 1})
    assert item.golden_answers == ("x", "y")
    assert QAItem("1", "q?", "x").golden_answers == ("x",)
    # metadata takes part in ==, not in hash
    same = QAItem("1", "q?", ("x", "y"), "nq", metadata={"hops": 1})
    assert item == same and hash(item) == hash(same)
    assert item != QAItem("1", "q?", ("x", "y"), "nq", metadata={"hops": 2})
    assert len({item, same}) == 1


def test_qaitem_to_dict_from_dict():
    row = ITEMS[1].to_dict()
    assert row == {
        "id": "test_1",
        "question": "what year was Kessa founded",
        "golden_answers": ["1204", "AD 1204"],
        "dataset": "nq",
        "metadata": {"style": "factoid", "hops": 1, "supporting": ["12"]},
    }
    assert "metadata" not in ITEMS[0].to_dict()
    assert QAItem.from_dict(row) == ITEMS[1]


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(golden_answers=[]), "golden_answers is empty"),
        (dict(golden_answers=["", "  "]), "golden_answers is empty"),
        (dict(golden_answers=[None]), "must hold strings, got NoneType"),
        (dict(question=""), "question is empty"),
        (dict(id=1.5), "id must be a string, got float 1.5"),
    ],
)
def test_qaitem_rejects_nonsense(bad, message):
    fields = dict(id="1", question="q?", golden_answers=["a"]) | bad
    with pytest.raises(ValueError, match=message):
        QAItem(**fields)


# ------------------------------------------------------------------------ read/write


def test_jsonl_round_trip(tmp_path):
    path = write_jsonl(tmp_path / "nq" / "test.jsonl", [item.to_dict() for item in ITEMS])
    assert path == tmp_path / "nq" / "test.jsonl"
    assert read_jsonl(path) == [item.to_dict() for item in ITEMS]
    assert "\u00e9\u00e8" in path.read_text(encoding="utf-8")  # written as UTF-8, not escaped
    loaded = load_qa("nq", "test", root=tmp_path)
    assert loaded == ITEMS
    assert load_qa("nq", "test", root=str(tmp_path), limit=2) == ITEMS[:2]
    assert load_qa("nq", "test", root=tmp_path, limit=0) == []


def test_read_jsonl_skips_blank_lines_but_counts_them(tmp_path):
    path = write_lines(tmp_path / "x.jsonl", [good_row(0), "", "   ", "{bad"])
    with pytest.raises(ValueError, match=r"x\.jsonl, line 4: bad JSON"):
        read_jsonl(path)
    write_lines(path, [good_row(0), "", good_row(1)])
    assert [row["id"] for row in read_jsonl(path)] == ["test_0", "test_1"]


def test_parquet_round_trip(tmp_path):
    rows = [
        {
            "id": f"dev_{i}",
            "question": f"Who was born first, A{i} or B{i}?",
            "golden_answers": [f"A{i}"],
            "dataset": "2wikimultihopqa",
            "metadata": {"style": "comparison", "hops": 2, "supporting": [str(i), str(i + 1)]},
        }
        for i in range(4)
    ]
    path = tmp_path / "2wikimultihopqa" / "dev.parquet"
    path.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path)
    loaded = load_qa("2wikimultihopqa", "dev", root=tmp_path)
    assert loaded == [QAItem.from_dict(row) for row in rows]
    assert loaded[3].golden_answers == ("A3",)
    assert loaded[3].metadata["supporting"] == ["3", "4"]
    assert len(load_qa("2wikimultihopqa", "dev", root=tmp_path, limit=3)) == 3


def test_parquet_malformed_row_names_row(tmp_path):
    rows = [
        {"id": "0", "question": "q?", "golden_answers": ["a"]},
        {"id": "1", "question": "", "golden_answers": ["b"]},
    ]
    path = tmp_path / "nq" / "train.parquet"
    path.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(ValueError, match=r"train\.parquet, row 2: question is empty"):
        load_qa("nq", "train", root=tmp_path)


def test_real_data_quirks_are_normalised(tmp_path):
    aliases = [f"Alias {i}" for i in range(75)]
    write_lines(
        tmp_path / "triviaqa" / "dev.jsonl",
        [
            json.dumps({"id": 17, "question": "q1?", "golden_answers": "Mark Twain"}),
            json.dumps(
                {
                    "id": "dev_2",
                    "question": "q2?",
                    "golden_answers": aliases,
                    "dataset": "triviaqa",
                    "extra": {"ignored": True},
                    "metadata": {"k": 1},
                }
            ),
            json.dumps({"id": "dev_3", "question": "q3?", "golden_answers": [1984, "nineteen"]}),
        ],
    )
    a, b, c = load_qa("triviaqa", "dev", root=tmp_path)
    assert a == QAItem("17", "q1?", ("Mark Twain",), "triviaqa")
    assert b.golden_answers == tuple(aliases) and b.metadata == {"k": 1}
    assert c.golden_answers == ("1984", "nineteen")
    assert c.dataset == "triviaqa"  # filled in from the directory name


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"id": "x", "question": "q?", "golden_answers": ["a"]', "bad JSON"),
        ('["not", "an", "object"]', "a row must be a JSON object, got list"),
        ('{"id": "x", "golden_answers": ["a"]}', "missing 'question'"),
        ('{"id": "x", "question": "q?"}', "missing 'golden_answers'"),
        ('{"question": "q?", "golden_answers": ["a"]}', "missing 'id'"),
        ('{"id": "x", "question": "q?", "golden_answers": {"a": 1}}', "got dict"),
        ('{"id": "x", "question": "q?", "golden_answers": [["a"]]}', "must hold strings, got list"),
        (
            '{"id": "x", "question": 7, "golden_answers": ["a"]}',
            "question must be a string, got int 7",
        ),
        (
            '{"id": "x", "question": "q?", "golden_answers": ["a"], "metadata": [1]}',
            "metadata must be a mapping",
        ),
    ],
)
def test_malformed_row_names_file_and_line(tmp_path, line, message):
    path = write_lines(
        tmp_path / "hotpotqa" / "dev.jsonl", [good_row(0), good_row(1), line, good_row(3)]
    )
    with pytest.raises(ValueError) as error:
        load_qa("hotpotqa", "dev", root=tmp_path)
    assert f"{path}, line 3:" in str(error.value)
    assert message in str(error.value)
    # rows before the bad one are fine: a limit that stops short of it loads
    assert len(load_qa("hotpotqa", "dev", root=tmp_path, limit=2)) == 2


def test_bytes_that_are_not_utf8_are_refused_with_file_line_and_byte(tmp_path):
    path = tmp_path / "nq" / "test.jsonl"
    path.parent.mkdir()
    bad = json.dumps({"id": "x", "question": "caf\u00e9?", "golden_answers": ["a"]}, ensure_ascii=False).encode(
        "latin-1"
    )
    path.write_bytes((good_row(0) + "\n\n").encode() + bad + b"\n")
    with pytest.raises(ValueError) as error:
        load_qa("nq", "test", root=tmp_path)
    assert str(error.value) == f"{path}, line 3: not UTF-8 text (byte 0xe9 at column 29)"
    # a byte-order mark before the first row is not part of it
    path.write_bytes(b"\xef\xbb\xbf" + (good_row(0) + "\n").encode())
    assert [item.id for item in load_qa("nq", "test", root=tmp_path)] == ["test_0"]


def test_gzip_split_loads_and_a_truncated_one_names_file_and_line(tmp_path):
    rows = "".join(good_row(i) + "\n" for i in range(2000)).encode()
    path = tmp_path / "popqa" / "dev.jsonl.gz"
    path.parent.mkdir()
    path.write_bytes(gzip.compress(rows))
    items = load_qa("popqa", "dev", root=tmp_path)
    assert [item.id for item in items[:2]] == ["test_0", "test_1"] and len(items) == 2000
    whole = gzip.compress(rows)
    path.write_bytes(whole[: len(whole) // 2])  # a download cut short
    with pytest.raises(ValueError) as error:
        load_qa("popqa", "dev", root=tmp_path)
    message = str(error.value)
    assert message.startswith(f"{path}, line ") and "truncated or corrupt" in message
    line = int(message.split("line ")[1].split(":")[0])
    assert 1 < line <= 2000  # the rows before the cut were read
    assert len(load_qa("popqa", "dev", root=tmp_path, limit=line - 1)) == line - 1


def test_data_modules_import_no_circle():
    """items <- synthwiki <- qa: the loader may use the world; the world never the loader."""
    import ast

    def imports(name: str) -> set[str]:
        """The other ``envs.data`` modules that module (or package) ``name`` imports."""
        path = Path(f"envs/data/{name}")
        found = set()
        for file in sorted(path.glob("*.py")) if path.is_dir() else [path.with_suffix(".py")]:
            tree = ast.parse(file.read_text())
            found |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
            found |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        found = {m.split(".")[2] for m in found if m.startswith("envs.data.")}
        return found - {name}

    assert imports("items") == set()
    assert imports("synthwiki") == {"items"}
    assert "synthwiki" in imports("qa") and "qa" not in imports("synthwiki")


# ------------------------------------------------------------------------ what's there


def test_missing_split_lists_existing_splits(tmp_path):
    write_lines(tmp_path / "musique" / "train.jsonl", [good_row(0)])
    write_lines(tmp_path / "musique" / "dev.jsonl", [good_row(0)])
    with pytest.raises(
        FileNotFoundError, match=r"no split 'test' for 'musique'.*splits in .*: dev, train"
    ):
        load_qa("musique", "test", root=tmp_path)


def test_missing_dataset_lists_datasets(tmp_path):
    write_lines(tmp_path / "nq" / "test.jsonl", [good_row(0)])
    with pytest.raises(FileNotFoundError, match=r"datasets in .*: nq"):
        load_qa("popqa", "test", root=tmp_path)
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        load_qa("popqa", "test", root=tmp_path / "nowhere")


def test_unknown_name_lists_valid_ones_unless_the_directory_has_it(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset 'nqq'; expected one of: nq, triviaqa"):
        load_qa("nqq", "test", root=tmp_path)
    with pytest.raises(ValueError, match="unknown dataset 'nqq'"):
        load_qa("nqq", "test")  # checked before any download
    with pytest.raises(ValueError, match="unknown dataset 'nqq'"):
        load_qa("nqq", "test", root="synthetic")
    write_lines(tmp_path / "my_set" / "test.jsonl", [good_row(0)])
    (item,) = load_qa("my_set", "test", root=tmp_path)
    assert item.dataset == "my_set" and item.golden_answers == ("a",)


def test_offline_hub_load_says_how_to_use_local_files(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))  # empty cache
    with pytest.raises(FileNotFoundError) as error:
        load_qa("hotpotqa", "dev")
    message = str(error.value)
    assert "RUC-NLPIR/FlashRAG_datasets" in message and "hotpotqa/dev.jsonl" in message
    assert "HF_HUB_OFFLINE" in message
    assert "root=DIR" in message
    assert "python -m envs data synth --out DIR" in message


def test_root_synthetic_is_the_default_world():
    items = load_qa("bamboogle", "dev", root="synthetic", limit=3)
    assert items == default_world().questions("bamboogle", "dev")[:3]
    assert len(load_qa("nq", root="synthetic")) == 100


@pytest.mark.skipif(not REALDATA.is_dir(), reason="real benchmark samples not present")
@pytest.mark.parametrize("name", DATASETS)
def test_real_samples_load(name):
    split = "test" if (REALDATA / name / "test.jsonl").exists() else "dev"
    items = load_qa(name, split, root=REALDATA)
    assert len(items) == 100
    assert len({item.id for item in items}) == 100
    assert all(item.dataset == name for item in items)
    assert all(item.question.strip() and item.golden_answers for item in items)
    assert all(isinstance(a, str) for item in items for a in item.golden_answers)
    if name == "triviaqa":  # the long alias lists survive whole
        assert max(len(item.golden_answers) for item in items) == 75
