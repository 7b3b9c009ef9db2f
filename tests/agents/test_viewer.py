"""The episode viewer (issue 20): pages rendered from a scripted-team episode and from a
tiny-model training sample carry every token with the recorded values, make no network
request, step through turns in play order, set two episodes side by side, stay small for a
10,000-token workflow, and refuse bad input in one line. The page's script is run in a real
headless browser (Debian's ``chromium``) when one is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from html.parser import HTMLParser

import numpy as np
import pytest
from conftest import Q2, QUESTION, SETUP, WORLD, FaultyTeam, KeywordRetriever

from agents.viewer import ViewError, read_records, write_page
from agents.viewer.records import EpisodeValues, SegmentValues, sample_line, tokenizer_record
from envs.episode import Episode, load_episodes, save_episodes

# ----------------------------------------------------------------------------- helpers


class Page(HTMLParser):
    """Every token element of a page, by (episode prefix, segment index), with its attributes
    and text; the ``.turn`` spans and ``.envrun`` spans each token sits in; ``<body>``'s
    attributes."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tokens: dict[tuple[str, int], list[dict]] = {}
        self.body: dict[str, str] = {}
        self.stack: list[tuple[str, dict]] = []
        self.section: tuple[str, int] | None = None
        self.current_turns: list[int] = []
        self.links: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = {k: (v if v is not None else "") for k, v in attrs}
        if tag in ("link", "img", "iframe", "script") and (a.get("src") or a.get("href")):
            self.links.append(a.get("src") or a.get("href"))
        if tag == "body":
            self.body = a
        if tag == "section" and re.fullmatch(r"e\d-s\d+", a.get("id", "")):
            prefix, s = a["id"].split("-s")
            self.section = (prefix, int(s))
            self.tokens[self.section] = []
        if tag == "span":
            classes = a.get("class", "").split()
            if "turn" in classes and "current" in classes:
                self.current_turns.append(int(a["data-turn"]))
            ctx = {"turn": None, "env": False}
            for _, outer in self.stack:
                if outer.get("turn") is not None:
                    ctx["turn"] = outer["turn"]
                ctx["env"] = ctx["env"] or outer.get("env", False)
            if "turn" in classes:
                ctx["turn"] = int(a["data-turn"])
            if "envrun" in classes:
                ctx["env"] = True
            if "k" in classes:
                self.tokens[self.section].append({**a, "text": "", "in_turn": ctx["turn"], "in_env": ctx["env"]})
            self.stack.append(("span", {**ctx, "k": "k" in classes}))

    def handle_endtag(self, tag):
        if tag == "span" and self.stack:
            self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1][1].get("k"):
            self.tokens[self.section][-1]["text"] += data

    def all_tokens(self) -> list[dict]:
        return [t for key in sorted(self.tokens) for t in self.tokens[key]]


def num(value: str) -> float | None:
    return None if value == "" else float(value)


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def dump_dom(path, fragment: str = "") -> str:
    """The page's DOM after its script ran, from a real headless browser."""
    browser = chromium()
    if browser is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium); the page's script is untested")
    out = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          "--dump-dom", f"file://{path}{fragment}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def expected_values(ep: Episode, values: EpisodeValues | None):
    """Per segment, the token-aligned values the page must carry, computed from the record."""
    out = []
    for i, seg in enumerate(ep.segments):
        n = len(seg.token_ids)
        adv, ratio, old = [None] * n, [None] * n, [None] * n
        sv = values.of_segment(i) if values is not None else None
        if sv is not None:
            for j, p in enumerate(sv.positions):
                old[p] = sv.old_logp[j]
                adv[p] = sv.advantages[j] if sv.advantages is not None else None
                ratio[p] = sv.teacher_logp[j] - sv.old_logp[j] if sv.teacher_logp is not None else None
        out.append((adv, ratio, old))
    return out


