"""Bad input files end a command in one line naming the file and line (issue 27, items 8
and 9): dataset rows before any episode is played or any model is built, episode lines
in ``agents view`` and ``agents replay``. Never a traceback, never a RecursionError."""

from __future__ import annotations

import json

import pytest

from envs.data import load_qa
from envs.episode import Episode, Segment

DEEP = "[" * 100_000 + "]" * 100_000
"""A line json.loads answers with a RecursionError."""

GOOD_ROW = json.dumps({"id": "m1", "question": "Where was Ada Quill born?", "golden_answers": ["Tarnby"]})

BAD_ROWS = {
    "answers a number": (json.dumps({"id": "m2", "question": "q?", "golden_answers": 5}),
                         "golden_answers must be a string or a list of strings, got int 5"),
    "answers null": (json.dumps({"id": "m2", "question": "q?", "golden_answers": None}),
                     "golden_answers must be a string or a list of strings, got NoneType None"),
    "an answer a list": (json.dumps({"id": "m2", "question": "q?", "golden_answers": [["a"]]}),
                         "golden_answers must hold strings, got list"),
    "no question": (json.dumps({"id": "m2", "golden_answers": ["a"]}), "missing 'question'"),
    "empty question": (json.dumps({"id": "m2", "question": " ", "golden_answers": ["a"]}), "question is empty"),
    "nested 100,000 deep": (DEEP, "nested 100000 levels deep"),
}


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-2000:]
    assert "Traceback" not in err and "RecursionError" not in err
    return lines[0]


@pytest.mark.parametrize("kind", BAD_ROWS)
def test_a_bad_row_is_refused_with_file_and_line(kind, tmp_path):
    line, what = BAD_ROWS[kind]
    path = tmp_path / "musique" / "dev.jsonl"
    path.parent.mkdir()
    path.write_text(f"{GOOD_ROW}\n{line}\n", encoding="utf-8")
    with pytest.raises(ValueError) as err:
        load_qa("musique", "dev", root=tmp_path)
    assert f"{path}, line 2:" in str(err.value) and what in str(err.value)
    assert len(str(err.value)) < 300  # the message quotes the row, not 200,000 brackets


def test_a_deep_json_array_file_is_refused_too(tmp_path):
    path = tmp_path / "nq" / "test.json"
    path.parent.mkdir()
    path.write_text(f"[{GOOD_ROW}, {DEEP}]", encoding="utf-8")
    with pytest.raises(ValueError, match="nested 100001 levels deep"):
        load_qa("nq", "test", root=tmp_path)


