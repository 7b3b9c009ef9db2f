"""The env's prompt sets: ``paper`` stays the default word for word, ``short`` changes only
what each role is told (system prompt) and reminded of (after an invalid turn),
``oneshot`` adds one worked exchange the agent never wrote, the tags and the parser are the
same, and an unknown name is refused in one line."""

from __future__ import annotations

import json

import pytest
from conftest import Doc, KeywordRetriever

from agents.collect import collect
from agents.scripted import ScriptedPolicy
from envs import protocol as P
from envs import search_team_v0
from envs.episode import Episode
from envs.team import TeamConfig, system_prompts

DOCS = [Doc("1", "Ada Quill", "Ada Quill was born in Tarnby in 1870."),
        Doc("2", "Tarnby", "Tarnby is a town on the coast."),
        Doc("3", "Ben Quill", "Ben Quill was born in Oslen.")]


class ProseFirst:
    """Each agent's first turn is prose with no tag (what SmolLM2 writes), then the
    scripted turn: every role gets one corrective message."""

    def __init__(self):
        self.scripted, self.seen = ScriptedPolicy(seed=0), set()

    def act(self, observations):
        out = []
        for obs, text in zip(observations, self.scripted.act(observations)):
            key = (obs.env_index, obs.agent, obs.info.get("wave"))
            out.append(text if key in self.seen else "The answer is probably Tarnby.")
            self.seen.add(key)
        return out


def _play(tokenizer, workflow, **kwargs):
    from envs.data.items import QAItem

    question = QAItem(id="q1", question="Where was Ada Quill born?", golden_answers=("Tarnby",), dataset="nq")
    [[ep]] = collect(lambda: search_team_v0.raw_env(workflow=workflow, tokenizer=tokenizer,
                                                    retriever=KeywordRetriever(DOCS), questions=[question],
                                                    **kwargs),
                     ProseFirst(), [question], seed=0)
    return ep


def test_paper_is_the_default_and_the_same_words():
    assert P.DEFAULT_PROMPTS == "paper" and TeamConfig().prompts == "paper"
    paper = P.prompt_set("paper")
    assert paper.system is P.SYSTEM_PROMPTS and paper.reminders is P.FORMAT_REMINDERS
    assert P.render_corrective(P.ANSWERER, "no <answer> tag") == (
        "Invalid turn: no <answer> tag. Write the answer as <answer>short answer</answer>.")
    assert system_prompts(TeamConfig())[P.SEARCHER].startswith("You are a Searcher.")


@pytest.mark.parametrize("workflow", ["hierarchical", "cascade"])
def test_explicit_paper_plays_the_default_tokens(tokenizer, workflow):
    default, paper = _play(tokenizer, workflow), _play(tokenizer, workflow, prompts="paper")
    assert [s.token_ids for s in default.segments] == [s.token_ids for s in paper.segments]
    assert default.prompts == paper.prompts == "paper" and default.invalid_turns > 0


@pytest.mark.parametrize("workflow", ["hierarchical", "cascade"])
def test_short_changes_only_the_system_prompts_and_reminders(tokenizer, workflow):
    paper, short = _play(tokenizer, workflow), _play(tokenizer, workflow, prompts="short")
    assert short.prompts == "short"
    cfg = TeamConfig(workflow=workflow)
    long_sys, short_sys = system_prompts(cfg), system_prompts(TeamConfig(workflow=workflow, prompts="short"))
    # the same turns, the same outcome: only the words around them differ
    assert paper.invalid_turns == short.invalid_turns >= len({s.agent for s in paper.segments})
    assert (paper.candidates, paper.team_em, paper.num_searches) == (short.candidates, short.team_em,
                                                                     short.num_searches)
    assert len(paper.segments) == len(short.segments)
    for a, b in zip(paper.segments, short.segments):
        assert (a.agent, a.wave, a.turns, a.invalid_turns) == (b.agent, b.wave, b.turns, b.invalid_turns)
        generated_a = [t for t, m in zip(a.token_ids, a.loss_mask) if m]
        generated_b = [t for t, m in zip(b.token_ids, b.loss_mask) if m]
        assert generated_a == generated_b
        text_a, text_b = tokenizer.decode(a.token_ids), tokenizer.decode(b.token_ids)
        assert long_sys[a.role] in text_a and short_sys[a.role] in text_b
        assert P.FORMAT_REMINDERS[a.role] in text_a and P.SHORT_FORMAT_REMINDERS[a.role] in text_b
        swapped = text_a.replace(long_sys[a.role], short_sys[a.role]).replace(
            P.FORMAT_REMINDERS[a.role], P.SHORT_FORMAT_REMINDERS[a.role])
        assert swapped == text_b
    assert len(tokenizer.encode(short_sys[P.LEADER])) * 3 < len(tokenizer.encode(long_sys[P.LEADER]))


