"""The evaluation suite end to end: synthetic and FlashRAG-layout data, files and numbers."""

import json

import pytest

from benchmarks.__main__ import main as bench_main
from benchmarks.suite import run_suite


def test_run_on_synthetic_writes_consistent_results(tmp_path, world_retriever):
    # world_retriever: the suite's default retriever is the session's one encoding of the world
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
                       "--no-progress", "--no-episodes"])
    assert code == 0
    assert not (tmp_path / "r" / "episodes.jsonl").exists()
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["meta"]["skipped"] == ["nq"] and summary["meta"]["retriever"] == str(corpus)
    assert summary["datasets"]["hotpotqa"]["avg@k"] == 1.0
    assert "HotpotQA" in capsys.readouterr().out


def test_one_policy_registry_serves_agents_and_benchmarks(tiny_dirs, tmp_path):
    from agents.hf import HFPolicy
    from agents.registry import POLICY_KINDS, make_policy, register_policy
    from agents.router import RoleRouter
    from agents.scripted import ScriptedPolicy
    from benchmarks.suite import build_policy

    assert "ckpt" in POLICY_KINDS  # the benchmarks' kind lives in the registry, not beside it
    team = make_policy(f"leader=ckpt:{tiny_dirs['policy']},searcher=scripted,answerer=scripted")
    assert isinstance(team, RoleRouter)
    assert isinstance(team.policies["leader"], HFPolicy) and isinstance(team.policies["searcher"], ScriptedPolicy)
    assert isinstance(build_policy("scripted"), ScriptedPolicy)
    with pytest.raises(FileNotFoundError, match="no SB3 Leader"):  # sb3: per role, as ckpt:
        make_policy(f"leader=sb3:{tmp_path / 'none'},searcher=scripted")
    with pytest.raises(ValueError, match="unknown policy 'gpt:x'.*scripted.*ckpt"):
        make_policy("gpt:x")
    register_policy("echo_test", lambda arg, **kw: ("echo", arg, kw["seed"]))
    try:
        assert make_policy("answerer=echo_test:hi", seed=3).policies["answerer"] == ("echo", "hi", 3)
    finally:
        POLICY_KINDS.pop("echo_test")
    with pytest.raises(ValueError, match="role name"):
        register_policy("leader", lambda arg, **kw: None)


def test_trainer_env_and_suite_retrievers_come_from_the_one_factory(tmp_path, monkeypatch):
    import envs.retrieval.factory as factory
    from benchmarks.suite import build_retriever
    from envs.retrieval import RemoteRetriever, make_retriever

    monkeypatch.setattr(factory, "default_retriever", lambda index="auto", progress=True: "the default")
    import algos.trainer

    assert algos.trainer.make_retriever is make_retriever is factory.make_retriever  # no wrapper between
    assert make_retriever("default") == "the default"
    assert build_retriever("synthetic", None, None) == ("the default", "synthetic world corpus (MiniLM, flat)")
    remote, desc = build_retriever("synthetic", None, "http://127.0.0.1:1")
    assert isinstance(remote, RemoteRetriever) and remote.url == "http://127.0.0.1:1/retrieve"
    assert desc == "http://127.0.0.1:1" and make_retriever("https://h:2/r").url == "https://h:2/r"
    assert make_retriever("http://h:3", timeout=1.5).timeout == 1.5
    with pytest.raises(SystemExit, match="--corpus FILE or --retriever-url"):
        build_retriever(str(tmp_path), None, None)
    with pytest.raises(FileNotFoundError):
        make_retriever(tmp_path / "no-corpus.jsonl")
    with pytest.raises(ValueError, match="'default', 'words', a corpus JSONL path or an http"):
        make_retriever(" ")


def test_compare_refuses_a_bad_result_line_naming_file_and_line(tmp_path):
    good = {"dataset": "nq", "id": "1", "correct": [1], "searches": [1], "input_tokens": [5], "output_tokens": [2]}
    path = tmp_path / "validation" / "step_000001.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "2", "correct": []}) + "\n")
    with pytest.raises(SystemExit) as error:
        bench_main(["compare", str(path), str(path)])
    assert str(error.value) == f"{path}, line 2: correct=[] must be a non-empty list of finite numbers, one per run"
    results = tmp_path / "res"
    results.mkdir()
    (results / "summary.json").write_text("{}")
    (results / "questions.jsonl").write_bytes(json.dumps(good).encode() + b"\n\xff\n")
    with pytest.raises(SystemExit, match=r"questions.jsonl, line 2: not UTF-8"):
        bench_main(["compare", str(results), str(path)])


@pytest.fixture
def words_suite(monkeypatch):
    """The suite on the word-overlap retriever: nothing to encode, for runs that only need
    episodes to be played."""
    import benchmarks.suite as suite
    from envs.retrieval import make_retriever

    monkeypatch.setattr(suite, "build_retriever", lambda *args: (make_retriever("words"), "words"))
    return suite


