"""Sampling settings of spec-built policies (issue 32): the spec's query string and the
command lines' flags, the model's generation config as the default, the record in
summary.json and episodes.jsonl, compare refusing runs sampled differently, and the
validation's progress bar."""

import json

import pytest
from conftest import WORLD, KeywordRetriever

from agents.registry import check_policy, make_policy
from agents.sampling import Sampling, describe_team, same_settings


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, tokenizer):
    """Two tiny saved models: one whose generation config samples (do_sample, temperature
    0.5, top-p 0.8), one whose generation config does not."""
    from transformers import GenerationConfig

    from agents.models import tiny_causal_lm

    out = {}
    for name, config in (("sampling", dict(do_sample=True, temperature=0.5, top_p=0.8)), ("plain", None)):
        model = tiny_causal_lm(len(tokenizer), hidden_size=16, num_layers=1, num_heads=2, seed=0,
                               eos_token_id=tokenizer.eos_token_id, initializer_range=0.2)
        if config is not None:
            model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, **config)
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        out[name] = str(path)
    return out


def test_spec_query_sets_sampling_per_role():
    from agents.registry import _split

    [(role, kind, arg, sampling)] = _split("hf:smollm2?temperature=0.7&top_p=0.9&max_new_tokens=64")
    assert (role, kind, arg) == (None, "hf", "smollm2")
    assert sampling == Sampling(temperature=0.7, top_p=0.9, max_new_tokens=64)
    parts = _split("leader=hf:smollm2?temperature=0,searcher=hf:smollm2?top_p=0.5,answerer=scripted")
    assert [(r, k, s) for r, k, _, s in parts] == [
        ("leader", "hf", Sampling(temperature=0.0)), ("searcher", "hf", Sampling(top_p=0.5)),
        ("answerer", "scripted", Sampling())]
    assert Sampling(top_p=0.5).over(Sampling(temperature=0.3, top_p=0.9)) == Sampling(temperature=0.3, top_p=0.5)


@pytest.mark.parametrize("spec, message", [
    ("hf:smollm2?temp=1", r"hf:smollm2\?temp=1: unknown sampling setting 'temp'"),
    ("hf:smollm2?temperature=-1", r"hf:smollm2\?temperature=-1: temperature must be a number >= 0"),
    ("hf:smollm2?temperature=nan", "temperature must be a number >= 0"),
    ("hf:smollm2?temperature=warm", r"temperature must be a number >= 0 \(0 is greedy\), got 'warm'"),
    ("hf:smollm2?top_p=0", r"top_p must be a number in \(0, 1\], got '0'"),
    ("hf:smollm2?top_p=1.5", r"top_p must be a number in \(0, 1\]"),
    ("hf:smollm2?max_new_tokens=0", "max_new_tokens must be an integer >= 1"),
    ("hf:smollm2?max_new_tokens=2.5", "max_new_tokens must be an integer >= 1, got '2.5'"),
    ("hf:smollm2?temperature=1&temperature=0", "temperature is given twice"),
    ("hf:smollm2?temperature", "temperature needs a value"),
    ("hf:smollm2?", "unknown sampling setting ''"),
    ("scripted?temperature=0", r"scripted\?temperature=0: a scripted policy takes no sampling settings"),
    ("leader=hf:smollm2?top_p=2,searcher=scripted", r"hf:smollm2\?top_p=2: top_p must be"),
])
def test_bad_sampling_specs_are_refused_in_one_line(spec, message):
    with pytest.raises(ValueError, match=message) as err:
        check_policy(spec)
    assert "\n" not in str(err.value)