def test_short_prompts_are_one_line_with_an_example_the_parser_accepts():
    parse = {P.LEADER: lambda t: P.parse_leader(t, num_reports=1, max_searchers=3),
             P.SEARCHER: P.parse_searcher, P.ANSWERER: P.parse_answerer}
    expected = {P.LEADER: "dispatch", P.SEARCHER: "search", P.ANSWERER: "answer"}
    short = P.prompt_set("short")
    assert set(short.system) == set(short.reminders) == set(P.ROLES)
    for role, text in short.system.items():
        assert "\n" not in text and "Example: " in text
        example = text.split("Example: ", 1)[1]
        assert parse[role](example).kind == expected[role]
    assert P.parse_answerer("<answer>Paris</answer>").text == "Paris"
    assert P.TAGS == ("think", "subtask", "select", "search", "summary", "answer")


@pytest.mark.parametrize("workflow", ["hierarchical", "cascade"])
def test_oneshot_adds_one_worked_exchange_the_agent_did_not_write(tokenizer, workflow):
    short, oneshot = _play(tokenizer, workflow, prompts="short"), _play(tokenizer, workflow, prompts="oneshot")
    assert oneshot.prompts == "oneshot" and not P.prompt_set("short").demos and not P.prompt_set("paper").demos
    assert (short.candidates, short.invalid_turns, short.num_searches) == (
        oneshot.candidates, oneshot.invalid_turns, oneshot.num_searches)
    for a, b in zip(short.segments, oneshot.segments, strict=True):
        [(demo_user, demo_reply)] = P.ONESHOT_DEMOS[b.role]
        reply_ids = tokenizer.encode(demo_reply, add_special_tokens=False)
        # the exchange sits between the system prompt and the real first user message, as env text
        first_turn = next(start for i, start, _ in oneshot.turn_spans if oneshot.segments[i] is b)
        prompt_text = tokenizer.decode(b.token_ids[:first_turn])
        assert prompt_text.index(demo_user) < prompt_text.rindex(demo_reply) < prompt_text.rindex("<|im_start|>user\n")
        assert prompt_text.count("<|im_start|>user\n") == 2
        assert any(b.token_ids[i:i + len(reply_ids)] == reply_ids for i in range(first_turn))
        assert not any(b.loss_mask[:first_turn])
        # the rest is the short set's context token for token: system prompt before, all else after
        system = system_prompts(TeamConfig(workflow=workflow, prompts="short"))[b.role]
        head = len(tokenizer.encode(f"<|im_start|>system\n{system}<|im_end|>\n", add_special_tokens=False))
        tail = len(a.token_ids) - head
        assert b.token_ids[:head] == a.token_ids[:head] and b.token_ids[-tail:] == a.token_ids[head:]
        assert len(b.token_ids) - len(a.token_ids) > len(reply_ids)
        assert [t for t, m in zip(a.token_ids, a.loss_mask) if m] == [t for t, m in zip(b.token_ids, b.loss_mask) if m]
    parse = {P.LEADER: lambda t: P.parse_leader(t, num_reports=1, max_searchers=3),
             P.SEARCHER: P.parse_searcher, P.ANSWERER: P.parse_answerer}
    assert {r: parse[r](demos[0][1]).kind for r, demos in P.ONESHOT_DEMOS.items()} == {
        P.LEADER: "dispatch", P.SEARCHER: "search", P.ANSWERER: "answer"}