def check_tokens(page: Page, prefix: str, ep: Episode, values: EpisodeValues | None, tokenizer):
    """Every token of every segment, in order, with the recorded id, role, mask and values."""
    expected = expected_values(ep, values)
    for i, seg in enumerate(ep.segments):
        got = page.tokens[(prefix, i)]
        assert [int(t["data-id"]) for t in got] == seg.token_ids
        assert {t["data-role"] for t in got} == {seg.role}
        assert [int(t["data-mask"]) for t in got] == seg.loss_mask
        adv, ratio, old = expected[i]
        assert [num(t["data-adv"]) for t in got] == adv
        assert [num(t["data-teacher-logratio"]) for t in got] == ratio
        assert [num(t["data-old"]) for t in got] == old
        # the text shown is the recorded tokens' text, nothing lost or re-tokenised
        assert "".join(t["text"] for t in got) == tokenizer.decode(seg.token_ids, skip_special_tokens=False)
        # env-written text is apart from the agent's turns, and each turn holds its tokens
        for t, m in zip(got, seg.loss_mask):
            assert not (t["in_env"] and m), "a generated token inside an env-written run"
    for k, (s, start, end) in enumerate(ep.turn_spans):
        in_turn = [p for p, t in enumerate(page.tokens[(prefix, s)]) if t["in_turn"] == k]
        assert in_turn == list(range(start, end))


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def scripted_file(tmp_path_factory, tokenizer):
    """Two scripted-team workflows on the keyword world's question, saved as episodes."""
    from agents.collect import collect
    from agents.scripted import ScriptedPolicy
    from envs import env_fn

    groups = collect(env_fn(tokenizer=tokenizer, retriever=KeywordRetriever(WORLD), questions=[QUESTION]),
                     ScriptedPolicy(), [QUESTION], 2)
    path = tmp_path_factory.mktemp("scripted") / "episodes.jsonl"
    save_episodes(path, groups[0])
    return path


@pytest.fixture(scope="module")
def train_sample(tmp_path_factory, tiny_dirs, torch_one_thread):
    """One Stage-II step (OPD, KL on) of a tiny model on a team that plays valid, mixed-reward
    episodes, with the training sample it keeps and the rows its loss was fed."""
    from algos.config import TrainConfig
    from algos.trainer import Trainer

    out = tmp_path_factory.mktemp("train") / "run"
    cfg = TrainConfig(**{**SETUP, "model": tiny_dirs["policy"], "teacher": tiny_dirs["teacher"], "stage": "team",
                         "searcher_signal": "opd", "kl_coef": 0.5, "out_dir": str(out), "sample_episodes": 4})
    trainer = Trainer(cfg, progress=False, retriever=KeywordRetriever(WORLD))
    trainer.train_questions = [QUESTION, Q2]
    trainer.policy = FaultyTeam(seed=cfg.seed)
    fed = []
    original = trainer.update

    def recording_update(rows):
        fed.extend(rows)
        return original(rows)

    trainer.update = recording_update
    trainer.train_step()
    return {"trainer": trainer, "path": out / "samples" / "step_000001.jsonl", "rows": fed}


# ----------------------------------------------------------------------------- pages


def test_scripted_episode_page_carries_every_token(scripted_file, tokenizer, tmp_path):
    page_path = write_page(scripted_file, 1, out=tmp_path / "page.html", tokenizer=tokenizer)
    html = page_path.read_text(encoding="utf-8")
    ep = load_episodes(scripted_file)[1]
    page = Page(html)
    check_tokens(page, "e0", ep, None, tokenizer)
    assert len(page.all_tokens()) == sum(len(s.token_ids) for s in ep.segments)
    # the workflow tree: every candidate, the selected evidence, the gold answers, rewards
    assert ep.num_waves == 2 and ep.selection == [1, 2]
    for text in (*ep.candidates, *ep.reports, *QUESTION.golden_answers, "Wave 2", "Evidence selected"):
        assert html.count(text) >= 1, text
    assert f"leader {ep.rewards['leader_0']:.3f}" in html
    # self-contained: no address to fetch, and a policy that forbids fetching anything
    assert not re.search(r"https?:", html) and not page.links
    assert "default-src 'none'" in html