def test_bad_settings_stop_the_commands_before_anything_loads(capsys, tmp_path):
    from agents.__main__ import main as agents_main
    from benchmarks.__main__ import main as bench_main

    assert agents_main(["play", "--policy", "hf:smollm2?temp=1"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("python -m agents: error: --policy hf:smollm2?temp=1: unknown sampling setting 'temp' "
                           "(use temperature, top_p, max_new_tokens, e.g. hf:smollm2?temperature=0.7&top_p=0.9)")
    assert bench_main(["run", "--policy", "hf:smollm2?top_p=0", "--out", str(tmp_path / "r")]) == 2
    assert "--policy hf:smollm2?top_p=0: top_p must be a number in (0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    with pytest.raises(SystemExit) as stop:
        bench_main(["run", "--policy", "scripted", "--temperature", "-0.5", "--out", str(tmp_path / "r")])
    assert stop.value.code == 2
    assert "argument --temperature: temperature must be a number >= 0 (0 is greedy), got '-0.5'" \
        in capsys.readouterr().err


def test_default_is_the_models_generation_config_else_greedy(model_dirs, torch_one_thread):
    import benchmarks.suite  # noqa: F401  (registers ckpt:)

    sampled = make_policy(f"hf:{model_dirs['sampling']}")
    assert (sampled.temperature, sampled.top_p, sampled.max_new_tokens) == (0.5, pytest.approx(0.8), 256)
    assert sampled.sampling_source == "generation_config"
    plain = make_policy(f"hf:{model_dirs['plain']}")
    assert (plain.temperature, plain.top_p) == (0.0, 1.0)
    assert plain.sampling_source.startswith("greedy")
    # the spec's settings win over the command line's, which win over the model's
    flags = Sampling(temperature=0.3, max_new_tokens=12)
    mixed = make_policy(f"hf:{model_dirs['sampling']}?temperature=0.9", sampling=flags)
    assert (mixed.temperature, mixed.top_p, mixed.max_new_tokens) == (0.9, pytest.approx(0.8), 12)
    assert make_policy(f"hf:{model_dirs['sampling']}", sampling=flags).temperature == 0.3
    ckpt = make_policy(f"ckpt:{model_dirs['sampling']}?top_p=0.6")  # a learner's checkpoint alike
    assert (ckpt.temperature, ckpt.top_p) == (0.5, 0.6)


def test_settings_recorded_in_summary_and_every_episode(model_dirs, tmp_path, torch_one_thread):
    from benchmarks.__main__ import main as bench_main

    data = tmp_path / "data" / "hotpotqa"
    data.mkdir(parents=True)
    (data / "dev.jsonl").write_text("".join(json.dumps(
        {"id": f"h{i}", "question": "Where was Ada Quill born?", "golden_answers": ["Tarnby"]}) + "\n"
        for i in range(2)))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f"Doc {i}\nAda Quill was born in Tarnby."}) + "\n"
                              for i in range(3)))
    policy = f"leader=hf:{model_dirs['sampling']}?top_p=0.9,searcher=scripted,answerer=scripted"
    code = bench_main(["run", "--policy", policy, "--data", str(tmp_path / "data"), "--datasets", "hotpotqa",
                       "--split", "dev", "--runs", "1", "--corpus", str(corpus), "--out", str(tmp_path / "r"),
                       "--temperature", "0.25", "--max-new-tokens", "6", "--env", "max_turn_tokens=8",
                       "--no-progress"])
    assert code == 0
    sampling = json.loads((tmp_path / "r" / "summary.json").read_text())["meta"]["sampling"]
    assert sampling["leader"] == {"temperature": 0.25, "top_p": 0.9, "max_new_tokens": 6, "from": "set"}
    assert sampling["searcher"] is None and sampling["answerer"] is None
    episodes = [json.loads(line) for line in (tmp_path / "r" / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 and all(ep["sampling"] == sampling for ep in episodes)


def _result(path, sampling, prompts=None):
    """A result folder as `benchmarks run` writes it, with ``sampling`` as its record (and
    ``prompts`` as its prompt set, when given)."""
    from benchmarks.metrics import summarize

    records = [{"dataset": "nq", "id": f"q{i}", "correct": [float(i % 2)], "searches": [1],
                "input_tokens": [100], "output_tokens": [10]} for i in range(4)]
    summary = summarize(records)
    summary["meta"] = {"policy": "hf:smollm2", "workflow": "hierarchical"}
    if sampling is not None:
        summary["meta"]["sampling"] = sampling
    if prompts is not None:
        summary["meta"]["prompts"] = prompts
    path.mkdir()
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_compare_refuses_runs_sampled_differently_unless_allowed(tmp_path, capsys):
    from benchmarks.__main__ import main as bench_main

    def team(temperature, top_p=1.0):
        one = {"temperature": temperature, "top_p": top_p, "max_new_tokens": 256}
        return {"leader": one, "searcher": one, "answerer": one}

    warm = _result(tmp_path / "warm", team(0.7))
    greedy = _result(tmp_path / "greedy", team(0.0))
    greedy_p = _result(tmp_path / "greedy_p", team(0.0, top_p=0.5))  # top-p means nothing when greedy
    old = _result(tmp_path / "old", None)  # written before runs recorded their settings
    assert bench_main(["compare", warm, greedy, "--resamples", "10"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == (
        f"python -m benchmarks compare: error: {warm} (temperature 0.7, top_p 1, max_new_tokens 256) and {greedy} "
        "(temperature 0 (greedy), max_new_tokens 256) sampled differently; pass --allow-different-settings "
        "to pair them anyway")
    assert bench_main(["compare", warm, greedy, "--resamples", "10", "--allow-different-settings"]) == 0
    assert "paired bootstrap" in capsys.readouterr().out
    assert bench_main(["compare", greedy_p, greedy, "--resamples", "10"]) == 0
    assert bench_main(["compare", old, warm, "--resamples", "10"]) == 0
    per_role = {**team(0.0), "searcher": {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 256}}
    assert not same_settings(per_role, team(0.0))
    assert describe_team(per_role) == ("leader temperature 0 (greedy), max_new_tokens 256; searcher temperature 0.7, "
                                       "top_p 0.9, max_new_tokens 256; answerer temperature 0 (greedy), "
                                       "max_new_tokens 256")


def test_validation_shows_a_bar_on_stderr(tmp_path, tiny_dirs, capsys, torch_one_thread):
    from algos.config import TrainConfig
    from algos.trainer import Trainer

    cfg = TrainConfig(model=tiny_dirs["policy"], out_dir=str(tmp_path / "run"), stage="teacher", max_turn_tokens=8,
                      max_context_tokens=512, max_waves=1, max_searchers=1, max_searcher_turns=2, num_candidates=2,
                      val_per_dataset=2, val_datasets=("nq",), val_runs=1, generation_batch_size=8)
    capsys.readouterr()
    Trainer(cfg, progress=True, retriever=KeywordRetriever(WORLD)).validate()
    err = capsys.readouterr().err
    assert "validate step 0" in err and "2/2" in err
    quiet = TrainConfig(**{**cfg.to_dict(), "out_dir": str(tmp_path / "quiet")})
    Trainer(quiet, progress=False, retriever=KeywordRetriever(WORLD)).validate()
    assert "validate step" not in capsys.readouterr().err


def test_compare_refuses_runs_prompted_with_different_prompt_sets_unless_allowed(tmp_path, capsys):
    from benchmarks.__main__ import main as bench_main

    one = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 256}
    team = {"leader": one, "searcher": one, "answerer": one}
    short = _result(tmp_path / "short", team, prompts="short")
    paper = _result(tmp_path / "paper", team)  # no record: the default set, paper
    also_paper = _result(tmp_path / "also_paper", team, prompts="paper")
    assert bench_main(["compare", short, paper, "--resamples", "10"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"python -m benchmarks compare: error: {short} (short prompts) and {paper} (paper prompts) were "
        "prompted differently; pass --allow-different-settings to pair them anyway")
    assert bench_main(["compare", short, paper, "--resamples", "10", "--allow-different-settings"]) == 0
    assert bench_main(["compare", also_paper, paper, "--resamples", "10"]) == 0


# ---------------------------------------------------------------------------- edge values, by hand (issue 44.7)


@pytest.mark.parametrize("query, expected", [
    ("top_p=1", Sampling(top_p=1.0)),                  # the whole nucleus: accepted
    ("top_p=1.0", Sampling(top_p=1.0)),
    ("top_p=1e-9", Sampling(top_p=1e-9)),              # any positive mass
    ("temperature=0", Sampling(temperature=0.0)),      # greedy
    ("temperature=-0.0", Sampling(temperature=0.0)),
    ("temperature=2.94e-36", Sampling(temperature=2.94e-36)),  # just over the float32 floor
    ("temperature=1e308", Sampling(temperature=1e308)),
    ("max_new_tokens=1", Sampling(max_new_tokens=1)),
    ("temperature=1&top_p=1&max_new_tokens=256", Sampling(1.0, 1.0, 256)),
])
def test_edge_values_that_are_accepted(query, expected):
    from agents.sampling import parse_sampling

    assert parse_sampling(query, f"hf:x?{query}") == expected
    check_policy(f"hf:smollm2?{query}")


@pytest.mark.parametrize("query, message", [
    ("top_p=0", r"top_p must be a number in \(0, 1\]"),
    ("top_p=1.0000001", r"top_p must be a number in \(0, 1\]"),
    ("top_p=-0.5", r"top_p must be a number in \(0, 1\]"),
    ("top_p=inf", r"top_p must be a number in \(0, 1\]"),
    ("temperature=2.93e-36", "at least 2.94e-36"),
    ("temperature=inf", "temperature must be a number >= 0"),
    ("temperature=-1e-300", "temperature must be a number >= 0"),
    ("max_new_tokens=0", "max_new_tokens must be an integer >= 1"),
    ("max_new_tokens=1.0", "max_new_tokens must be an integer >= 1"),
])
def test_edge_values_that_are_refused(query, message):
    with pytest.raises(ValueError, match=message):
        check_policy(f"hf:smollm2?{query}")


def test_describe_and_compare_at_the_edges():
    from agents.sampling import describe_team, same_settings

    greedy = {"temperature": 0.0, "top_p": 0.3, "max_new_tokens": 8}
    assert describe_team({"leader": greedy}) == "temperature 0 (greedy), max_new_tokens 8"
    # greedy ignores top-p; a sampled run at top_p 1 differs from one at 0.999
    assert same_settings({"leader": greedy}, {"leader": {**greedy, "top_p": 1.0}})
    one = {"temperature": 0.7, "top_p": 1.0, "max_new_tokens": 8}
    assert not same_settings({"leader": one}, {"leader": {**one, "top_p": 0.999}})
    assert describe_team({"leader": one, "searcher": None}) == "temperature 0.7, top_p 1, max_new_tokens 8"


@pytest.mark.parametrize("name", ["temperature", "val_temperature"])
def test_the_learner_refuses_a_temperature_that_overflows_the_logits(name):
    """TrainConfig checks its sampling temperatures with the samplers' own floor (0 stays
    greedy), in one line naming the field, before anything loads."""
    from algos.config import TrainConfig

    assert TrainConfig(stage="teacher", **{name: 0.0}).to_dict()[name] == 0.0
    with pytest.raises(ValueError, match=rf"TrainConfig\.{name}=1e-40: must be 0 \(greedy\) or at least 2.94e-36"):
        TrainConfig(stage="teacher", **{name: 1e-40})