@pytest.mark.parametrize("kind", BAD_ROWS)
def test_benchmarks_run_refuses_a_bad_row_before_any_episode(kind, tmp_path, capsys, monkeypatch):
    """hotpotqa is good and comes first; musique's line 2 is bad and past --limit 1: the run
    stops before the first episode, says which file and line in one line, writes nothing."""
    import benchmarks.suite
    from benchmarks.__main__ import main

    played = []

    def collect(env_fn, policy, questions, *args, **kwargs):
        played.append(questions)
        raise AssertionError("an episode was played before the data was checked")

    monkeypatch.setattr(benchmarks.suite, "collect", collect)
    data = tmp_path / "data"
    for name, rows in (("hotpotqa", [GOOD_ROW]), ("musique", [GOOD_ROW, BAD_ROWS[kind][0], GOOD_ROW])):
        (data / name).mkdir(parents=True)
        (data / name / "dev.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "1", "contents": "Ada Quill\nAda Quill was born in Tarnby."}) + "\n")
    out = tmp_path / "results"
    code = main(["run", "--policy", "scripted", "--data", str(data), "--datasets", "hotpotqa,musique",
                 "--split", "dev", "--runs", "1", "--limit", "1", "--corpus", str(corpus), "--out", str(out),
                 "--no-progress"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2
    assert f"{data / 'musique' / 'dev.jsonl'}, line 2: " in line and BAD_ROWS[kind][1] in line, line
    assert played == [] and not out.exists()  # no results, not even hotpotqa's


def test_benchmarks_run_refuses_an_unknown_dataset_before_any_episode(tmp_path, capsys):
    from benchmarks.__main__ import main

    code = main(["run", "--policy", "scripted", "--datasets", "nq,nosuch", "--out", str(tmp_path / "r")])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and "unknown dataset 'nosuch'" in line
    assert not (tmp_path / "r").exists()


def test_algos_train_refuses_a_deep_line_in_one_line(tmp_path, capsys, nothing_builds):
    from algos.__main__ import main

    data = tmp_path / "data"
    (data / "nq").mkdir(parents=True)
    (data / "nq" / "train.jsonl").write_text(f"{GOOD_ROW}\n{GOOD_ROW}\n{DEEP}\n", encoding="utf-8")
    (data / "nq" / "dev.jsonl").write_text(f"{GOOD_ROW}\n", encoding="utf-8")
    code = main(["train", "--stage", "teacher", "--out", str(tmp_path / "run"), "--set", f"data={data}",
                 "--set", "train_datasets=nq", "--set", "val_datasets=nq", "--set", "train_per_dataset=1"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2
    assert f"{data / 'nq' / 'train.jsonl'}, line 3: bad JSON (nested 100000 levels deep" in line, line


# ------------------------------------------------------------------ episode files (item 9)


def good_record() -> dict:
    seg = Segment("searcher_0", "searcher", 0, token_ids=[1, 2, 3, 4], loss_mask=[0, 0, 1, 1],
                  logprobs=[0.0, 0.0, -0.5, -0.1], task="Where?", output="Tarnby")
    ep = Episode(question={"id": "q1", "question": "Where was Ada Quill born?", "golden_answers": ["Tarnby"]},
                 workflow="cascade", segments=[seg], candidates=["Tarnby"], final_answer="Tarnby",
                 rewards={"searcher_0": 1.0}, turn_spans=[[0, 2, 4]])
    return ep.to_dict()


def mutated(change) -> str:
    record = good_record()
    change(record)
    return json.dumps(record)


MALFORMED = {
    "bad JSON": '{"question": {"question": "q"}, "segments": [',
    "not an object": "[1, 2, 3]",
    "not an episode": json.dumps({"step": 1, "team/em": 0.5}),
    "nested 100,000 deep": DEEP,
    "nested objects": '{"a":' * 100_000 + "1" + "}" * 100_000,
    "workflow missing": mutated(lambda r: r.pop("workflow")),
    "segment agent missing": mutated(lambda r: r["segments"][0].pop("agent")),
    "unknown field": mutated(lambda r: r.update({"\x1b[2Jzz": 1})),
    "question a string": mutated(lambda r: r.update(question="where?")),
    "golden_answers null": mutated(lambda r: r["question"].update(golden_answers=None)),
    "token ids strings": mutated(lambda r: r["segments"][0].update(token_ids=["a", "b", "c", "d"])),
    "token ids null": mutated(lambda r: r["segments"][0].update(token_ids=None)),
    "segments an object": mutated(lambda r: r.update(segments={"a": 1})),
    "turn span of two": mutated(lambda r: r.update(turn_spans=[[0, 2]])),
    "turn span of strings": mutated(lambda r: r.update(turn_spans=[["0", 2, 4]])),
    "candidates a number": mutated(lambda r: r.update(candidates=5)),
    "rewards a list": mutated(lambda r: r.update(rewards=[1.0])),
    "team_em a string": mutated(lambda r: r.update(team_em="x")),
    "role a number": mutated(lambda r: r["segments"][0].update(role=3)),
    "mask of 2": mutated(lambda r: r["segments"][0].update(loss_mask=[0, 0, 2, 2])),
    "values a string": mutated(lambda r: r.update(values="x")),
    "values positions a string": mutated(lambda r: r.update(values={
        "kind": "train", "step": 1, "segments": [{"segment": 0, "positions": "ab", "old_logp": "ab"}]})),
    "values tokenizer a string": mutated(lambda r: r.update(values={"kind": "train", "step": 1, "tokenizer": "x"})),
}


@pytest.mark.parametrize("command", ["view", "replay"])
@pytest.mark.parametrize("kind", MALFORMED)
def test_a_malformed_episode_line_is_one_line_naming_file_and_line(kind, command, tmp_path, capsys):
    from agents.__main__ import main

    path = tmp_path / "episodes.jsonl"
    path.write_text(json.dumps(good_record()) + "\n" + MALFORMED[kind] + "\n", encoding="utf-8")
    code = main([command, str(path)])
    captured = capsys.readouterr()
    line = one_error_line(captured.err)
    assert code == 2 and captured.out == ""
    assert line.startswith(f"python -m agents {command}: {path}:2: "), line
    assert "\x1b" not in line and len(line) < 400


def test_a_good_record_passes_the_checks(tmp_path):
    from agents.viewer import read_records
    from agents.viewer.records import record_error

    assert record_error(good_record()) == ""
    path = tmp_path / "episodes.jsonl"
    path.write_text(json.dumps(good_record()) + "\n", encoding="utf-8")
    (ep, values), = read_records(path)
    assert ep == Episode.from_dict(good_record()) and values is None


@pytest.mark.parametrize("line, says", [
    ("[" * 100_000 + "]" * 100_000, "nested 100000 levels deep"),
    ('{"not": "an episode"}', "not an episode record"),
    ("{", "not an episode record"),
])
def test_sft_episode_files_name_a_bad_line_without_a_recursion_error(line, says, tmp_path):
    """``algos sft --episodes`` reads with ``load_episodes``: a deep, foreign or cut line is a
    ValueError naming file and line, never a RecursionError."""
    from envs.episode import load_episodes

    path = tmp_path / "episodes.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=f"{path}:1: .*{says}"):
        load_episodes(path)