def test_a_runs_episodes_open_in_the_viewer(tmp_path, words_suite, capsys):
    """``run`` keeps every episode in ``episodes.jsonl`` (dataset, question and run order;
    each question record lists its lines), and ``python -m agents view`` opens them with
    the tokenizer the run recorded: one token element per recorded token."""
    import re

    from agents.__main__ import main as agents_main
    from agents.viewer import write_page
    from envs.episode import load_episodes
    from envs.tokenizer import load_tokenizer

    out = tmp_path / "res"
    out.mkdir()
    (out / "episodes.jsonl.partial").write_text("left by a killed run\n")  # never mixed in
    words_suite.run_suite("scripted", out_dir=out, datasets=("nq", "popqa"), limit=2, runs=2, progress=False,
                          log=lambda *_: None)
    episodes = load_episodes(out / "episodes.jsonl")
    records = [json.loads(x) for x in (out / "questions.jsonl").read_text().splitlines()]
    assert len(episodes) == 8 and not (out / "episodes.jsonl.partial").exists()
    assert [r["episode_index"] for r in records] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    for r in records:
        played = [episodes[i] for i in r["episode_index"]]
        assert {ep.question["question"] for ep in played} == {r["question"]}
        assert [ep.final_em for ep in played] == r["correct"] and r["dataset"] in ("nq", "popqa")
    meta = json.loads((out / "summary.json").read_text())["meta"]
    smollm2 = load_tokenizer()
    assert meta["tokenizer"]["vocab_size"] == len(smollm2) == 49152
    index = 5
    page = write_page(out / "episodes.jsonl", index, out=tmp_path / "page.html")
    tokens = re.findall(r'<span class="k [^"]*" data-id="(\d+)"', page.read_text(encoding="utf-8"))
    ep = episodes[index]
    assert len(tokens) == sum(len(s.token_ids) for s in ep.segments) > 100
    assert [int(t) for t in tokens] == [t for s in ep.segments for t in s.token_ids]
    assert ep.question["question"] in page.read_text(encoding="utf-8")
    # the command a user types, with the index a question record names
    assert agents_main(["view", str(out / "episodes.jsonl"), "--index", str(records[2]["episode_index"][1])]) == 0
    assert capsys.readouterr().out.strip() == str(out / "episodes.5.html")


def test_a_failed_run_leaves_no_partial_episodes(tmp_path, words_suite, monkeypatch):
    played = []

    def collect_then_fail(*args, **kwargs):
        if played:
            raise RuntimeError("the policy crashed")
        played.append(1)
        return collect(*args, **kwargs)

    from agents.collect import collect

    monkeypatch.setattr(words_suite, "collect", collect_then_fail)
    out = tmp_path / "res"
    with pytest.raises(RuntimeError, match="the policy crashed"):
        words_suite.run_suite("scripted", out_dir=out, datasets=("nq", "popqa"), limit=1, runs=1, progress=False,
                              log=lambda *_: None)
    assert not out.exists()  # the first dataset's episodes went to a partial file, removed with its folder
    monkeypatch.setattr(words_suite, "collect", collect)
    words_suite.run_suite("scripted", out_dir=out, datasets=("nq",), limit=1, runs=1, progress=False,
                          log=lambda *_: None, keep_episodes=False)
    assert sorted(p.name for p in out.iterdir() if p.suffix != ".png") == ["questions.jsonl", "summary.json",
                                                                          "table.md"]
    assert "episode_index" not in json.loads((out / "questions.jsonl").read_text())


def test_a_new_policy_kind_is_one_row_that_every_list_reads(capsys):
    """Adding a kind touches POLICY_KINDS alone: the spec parser, the checks, the builder and
    both command lines' help read it (no hand list of kinds goes stale)."""
    from agents.__main__ import main as agents_main
    from agents.registry import POLICY_KINDS, check_policy, make_policy, register_policy
    from benchmarks.__main__ import main as benchmarks_main

    def refuse_empty(arg):
        if not arg:
            raise ValueError("echo_fake: needs a text")

    register_policy("echo_fake", lambda arg, **kw: ("echo", arg), check=refuse_empty, usage="echo_fake:<text>")
    try:
        assert make_policy("searcher=echo_fake:hi,leader=scripted").policies["searcher"] == ("echo", "hi")
        with pytest.raises(ValueError, match="needs a text"):
            check_policy("echo_fake")
        with pytest.raises(ValueError, match="takes no sampling settings"):
            check_policy("echo_fake:x?temperature=1")
        with pytest.raises(ValueError, match="unknown policy 'nope'.*echo_fake"):
            make_policy("nope")
        for main, argv in ((agents_main, ["play", "--help"]), (agents_main, ["demo", "--help"]),
                           (benchmarks_main, ["run", "--help"])):
            with pytest.raises(SystemExit):
                main(argv)
            assert "echo_fake:<text>" in " ".join(capsys.readouterr().out.split()), argv
    finally:
        POLICY_KINDS.pop("echo_fake")
