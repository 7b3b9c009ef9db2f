"""Escape sequences in a passage are shown, never obeyed (issue 27, item 10): ``agents
play``, ``agents replay``, ``envs step``, render("human") and ``envs data show`` write no
ESC or BEL byte to the terminal, and the viewer's page keeps a passage's ``<script>`` and
ANSI as text."""

from __future__ import annotations

import io
import json
import sys
from html.parser import HTMLParser

import pytest
from conftest import QUESTION, Doc, KeywordRetriever

EVIL = "\x1b]52;c;ZXZpbA==\x07\x1b[2J"
"""An OSC 52 clipboard write, then 'clear the screen'."""

DOCS = [Doc(str(i), f"Velmora Quist {i}", f"Velmora Quist was born in Port Velm.{EVIL} Ostria "
            "<script>alert(1)</script>\x9b31m\u202e") for i in range(1, 4)]


def assert_shown_not_obeyed(text: str) -> None:
    assert "ZXZpbA==" in text  # the passage reached the screen...
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text and "\u202e" not in text
    assert "\\x1b]52;c;ZXZpbA==\\x07\\x1b[2J" in text  # ...its escapes written out


def test_terminal_safe_writes_controls_out_and_keeps_text():
    from envs.terminal import terminal_safe

    assert terminal_safe(f"a{EVIL}b") == "a\\x1b]52;c;ZXZpbA==\\x07\\x1b[2Jb"
    assert terminal_safe("line\ttab\nnext") == "line\ttab\nnext"
    assert terminal_safe("x\ry\bz\x7f\x9b\x9d\u202e\u2066") == "x\\x0dy\\x08z\\x7f\\x9b\\x9d\\u202e\\u2066"
    assert terminal_safe("Zoë — 東京 ─ 😀") == "Zoë — 東京 ─ 😀"
    assert terminal_safe("a\nb\tc\r\nd", one_line=True) == "a b c d"
    everything = "".join(map(chr, range(0x3000)))
    once = terminal_safe(everything)
    assert terminal_safe(once) == once
    assert not any(ord(c) < 0x20 and c not in "\n\t" or 0x7F <= ord(c) < 0xA0 for c in once)


def test_safe_print(capsys):
    from envs.terminal import safe_print

    safe_print("a", EVIL, "b", sep="|")
    assert capsys.readouterr().out == "a|\\x1b]52;c;ZXZpbA==\\x07\\x1b[2J|b\n"


@pytest.fixture
def evil_world(monkeypatch):
    """The default retriever (what ``make_env`` builds) returns only passages with escapes."""
    import envs.retrieval.factory

    monkeypatch.setattr(envs.retrieval.factory, "default_retriever", lambda *a, **k: KeywordRetriever(DOCS))


def test_play_and_replay_show_a_passage_s_escapes(evil_world, tmp_path, capsys):
    from agents.__main__ import main

    save = tmp_path / "ep.jsonl"
    assert main(["play", "--question", f"Where was Velmora Quist born?{EVIL}", "--workflow", "cascade",
                 "--save", str(save)]) == 0
    assert_shown_not_obeyed(capsys.readouterr().out)
    assert main(["replay", str(save), "--all"]) == 0
    assert_shown_not_obeyed(capsys.readouterr().out)
    from agents.__main__ import replay

    lines, shown = iter(["n", "s", "q"]), []
    args = type("Args", (), {"file": str(save), "index": 0, "all": False, "tokenizer": None})()
    assert replay(args, out=shown.append, read=lambda prompt: next(lines)) == 0
    assert_shown_not_obeyed("\n".join(shown))


def test_envs_step_shows_a_passage_s_escapes(evil_world, monkeypatch, capsys):
    from envs.__main__ import main

    typed = [":ctx", "<search>Velmora Quist</search>", "<summary>Port Velm.</summary>", ":all Ostria"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(typed) + "\n"))
    assert main(["step", "--workflow", "cascade", "--question", f"Where was Velmora Quist born?{EVIL}"]) == 0
    out = capsys.readouterr().out
    assert_shown_not_obeyed(out)
    assert "Final answer: 'Ostria'" in out


def test_render_human_shows_a_passage_s_escapes(tokenizer, capsys):
    from envs import search_team_v0

    env = search_team_v0.raw_env(tokenizer=tokenizer, retriever=KeywordRetriever(DOCS), questions=[QUESTION],
                                 workflow="cascade", render_mode="human")
    env.reset(seed=0)
    env.step("<search>Velmora Quist</search>")
    capsys.readouterr()
    assert env.render() is None
    assert_shown_not_obeyed(capsys.readouterr().out)


def test_data_show_prints_a_row_s_escapes(tmp_path, capsys):
    from envs.data.cli import main

    (tmp_path / "nq").mkdir()
    row = {"id": "1", "question": f"Who? ZXZpbA== {EVIL}", "golden_answers": [f"A{EVIL}"]}
    (tmp_path / "nq" / "test.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
    assert main(["show", "nq", "--root", str(tmp_path)]) == 0
    assert_shown_not_obeyed(capsys.readouterr().out)


class Text(HTMLParser):
    """The text a browser shows (outside ``<script>`` and ``<style>``) and the scripts."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.text, self.scripts, self._in = [], [], None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self._in = tag if tag in ("script", "style") else self._in

    def handle_endtag(self, tag):
        self._in = None if tag == self._in else self._in

    def handle_data(self, data):
        (self.scripts if self._in == "script" else self.text if self._in is None else []).append(data)


def test_the_viewer_page_keeps_a_passage_s_markup_and_escapes_as_text(tokenizer, tmp_path):
    from agents.collect import collect
    from agents.scripted import ScriptedPolicy
    from agents.viewer import write_page
    from envs import env_fn
    from envs.episode import save_episodes

    groups = collect(env_fn(tokenizer=tokenizer, retriever=KeywordRetriever(DOCS), questions=[QUESTION],
                            workflow="cascade"), ScriptedPolicy(), [QUESTION], 1)
    path = tmp_path / "ep.jsonl"
    save_episodes(path, groups[0])
    html = write_page(path, out=tmp_path / "page.html", tokenizer=tokenizer).read_text(encoding="utf-8")
    assert "<script>alert(1)</script>" not in html
    page = Text(html)
    shown = "".join(page.text)
    assert "<script>alert(1)</script>" in shown and "ZXZpbA==" in shown  # text, as the tokens hold it
    assert not any("alert(1)" in script for script in page.scripts)


def test_retrieval_search_prints_a_passage_s_escapes(tmp_path, monkeypatch, capsys):
    import envs.retrieval.__main__ as cli

    monkeypatch.setattr(cli, "_build", lambda args: KeywordRetriever(DOCS))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("")  # never read: the retriever above stands in for the built one
    assert cli.main(["search", "--corpus", str(corpus), f"Velmora Quist{EVIL}"]) == 0
    assert_shown_not_obeyed(capsys.readouterr().out)
