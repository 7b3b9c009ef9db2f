import pytest

from envs import protocol as P
from envs.chat import ChatFormat, TurnEnder


def test_leader_dispatch_select_and_invalid():
    t = P.parse_leader("<think><select>2</select></think><subtask>a</subtask> <subtask> b </subtask>", 0, 3)
    assert t.kind == "dispatch" and t.subtasks == ("a", "b")
    t = P.parse_leader("<subtask>a</subtask><subtask>b</subtask><subtask>c</subtask>", 0, 2)
    assert t.subtasks == ("a", "b") and t.notes
    assert P.parse_leader("<select>1, 3; 1</select>", 3, 3).selection == (1, 3)
    assert P.parse_leader("<select></select>", 0, 3).selection == ()
    assert P.parse_leader("<select>none</select>", 2, 3).kind == "select"
    assert "no report numbered 4" in P.parse_leader("<select>4</select>", 3, 3).reason
    assert P.parse_leader("<select>one</select>", 3, 3).kind == "invalid"
    assert P.parse_leader("<subtask>a</subtask><select>1</select>", 1, 3).kind == "invalid"
    assert P.parse_leader("<subtask> </subtask>", 0, 3).kind == "invalid"
    assert P.parse_leader("just text", 0, 3).reason == "no <subtask> or <select> tag"


def test_searcher_first_action_wins():
    assert P.parse_searcher("<search>q1</search><summary>s</summary>") == P.ParsedTurn("search", text="q1")
    assert P.parse_searcher("<summary>s</summary><search>q1</search>").kind == "summary"
    assert P.parse_searcher("<think><search>x</search></think><summary> r </summary>").text == "r"
    assert P.parse_searcher("<search> </search>").kind == "invalid"
    assert P.parse_searcher("<search>unclosed").kind == "invalid"


def test_answerer():
    assert P.parse_answerer("<think>hmm</think><answer> Kesh </answer>").text == "Kesh"
    assert P.parse_answerer("Kesh").kind == "invalid"


def test_tag_counts_and_rendering():
    counts = P.count_tags("<think>a</think><search>b</search><search>c")
    assert counts["think"] == 1 and counts["search"] == 1 and counts["answer"] == 0

    class Psg:
        title, text = "T", "body"

    assert P.render_passages([Psg(), Psg()]) == "<information>Doc 1(Title: T) body\nDoc 2(Title: T) body</information>"
    assert P.render_reports([(1, "t", ""), (2, "u", "r")]) == "[1] Sub-task: t\nReport: (no report)\n[2] Sub-task: u\nReport: r"
    assert P.role_of("answerer_12") == "answerer"


def test_turn_ender_stops_at_the_completing_token(tokenizer):
    ender = TurnEnder(tokenizer, [tokenizer.eos_token_id])
    ids = tokenizer.encode("<search>a b</search> trailing words", add_special_tokens=False)
    end = ender.first_end(ids, P.STOP_STRINGS["searcher"])
    assert tokenizer.decode(ids[: end + 1]).endswith("</search>")
    assert ender.first_end(ids[:end], P.STOP_STRINGS["searcher"]) is None
    eos = tokenizer.encode("hi", add_special_tokens=False) + [tokenizer.eos_token_id, 5]
    assert ender.first_end(eos, P.STOP_STRINGS["answerer"]) == len(eos) - 2
    # token by token gives the same end
    assert next(i for i in range(len(ids)) if ender.ends_at(ids, i, ["</search>"])) == end


def test_chat_format_chatml(tokenizer):
    chat = ChatFormat(tokenizer)
    assert chat.chatml and chat.end_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = chat.prompt("sys", "hello")
    assert tokenizer.decode(ids) == "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert chat.closing([5, chat.end_id]) == [] and chat.closing([5]) == [chat.end_id]
    assert tokenizer.decode(chat.observation("x")) == "\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


def test_first_end_agrees_with_the_token_by_token_rule(tokenizer):
    import random

    rng = random.Random(0)
    ender = TurnEnder(tokenizer, [tokenizer.eos_token_id])
    pieces = ["<search>", "</search>", "</summary>", "word", " x", "</", "search", ">", "\n", "é"]
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 15)))
        ids = tokenizer.encode(text, add_special_tokens=False)
        if rng.random() < 0.3:
            ids.insert(rng.randint(0, len(ids)), tokenizer.eos_token_id)
        linear = next((i for i in range(len(ids)) if ender.ends_at(ids, i, P.STOP_STRINGS["searcher"])), None)
        assert ender.first_end(ids, P.STOP_STRINGS["searcher"]) == linear, text


def test_chat_format_without_chatml_tokens_falls_back_to_plain():
    from transformers import AutoTokenizer

    from envs.retrieval import default_encoder_path

    bert = AutoTokenizer.from_pretrained(default_encoder_path())  # MiniLM's WordPiece: no ChatML
    chat = ChatFormat(bert)
    assert not chat.chatml and chat.end_id == bert.eos_token_id
    assert bert.decode(chat.prompt("sys", "hello")).startswith("system : sys")


def test_the_protocol_writes_the_actions_it_parses():
    assert P.write("search", "X director") == "<search>X director</search>"
    assert P.write_subtasks(["a", "b"]) == "<subtask>a</subtask><subtask>b</subtask>"
    assert P.write_select([1, 3]) == "<select>1, 3</select>"
    assert P.parse_leader(P.write_select([1, 3]), num_reports=3, max_searchers=2).selection == (1, 3)
    assert P.render_rewards({"leader": 0.5, "searcher_0": 1.0}) == "Rewards: leader=0.500, searcher_0=1.000"
    with pytest.raises(ValueError, match="'sumary' is not one of"):
        P.write("sumary", "x")