def test_scripted_episode_page_in_a_browser(scripted_file, tokenizer, tmp_path):
    """The scripted-team page after its script ran in chromium: every recorded token, in
    order, with its id, role and mask; no resource fetched; nothing to colour by."""
    path = write_page(scripted_file, 1, out=tmp_path / "page.html", tokenizer=tokenizer)
    ep = load_episodes(scripted_file)[1]
    dom = Page(dump_dom(path))
    assert dom.body["data-ready"] == "1" and dom.body["data-resources"] == "0"
    assert int(dom.body["data-tokens"]) == len(dom.all_tokens()) == sum(len(s.token_ids) for s in ep.segments)
    check_tokens(dom, "e0", ep, None, tokenizer)
    assert dom.body["data-turns"] == str(len(ep.turn_spans)) and dom.body["class"].split()[0] == "mode-plain"
    assert {t["data-adv"] for t in dom.all_tokens()} == {""}  # a played episode carries no learner values


def test_training_sample_holds_the_values_the_loss_used(train_sample):
    """The sample's values are the rows fed to the loss, and the team's episodes carry a
    signal (mixed rewards, non-zero advantages on every role, Teacher log-ratios)."""
    records = read_records(train_sample["path"])
    assert len(records) == 4  # sample_episodes, the first question's whole group
    assert len({ep.question["question"] for ep, _ in records}) == 1
    assert {values.group for _, values in records} == {0}
    trainer = train_sample["trainer"]
    seen_roles, nonzero = set(), set()
    fed_episodes = list({id(r.episode): r.episode for r in train_sample["rows"]}.values())  # batch order
    for (ep, values), fed in zip(records, fed_episodes):
        assert ep.to_dict() == fed.to_dict()
        assert values.kind == "train" and values.step == 1 and values.stage == "team"
        assert values.tokenizer == tokenizer_record(trainer.tokenizer)
        assert len(values.segments) == sum(r.episode is fed for r in train_sample["rows"])
        for sv in values.segments:
            seg = ep.segments[sv.segment]
            [row] = [r for r in train_sample["rows"] if r.episode is fed and r.segment is fed.segments[sv.segment]]
            assert sv.positions == np.flatnonzero(row.mask).tolist()
            assert sv.old_logp == row.old_logp.tolist() and sv.advantages == row.advantages.tolist()
            assert sv.teacher_logp == (None if row.teacher_logp is None else row.teacher_logp.tolist())
            assert sv.kl == (seg.role != "searcher") and sv.trained
            seen_roles.add(seg.role)
            if np.any(np.asarray(sv.advantages) != 0):
                nonzero.add(seg.role)
    assert seen_roles == {"leader", "searcher", "answerer"} == nonzero
    # agents replay reads samples too
    assert [e.to_dict() for e in load_episodes(train_sample["path"])] == [e.to_dict() for e, _ in records]


def test_training_sample_page_in_a_browser(train_sample, tmp_path):
    """The page of a training sample, after its script ran in chromium: as many token
    elements as recorded, their data-adv and data-teacher-logratio the recorded values,
    no resource fetched; ``#turn=3`` opens the third turn in play order."""
    trainer = train_sample["trainer"]
    path = write_page(train_sample["path"], 1, out=tmp_path / "sample.html", tokenizer=trainer.tokenizer)
    ep, values = read_records(train_sample["path"])[1]
    page = Page(path.read_text(encoding="utf-8"))
    check_tokens(page, "e0", ep, values, trainer.tokenizer)
    assert page.body["class"].split()[0] == "mode-adv"
    dom = Page(dump_dom(path, "#turn=3"))
    assert dom.body["data-ready"] == "1" and dom.body["data-resources"] == "0"
    recorded = [t for s in expected_values(ep, values) for t in s[0]]
    expected_order = [(i, p) for i, seg in enumerate(ep.segments) for p in range(len(seg.token_ids))]
    assert int(dom.body["data-tokens"]) == len(expected_order) == len(dom.all_tokens())
    by_segment = {key: [num(t["data-adv"]) for t in toks] for key, toks in dom.tokens.items()}
    assert [v for i in range(len(ep.segments)) for v in by_segment[("e0", i)]] == recorded
    assert sum(v is not None and v != 0 for v in recorded) > 10
    check_tokens(dom, "e0", ep, values, trainer.tokenizer)
    assert dom.body["data-turns"] == str(len(ep.turn_spans)) and dom.current_turns == [2]