def test_oneshot_messages_show_the_exchange(tokenizer):
    env = search_team_v0.raw_env(workflow="cascade", tokenizer=tokenizer, retriever=KeywordRetriever(DOCS),
                                 questions=["Where was Ada Quill born?"], prompts="oneshot")
    env.reset(seed=0)
    [obs] = env.turn_observations()
    assert [m["role"] for m in obs.messages] == ["system", "user", "assistant", "user"]
    assert obs.messages[2]["content"] == "<search>capital of France</search>"
    assert obs.messages[3]["content"] == "Task: Where was Ada Quill born?"


def test_an_unknown_set_is_refused_in_one_line(tokenizer):
    for make in (lambda: TeamConfig(prompts="tiny"),
                 lambda: search_team_v0.raw_env(tokenizer=tokenizer, retriever=KeywordRetriever(DOCS),
                                                questions=["q"], prompts="tiny")):
        with pytest.raises(ValueError, match=r"^unknown prompt set 'tiny'; the sets are paper, short, oneshot$"):
            make()


def test_an_episode_records_its_set_and_old_records_read_as_paper():
    ep = Episode(question={"question": "q"}, workflow="cascade", prompts="short")
    assert Episode.from_dict(json.loads(json.dumps(ep.to_dict()))).prompts == "short"
    old = {k: v for k, v in Episode(question={"question": "q"}, workflow="cascade").to_dict().items() if k != "prompts"}
    assert Episode.from_dict(old).prompts == "paper"


def _corpus_and_data(tmp_path):
    data = tmp_path / "data" / "hotpotqa"
    data.mkdir(parents=True)
    (data / "dev.jsonl").write_text(json.dumps(
        {"id": "h1", "question": "Where was Ada Quill born?", "golden_answers": ["Tarnby"]}) + "\n")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": d.id, "contents": f"{d.title}\n{d.text}"}) + "\n" for d in DOCS))
    return tmp_path / "data", corpus


def test_benchmarks_run_records_the_set(tmp_path):
    from benchmarks.__main__ import main as bench_main
    from envs.episode import load_episodes

    data, corpus = _corpus_and_data(tmp_path)
    common = ["run", "--policy", "scripted", "--data", str(data), "--datasets", "hotpotqa", "--split", "dev",
              "--runs", "1", "--corpus", str(corpus), "--no-progress"]
    assert bench_main([*common, "--prompts", "short", "--out", str(tmp_path / "short")]) == 0
    assert bench_main([*common, "--out", str(tmp_path / "paper")]) == 0
    short = json.loads((tmp_path / "short" / "summary.json").read_text())["meta"]
    paper = json.loads((tmp_path / "paper" / "summary.json").read_text())["meta"]
    assert (short["prompts"], short["env_kwargs"]) == ("short", {"prompts": "short"})
    assert (paper["prompts"], paper["env_kwargs"]) == ("paper", {})
    assert [ep.prompts for ep in load_episodes(tmp_path / "short" / "episodes.jsonl")] == ["short"]
    assert "| H-MAS scripted [short prompts] |" in (tmp_path / "short" / "table.md").read_text()
    assert "| H-MAS scripted |" in (tmp_path / "paper" / "table.md").read_text()


def test_clis_refuse_an_unknown_set_before_anything_loads(tmp_path, capsys):
    from agents.__main__ import main as agents_main
    from benchmarks.__main__ import main as bench_main

    assert bench_main(["run", "--policy", "scripted", "--prompts", "tiny", "--out", str(tmp_path / "r")]) == 2
    assert agents_main(["play", "--prompts", "tiny"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["python -m benchmarks: error: --prompts: unknown prompt set 'tiny'; the sets are paper, short, oneshot",
                   "python -m agents: error: --prompts: unknown prompt set 'tiny'; the sets are paper, short, oneshot"]
    assert not (tmp_path / "r").exists()