def test_side_by_side_in_a_browser(scripted_file, train_sample, tokenizer, tmp_path):
    """Two episodes of the same question in one page, each with its own tokens and turns;
    n / p (here: ``#turn=``) step both."""
    path = write_page(train_sample["path"], 0, compare=train_sample["path"], out=tmp_path / "two.html",
                      tokenizer=train_sample["trainer"].tokenizer)
    records = read_records(train_sample["path"])
    page = Page(path.read_text(encoding="utf-8"))
    check_tokens(page, "e0", *records[0], train_sample["trainer"].tokenizer)
    check_tokens(page, "e1", *records[1], train_sample["trainer"].tokenizer)  # the first other one, same question
    dom = Page(dump_dom(path, "#turn=2"))
    assert dom.body["data-ready"] == "1" and dom.body["data-resources"] == "0"
    assert dom.body["data-turns"] == f"{len(records[0][0].turn_spans)},{len(records[1][0].turn_spans)}"
    assert dom.current_turns == [1, 1]
    assert int(dom.body["data-tokens"]) == sum(len(s.token_ids) for ep, _ in records[:2] for s in ep.segments)
    # another question cannot stand beside it
    other = tmp_path / "other.jsonl"
    ep = load_episodes(scripted_file)[0]
    ep.question = {**ep.question, "question": "Where is Kesh?"}
    save_episodes(other, [ep])
    with pytest.raises(ViewError, match=r"other\.jsonl holds no other episode on the question 'In which country"):
        write_page(scripted_file, 0, compare=other, tokenizer=tokenizer)
    with pytest.raises(ViewError, match=r"other\.jsonl #0 is on another question \('Where is Kesh\?'\)"):
        write_page(scripted_file, 0, compare=other, compare_index=0, tokenizer=tokenizer)


def long_episode(scripted_file, copies: int) -> tuple[Episode, EpisodeValues]:
    """A scripted episode whose contexts repeat ``copies`` times (turns too), with made-up
    per-token values on every generated token: a big workflow for the size test (the one
    ``benchmarks.viewer_load`` opens in a browser)."""
    from benchmarks.viewer_load import repeat_episode

    return repeat_episode(load_episodes(scripted_file)[0], copies)


def test_a_ten_thousand_token_workflow_page(scripted_file, tokenizer, tmp_path):
    ep, values = long_episode(scripted_file, 7)
    total = sum(len(s.token_ids) for s in ep.segments)
    assert total >= 10_000
    sample = tmp_path / "long.jsonl"
    sample.write_text(sample_line(ep, values), encoding="utf-8")
    path = write_page(sample, 0, tokenizer=tokenizer)
    assert path == tmp_path / "long.0.html"
    size = path.stat().st_size
    assert size < 300 * total, f"{size} bytes for {total} tokens"  # spans rendered once, script light
    script = re.search(r"<script>(.*?)</script>", path.read_text(encoding="utf-8"), re.S).group(1)
    assert len(script) < 8000
    dom = Page(dump_dom(path))
    assert dom.body["data-ready"] == "1" and int(dom.body["data-tokens"]) == total
    assert dom.body["data-turns"] == str(len(ep.turn_spans))
    # the page measures how long it took to open (benchmarks/viewer_load.py prints it; no
    # time limit here): whole milliseconds since navigation start, layout after the script
    script_ms, ready_ms = dom.body["data-script-ms"], dom.body["data-ready-ms"]
    assert script_ms.isdigit() and ready_ms.isdigit() and 0 < int(script_ms) <= int(ready_ms)


# ----------------------------------------------------------------------------- bad input


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_not_an_episode_file(tmp_path, tokenizer):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "team/em": 0.5}) + "\n", encoding="utf-8")
    with pytest.raises(ViewError) as err:
        write_page(metrics, tokenizer=tokenizer)
    assert f"{metrics}:1: not an episode record" in one_line(err)
    text = tmp_path / "notes.txt"
    text.write_text("hello\n", encoding="utf-8")
    with pytest.raises(ViewError, match=r"notes\.txt:1: not an episode file \(not JSON"):
        write_page(text, tokenizer=tokenizer)
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\x80\x81\xff")
    with pytest.raises(ViewError, match="not UTF-8"):
        write_page(binary, tokenizer=tokenizer)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ViewError, match="holds no episode"):
        write_page(empty, tokenizer=tokenizer)
    with pytest.raises(ViewError, match="no such file"):
        write_page(tmp_path / "missing.jsonl", tokenizer=tokenizer)


def test_values_that_do_not_fit_the_episode(scripted_file, tmp_path, tokenizer):
    ep = load_episodes(scripted_file)[0]
    s = next(i for i, seg in enumerate(ep.segments) if seg.role == "searcher")
    env_position = ep.segments[s].loss_mask.index(0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(sample_line(ep, EpisodeValues("train", 1, segments=[SegmentValues(s, [env_position], [-1.0])])),
                   encoding="utf-8")
    with pytest.raises(ViewError, match=rf"bad\.jsonl:1: segment {s}'s value positions"):
        write_page(bad, tokenizer=tokenizer)
    gen = [p for p, m in enumerate(ep.segments[s].loss_mask) if m][:2]
    bad.write_text(sample_line(ep, EpisodeValues("train", 1, segments=[SegmentValues(s, gen, [-1.0])])),
                   encoding="utf-8")
    with pytest.raises(ViewError, match=r"has 2 value positions but \{'old_logp': 1\}"):
        write_page(bad, tokenizer=tokenizer)


def test_index_out_of_range(scripted_file, tokenizer):
    with pytest.raises(ViewError) as err:
        write_page(scripted_file, 2, tokenizer=tokenizer)
    assert one_line(err) == f"--index 2 is out of range: {scripted_file} holds 2 episodes (0..1)"
    assert write_page(scripted_file, -1, tokenizer=tokenizer).name == "episodes.1.html"


@pytest.fixture(scope="module")
def small_tokenizer():
    """Another tokenizer: a byte-level BPE of a few hundred tokens with ChatML specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|pad|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([d.text for d in WORLD] + [QUESTION.question, "system\nuser\nassistant\n"], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|pad|>",
                                   additional_special_tokens=["<|im_start|>"])


def test_episode_recorded_with_another_tokenizer(scripted_file, small_tokenizer, tokenizer, tmp_path):
    # SmolLM2's ids, read with a vocabulary of a few hundred tokens
    with pytest.raises(ViewError) as err:
        write_page(scripted_file, tokenizer=small_tokenizer)
    assert one_line(err).startswith(f"{scripted_file} #0: segment 0 (leader_0) holds token id ")
    assert f"outside the {len(small_tokenizer)}-token vocabulary" in str(err.value) and "--tokenizer" in str(err.value)
    # the small tokenizer's ids all lie inside SmolLM2's vocabulary: the chat frame tells
    from agents.collect import collect
    from agents.scripted import ScriptedPolicy
    from envs import env_fn

    [[ep]] = collect(env_fn(tokenizer=small_tokenizer, retriever=KeywordRetriever(WORLD), questions=[QUESTION]),
                     ScriptedPolicy(), [QUESTION])
    small = tmp_path / "small.jsonl"
    save_episodes(small, [ep])
    with pytest.raises(ViewError) as err:
        write_page(small, tokenizer=tokenizer)
    assert "does not open with" in one_line(err) and "another tokenizer" in str(err.value)
    assert write_page(small, tokenizer=small_tokenizer).exists()
    # a sample names its tokenizer's fingerprint
    sample = tmp_path / "sample.jsonl"
    sample.write_text(sample_line(ep, EpisodeValues("validation", 0, tokenizer=tokenizer_record(small_tokenizer))),
                      encoding="utf-8")
    with pytest.raises(ViewError, match=rf"recorded with another tokenizer .*{len(small_tokenizer)} tokens"):
        write_page(sample, tokenizer=tokenizer)


def test_a_resumed_runs_tokenizer_folder_is_recorded_absolute(small_tokenizer, tokenizer, tmp_path, monkeypatch):
    """After ``--resume`` the tokenizer comes from a checkpoint folder named relative to the
    working folder; a sample records it as an absolute path (a hub id stays as it is)."""
    from transformers import AutoTokenizer

    from agents.viewer.records import recorded_name
    from algos.samples import sample_tokenizer_record

    small_tokenizer.save_pretrained(tmp_path / "run" / "checkpoints" / "step_000002")
    monkeypatch.chdir(tmp_path)
    resumed = AutoTokenizer.from_pretrained("run/checkpoints/step_000002")  # as Trainer(resume=True) loads it
    assert resumed.name_or_path == "run/checkpoints/step_000002"
    record = tokenizer_record(resumed)
    assert record["name"] == str(tmp_path.resolve() / "run" / "checkpoints" / "step_000002")
    assert record["vocab_size"] == len(small_tokenizer) and record["fingerprint"] == tokenizer_record(
        small_tokenizer)["fingerprint"]
    assert sample_tokenizer_record(resumed) == record == sample_tokenizer_record(resumed)  # cached per object
    assert recorded_name("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert recorded_name("run/checkpoints/step_000009") == "run/checkpoints/step_000009"  # not a folder
    assert recorded_name(None) == "" and tokenizer_record(tokenizer)["name"] == tokenizer.name_or_path


def test_the_recorded_tokenizer_is_found_or_asked_for(scripted_file, small_tokenizer, tokenizer, tmp_path, monkeypatch,
                                                      capsys):
    """A sample opens with the tokenizer it records, from any working folder (an old
    sample's relative name is looked up under the folders above the file); a recorded
    tokenizer that is gone is one line asking for --tokenizer, never "another tokenizer";
    a benchmark run's episodes open with the tokenizer its summary.json records."""
    from transformers import AutoTokenizer

    from agents.__main__ import main
    from agents.collect import collect
    from agents.scripted import ScriptedPolicy
    from envs import env_fn

    [[ep]] = collect(env_fn(tokenizer=small_tokenizer, retriever=KeywordRetriever(WORLD), questions=[QUESTION]),
                     ScriptedPolicy(), [QUESTION])
    tokens = sum(len(seg.token_ids) for seg in ep.segments)
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002"
    small_tokenizer.save_pretrained(ckpt)
    record = tokenizer_record(AutoTokenizer.from_pretrained(ckpt))
    sample = tmp_path / "run" / "samples" / "val_step_000002.jsonl"
    sample.parent.mkdir(parents=True)
    sample.write_text(sample_line(ep, EpisodeValues("validation", 2, tokenizer=record)), encoding="utf-8")
    old = tmp_path / "run" / "samples" / "val_step_000001.jsonl"
    old.write_text(sample_line(ep, EpisodeValues("validation", 1, tokenizer={
        **record, "name": "run/checkpoints/step_000002"})), encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for path in (sample, old):
        page = Page(write_page(path, out=elsewhere / f"{path.stem}.html").read_text(encoding="utf-8"))
        check_tokens(page, "e0", ep, None, small_tokenizer)
        assert len(page.all_tokens()) == tokens
    # the checkpoint is gone: SmolLM2 is not the recorded tokenizer, and the page says what is missing
    copy = tmp_path / "copy"
    small_tokenizer.save_pretrained(copy)
    for name in (ckpt, tmp_path / "run" / "checkpoints"):
        shutil.rmtree(name)
    with pytest.raises(ViewError) as err:
        write_page(sample)
    assert one_line(err) == (f"{sample}: cannot load the recorded tokenizer {ckpt}; pass --tokenizer "
                             f"(no such folder: {ckpt})")
    with pytest.raises(ViewError, match="cannot load the recorded tokenizer run/checkpoints/step_000002; pass"):
        write_page(old)
    assert main(["view", str(sample)]) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and "another tokenizer" not in stderr and "pass --tokenizer" in stderr
    assert main(["view", str(sample), "--tokenizer", str(copy), "--out", str(elsewhere / "given.html")]) == 0
    assert capsys.readouterr().out.strip() == str(elsewhere / "given.html")
    # a recorded tokenizer that is gone but is SmolLM2's: the default stands in
    smol = load_episodes(scripted_file)[0]
    gone = tmp_path / "smol.jsonl"
    gone.write_text(sample_line(smol, EpisodeValues("validation", 0, tokenizer={
        **tokenizer_record(tokenizer), "name": str(tmp_path / "gone")})), encoding="utf-8")
    assert write_page(gone, out=elsewhere / "smol.html").exists()
    # a benchmark run's episodes (no values): the tokenizer its summary.json records
    bench = tmp_path / "bench"
    save_episodes(bench / "episodes.jsonl", [ep])
    with pytest.raises(ViewError, match="does not open with"):  # nothing recorded: SmolLM2 is tried, and refused
        write_page(bench / "episodes.jsonl")
    (bench / "summary.json").write_text(json.dumps({"meta": {"tokenizer": tokenizer_record(
        AutoTokenizer.from_pretrained(copy))}}), encoding="utf-8")
    page = Page(write_page(bench / "episodes.jsonl").read_text(encoding="utf-8"))
    assert len(page.all_tokens()) == tokens
    (bench / "summary.json").write_text("[not a summary", encoding="utf-8")
    with pytest.raises(ViewError, match="does not open with"):
        write_page(bench / "episodes.jsonl")


def test_command_line(scripted_file, tmp_path, capsys):
    """``python -m agents view``: the page's path on stdout; bad input is one line on stderr
    and exit status 2."""
    from agents.__main__ import main

    out = tmp_path / "cli.html"
    assert main(["view", str(scripted_file), "--index", "1", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out) and out.exists()
    assert main(["view", str(scripted_file), "--index", "7"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--index 7 is out of range" in err


def test_serve_answers_the_page_on_localhost(scripted_file, tokenizer, tmp_path):
    from agents.viewer.cli import make_server

    path = write_page(scripted_file, 0, out=tmp_path / "p.html", tokenizer=tokenizer)
    server = make_server(path, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert server.server_address[0] == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/", timeout=10) as r:
            assert r.status == 200 and r.read() == path.read_bytes()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/etc/passwd", timeout=10)
        assert err.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_validation_sample_and_sample_every(train_sample, tmp_path):
    """A validation keeps its first episodes scored as a step would score them, without
    advantages; ``sample_every`` decides which steps keep a sample (0: none)."""
    trainer = train_sample["trainer"]
    trainer.validate()
    path = trainer.out / "samples" / "val_step_000001.jsonl"
    records = read_records(path)
    assert len(records) == min(trainer.config.sample_episodes, len(trainer.val_questions))
    assert [ep.question["question"] for ep, _ in records] == [q.question for q in trainer.val_questions][:len(records)]
    scored = 0
    for ep, values in records:
        assert values.kind == "validation" and values.step == 1
        for sv in values.segments:
            assert sv.advantages is None and len(sv.old_logp) == len(sv.positions)
            role = ep.segments[sv.segment].role
            assert (sv.teacher_logp is not None) and sv.kl == (role != "searcher")  # kl_coef > 0: all scored
            scored += len(sv.positions)
    assert scored > 0
    page = write_page(path, 0, out=tmp_path / "val.html", tokenizer=trainer.tokenizer).read_text(encoding="utf-8")
    assert 'class="mode-teacher' in page and 'value="adv"' not in page
    trainer.config.sample_every = 0
    trainer.train_step()
    assert trainer.step == 2 and not (trainer.out / "samples" / "step_000002.jsonl").exists()
