"""The CPU "micro" preset's base model: a small byte-level BPE fitted to the synthetic world
and the turn protocol, a tiny Llama over it, and a warm start by imitation of the scripted
team (SFT on its episodes).

Why: on a CPU most of a tiny model's cost is its output layer, so a 49k vocabulary makes
even a 16M-parameter model slow (DESIGN.md, "What things cost"). A 4k vocabulary trained
on the text the env actually shows (passages, questions, prompts, tags) keeps contexts
short and the output layer cheap, and the env takes any tokenizer, so nothing else
changes. The micro model starts from random weights; imitating the scripted team teaches
it the protocol, so RL begins from a policy that writes valid turns.

>>> tok = micro_tokenizer()                                   # doctest: +SKIP
>>> model = micro_model(tok)                                  # doctest: +SKIP
>>> path = build_micro_base()       # cached after the first build (a few minutes)  # doctest: +SKIP
>>> policy = HFPolicy(str(path), temperature=0)               # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from agents.scripted import SKIPPED_REPORT, ScriptedPolicy
from envs import protocol as P
from envs.observation import observe_awaiting
from envs.paths import cache_dir
from envs.retrieval.passage import MemoRetriever

PAD, IM_START, IM_END = "<|pad|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END)
"""The micro tokenizer's special tokens, ids 0, 1, 2: pad, ChatML start, ChatML end (= EOS)."""

PROTOCOL_TOKENS = tuple(f"<{t}>" for t in (*P.TAGS, "information")) + tuple(
    f"</{t}>" for t in (*P.TAGS, "information"))
"""Protocol tags added as single (ordinary, not special) tokens: a tiny model then writes a
tag in one step, and decoding with ``skip_special_tokens=True`` (as the env does) keeps them."""

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

MICRO_ENV: dict[str, int] = {
    "max_turn_tokens": 64,
    "max_context_tokens": 1024,
    "max_waves": 2,
    "max_searchers": 2,
    "max_searcher_turns": 3,
}
"""SearchTeam arguments of the micro preset (with the micro tokenizer): the scripted team's
SFT episodes and the RL trainers use the same env shape. Three Searcher turns = at most
two searches and a summary, the scripted Searcher's budget."""

TOKENIZER_VERSION = 1
"""Bumped whenever the way the tokenizer is trained changes (cached ones are then retrained)."""

PROTOCOL_WEIGHT = 200
"""How many times the protocol text counts against the world's text when the BPE is fitted
(an episode shows the prompts once per agent, so they are far more frequent than any one
passage)."""


# ----------------------------------------------------------------------------- tokenizer


def _protocol_texts() -> list[str]:
    """The fixed strings the env and the chat format write (``envs.protocol``, and phrases of
    ``envs.team`` copied here), filled as the env fills them. Only a frequency hint: the
    BPE is byte-level, so any text left out still round-trips, in more tokens."""
    prompts = [text.format(max_searchers=k, max_waves=w, max_searches=s)
               for text in P.SYSTEM_PROMPTS.values()
               for k, w, s in ((2, 2, 2), (3, 3, 3), (1, 1, 1))]
    env_phrases = [
        "Waves left: 1. Dispatch another wave with <subtask> tags, or choose the reports "
        "for the Answerer with <select>numbers</select>.",
        "No waves left: choose the reports for the Answerer with <select>numbers</select>.",
        "[1] Sub-task: In which city was Ana born?\nReport: (no report)\n[2] Sub-task: x\nReport: y",
        "Question: Who was born later?\n\nEvidence:\n[1] (no report)\n[2] (none)",
        "\nYou have one turn left: write your <summary> now.",
        "Invalid turn: no <search> or <summary> tag. ",
        "Invalid turn: no <subtask> or <select> tag. ",
        "Invalid turn: no <answer> tag. ",
        "Invalid turn: no waves left; write <select>numbers</select>. ",
        "Invalid turn: a turn either dispatches sub-tasks or selects reports, not both. ",
        "<information>Doc 1(Title: A) a\nDoc 2(Title: B) b\nDoc 3(Title: C) c</information>",
        "<think>I should search.</think><search>query</search><summary>report</summary>",
        "<subtask>task</subtask><subtask>task</subtask><select>1, 2</select><answer>1976</answer>",
        "system\nuser\nTask: \nassistant\n",
    ]
    return prompts + list(P.FORMAT_REMINDERS.values()) + env_phrases


def _world(seed: int) -> Any:
    """The synthetic world of ``seed``: 0 is ``default_world()`` (built once per process)."""
    from envs.data.synthwiki import build_world, default_world

    return default_world() if seed == 0 else build_world(seed)


def _world_texts(seed: int) -> list[str]:
    """The synthetic world's passages (as the env renders them), questions and answers."""
    from envs.data.qa import DATASETS
    from envs.data.synthwiki import SPLITS

    world = _world(seed)
    texts = []
    for row in world.corpus:
        title, _, body = row["contents"].partition("\n")
        texts.append(f"Doc 1(Title: {title}) {body}")
    for split in SPLITS:
        for dataset in DATASETS:
            for q in world.questions(dataset, split):
                texts.append(f"Question: {q.question}")
                texts.extend(q.golden_answers)
    return texts


def train_micro_tokenizer(vocab_size: int = 4096, seed: int = 0) -> Any:
    """A byte-level BPE of ``vocab_size`` tokens (special and tag tokens included), fitted to
    the synthetic world of ``seed`` (0 = ``default_world()``, the env's default) and the
    protocol text, as a ``transformers.PreTrainedTokenizerFast``: pad ``<|pad|>`` (id 0),
    ``<|im_start|>`` (1), EOS ``<|im_end|>`` (2), a ChatML chat template. Deterministic:
    the same arguments give the same vocabulary and merges. Byte-level, so every string
    round-trips: ``decode(encode(s)) == s``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    floor = 256 + len(SPECIAL_TOKENS) + len(PROTOCOL_TOKENS)
    if vocab_size < floor + 64:
        raise ValueError(f"vocab_size must be >= {floor + 64} (bytes, special and tag tokens "
                         f"and some merges), got {vocab_size}")
    texts = _world_texts(seed) + _protocol_texts() * PROTOCOL_WEIGHT
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(PROTOCOL_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer)
    bpe.add_tokens([AddedToken(t, normalized=False, special=False) for t in PROTOCOL_TOKENS])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token=PAD, eos_token=IM_END,
        additional_special_tokens=[IM_START], clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def _tokenizer_fingerprint(vocab_size: int, seed: int) -> str:
    """What a cached tokenizer was trained from; a mismatch (the protocol text changed,
    say) retrains it."""
    inputs = [TOKENIZER_VERSION, vocab_size, seed, PROTOCOL_WEIGHT, SPECIAL_TOKENS,
              PROTOCOL_TOKENS, _protocol_texts()]
    return hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:16]


def micro_tokenizer(vocab_size: int = 4096, seed: int = 0) -> Any:
    """:func:`train_micro_tokenizer`'s tokenizer, trained once and then loaded from
    ``cache_dir("tokenizers", f"micro-{vocab_size}-seed{seed}")`` (retrained when the
    protocol text it was fitted to has changed since)."""
    from transformers import PreTrainedTokenizerFast

    path = cache_dir("tokenizers", f"micro-{vocab_size}-seed{seed}")
    fingerprint = _tokenizer_fingerprint(vocab_size, seed)
    stamp = path / "micro_tokenizer.json"
    if not (path / "tokenizer.json").exists() or not stamp.exists() or \
            json.loads(stamp.read_text()).get("fingerprint") != fingerprint:
        tok = train_micro_tokenizer(vocab_size, seed)
        _save_atomically(_Saver([tok], {"micro_tokenizer.json": {"fingerprint": fingerprint}}),
                         path, replace=True)
    return PreTrainedTokenizerFast.from_pretrained(path)


class _Saver:
    """Saves objects with ``save_pretrained`` and JSON records, into one directory."""

    def __init__(self, objects: Sequence[Any], records: dict[str, Any]):
        self.objects, self.records = list(objects), records

    def save_pretrained(self, path: Path) -> None:
        for obj in self.objects:
            obj.save_pretrained(path)
        for name, record in self.records.items():
            (Path(path) / name).write_text(json.dumps(record, indent=1) + "\n")


def _save_atomically(saver: Any, target: Path, *, replace: bool = False) -> None:
    """``saver.save_pretrained`` into a temporary sibling, then moved into place, so a crash
    or a concurrent reader never sees half a directory. An existing non-empty ``target`` is
    replaced only when ``replace`` (a cache entry), never otherwise (a user's directory)."""
    target = Path(target)
    if target.exists() and any(target.iterdir()) and not replace:
        raise FileExistsError(f"{target} exists and is not empty; give another directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        saver.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- model


def micro_model(tokenizer: Any, hidden_size: int = 256, num_layers: int = 4, num_heads: int = 8,
                seed: int = 0, max_position_embeddings: int = 2048,
                tie_word_embeddings: bool = True, induction: bool = False,
                lookup: bool = False) -> Any:
    """A randomly initialised Llama (``agents.models.tiny_causal_lm``) over ``tokenizer``'s
    vocabulary, with its EOS (``<|im_end|>``) and pad ids; the same weights for the same
    arguments. With the defaults and a 4k vocabulary: about 5.2M parameters.

    ``induction`` wires a copy circuit into layers 0 and 1 (``agents.induction``): a quarter
    of layer 0's heads look 1, 2, ... positions back, and half of layer 1's copy the token
    that followed an earlier occurrence of the last tokens. The model then copies names out
    of its context before any training; learned from scratch, that circuit did not form
    within the build's budget. It needs tied embeddings, query/key
    biases and a RoPE base at which only two frequency pairs turn (``ROPE_THETA``), so the
    config has those. ``lookup`` (with ``induction``) also wires half of layer 2's heads as
    lookup heads, which learn where in the context to start copying (the first token of
    an answer)."""
    from agents.induction import ROPE_THETA, wire_induction_heads
    from agents.models import tiny_causal_lm

    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no eos_token_id")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model = tiny_causal_lm(len(tokenizer), hidden_size=hidden_size, num_layers=num_layers,
                           num_heads=num_heads, max_position_embeddings=max_position_embeddings,
                           seed=seed, eos_token_id=tokenizer.eos_token_id, pad_token_id=pad,
                           tie_word_embeddings=tie_word_embeddings, attention_bias=induction,
                           rope_theta=ROPE_THETA if induction else 10000.0)
    if lookup and not induction:
        raise ValueError("micro_model: lookup heads read the induction circuit's look-back "
                         "tokens, so lookup=True needs induction=True")
    if induction:
        wire_induction_heads(model, prev_heads=range(max(1, num_heads // 4)),
                             induction_heads=range(max(1, num_heads // 2)),
                             lookup_heads=range(num_heads // 2) if lookup else (), seed=seed)
    return model


# ----------------------------------------------------------------------------- the SFT base

WORKFLOWS = ("hierarchical", "cascade")


_OPENING_TAG = re.compile("(" + "|".join(f"<{t}>" for t in P.TAGS) + r")(?=\S)")


def spaced_tags(text: str) -> str:
    """``text`` with a space after each opening protocol tag that a word follows directly:
    ``<answer>Ludina Tovar</answer>`` becomes ``<answer> Ludina Tovar</answer>``. A byte-level
    BPE fuses a word's leading space into its token, so a name mid-sentence in a passage
    (`` Ludina``) and the same name right after a tag (``L`` + ``udina``) share no token,
    and a copy head cannot copy it. The parsers strip the space, so the turn means the same.

    >>> spaced_tags("<search>Who wrote it?</search><summary> Kept.</summary>")
    '<search> Who wrote it?</search><summary> Kept.</summary>'
    """
    return _OPENING_TAG.sub(r"\1 ", text)


class _EosScripted:
    """The scripted team as a model should write it: every turn closed by EOS, and a space
    after each opening tag (:func:`spaced_tags`). The env cuts a Searcher or Answerer turn at
    its closing tag (the EOS is dropped, the env closes the message), but a Leader's wave of
    sub-tasks ends only at EOS, so imitation has to see that EOS among the generated
    (loss-masked) tokens."""

    def __init__(self, tokenizer: Any, seed: int = 0, skip_search: float = 0.0):
        self.policy = ScriptedPolicy(seed=seed, skip_search=skip_search)
        self.tokenizer = tokenizer

    def act(self, observations: Sequence[Any]) -> list[Any]:
        from agents.base import Action

        eos = self.tokenizer.eos_token_id
        return [Action(token_ids=self.tokenizer.encode(spaced_tags(text), add_special_tokens=False) + [eos])
                for text in self.policy.act(observations)]


def micro_env_fn(tokenizer: Any, workflow: str = "hierarchical", retriever: Any = None,
                 **overrides: Any) -> Any:
    """A function that makes one micro-preset SearchTeam env (``MICRO_ENV`` + overrides)
    over the synthetic world; for :func:`agents.collect.collect`."""
    import functools

    from envs import search_team_v0
    from envs.search_team import default_retriever

    return functools.partial(search_team_v0.raw_env, workflow=workflow, tokenizer=tokenizer,
                             retriever=retriever or default_retriever(),
                             **{**MICRO_ENV, **overrides})


def _questions(split: str, per_dataset: int, world_seed: int = 0) -> list[Any]:
    from envs.data.qa import DATASETS

    world = _world(world_seed)
    return [q for d in DATASETS for q in world.questions(d, split)[:per_dataset]]


def scripted_episodes(tokenizer: Any, per_dataset: int, *, split: str = "train",
                      workflows: Sequence[str] = WORKFLOWS, retriever: Any = None,
                      worlds: Sequence[int] = (0,), seed: int = 0, skip_search: float = 0.0,
                      progress: bool = False) -> list[Any]:
    """The scripted team's Episodes on the first ``per_dataset`` synthetic questions of each
    dataset in ``split``, one per question and workflow, in the micro env, for each world
    seed in ``worlds`` (0 = ``default_world()``, the one validation uses). ``retriever``
    serves world 0 (default: ``envs.search_team.default_retriever()``); any other world is
    searched by MiniLM over its own corpus (``DenseRetriever``, index cached on disk).
    ``skip_search``: the share of Searcher tasks the scripted team reports on without
    searching (``agents.scripted.ScriptedPolicy``)."""
    from agents.collect import collect
    from envs.retrieval import DenseRetriever
    from envs.search_team import default_retriever

    episodes = []
    for world_seed in worlds:
        if world_seed == 0:
            searched = retriever or default_retriever()
        else:
            searched = DenseRetriever(_world(world_seed).corpus)
        memo = MemoRetriever(searched)
        questions = _questions(split, per_dataset, world_seed)
        for workflow in workflows:
            groups = collect(micro_env_fn(tokenizer, workflow, memo),
                             _EosScripted(tokenizer, seed, skip_search),
                             questions, seed=seed, max_envs=128, progress=progress)
            episodes += [ep for group in groups for ep in group]
    return episodes


def imitated(episodes: Sequence[Any]) -> list[Any]:
    """The scripted episodes the base imitates: those the team answered right, and those in
    which a Searcher reported without searching (``skip_search``), right or not, so that the
    base skips as often as the team it imitates."""
    return [ep for ep in episodes if ep.team_em == 1 or SKIPPED_REPORT in ep.reports]


def team_stats(episodes: Sequence[Any]) -> dict[str, float]:
    """Team EM (any candidate right), final-answer EM, invalid-turn rate, searches per
    workflow, and per-dataset team EM (``em/<dataset>``) of a list of Episodes."""
    if not episodes:
        return {}
    n = len(episodes)
    turns = sum(ep.turns for ep in episodes)
    stats = {
        "episodes": float(n),
        "team_em": sum(ep.team_em for ep in episodes) / n,
        "final_em": sum(ep.final_em for ep in episodes) / n,
        "invalid_rate": sum(ep.invalid_turns for ep in episodes) / max(1, turns),
        "searches": sum(ep.num_searches for ep in episodes) / n,
    }
    by_dataset: dict[str, list[float]] = {}
    for ep in episodes:
        by_dataset.setdefault(ep.question.get("dataset", ""), []).append(ep.team_em)
    stats.update({f"em/{d}": sum(v) / len(v) for d, v in by_dataset.items()})
    return stats


def evaluate_team(policy: Any, tokenizer: Any, *, split: str = "dev", per_dataset: int = 10,
                  workflows: Sequence[str] = WORKFLOWS, retriever: Any = None, seed: int = 0,
                  progress: bool = False) -> dict[str, dict[str, float]]:
    """:func:`team_stats` per workflow of ``policy`` on the first ``per_dataset`` synthetic
    questions of each dataset in ``split``, in the micro env."""
    from agents.collect import collect

    questions = _questions(split, per_dataset)
    out = {}
    for workflow in workflows:
        groups = collect(micro_env_fn(tokenizer, workflow, retriever), policy, questions,
                         seed=seed, max_envs=128, progress=progress)
        out[workflow] = team_stats([ep for group in groups for ep in group])
    return out


def searcher_skip_probability(model: Any, tokenizer: Any, *, workflow: str = "cascade",
                              split: str = "dev", per_dataset: int = 20,
                              retriever: Any = None) -> list[float]:
    """How likely ``model`` is to report without searching: for each first Searcher turn on
    the first ``per_dataset`` questions of each style in ``split`` (micro env), the
    probability of opening it with ``<summary>`` rather than ``<search>`` (the two renormalised,
    temperature 1). In ``hierarchical`` the scripted Leader writes the wave, so every model is
    probed on the same contexts. README's "skip probability" is the mean."""
    import torch

    ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<search>", "<summary>")]
    leader = _EosScripted(tokenizer)
    env = micro_env_fn(tokenizer, workflow, retriever)()
    contexts = []
    for question in _questions(split, per_dataset):
        env.reset(seed=0, options={"question": question})
        observations = observe_awaiting(env)
        if workflow == "hierarchical":
            env.step(leader.act(observations)[0])
            observations = observe_awaiting(env)
        contexts += [list(o.token_ids) for o in observations if o.role == P.SEARCHER]
    probabilities = []
    with torch.no_grad():
        for context in contexts:
            logits = model(torch.tensor([context])).logits[0, -1, ids]
            probabilities.append(torch.softmax(logits.double(), -1)[1].item())
    return probabilities


BUILD_DEFAULTS: dict[str, Any] = {
    "vocab_size": 4096, "hidden_size": 256, "num_layers": 4, "num_heads": 8,
    "episodes_per_dataset": 50, "epochs": 1, "lr": 2e-3, "batch_tokens": 1024,
    "context_weight": 0.5, "only_correct": True, "worlds": (0, 1, 2, 3, 4, 5), "induction": True,
    "lookup": True, "skip_search": 0.6,
}
"""The build's defaults: 1,831 steps over the scripted team's episodes in six synthetic
worlds, each seen once, by a model with the wired copy circuit and lookup heads
(``agents.induction``), about 13 minutes alone on a 2-core CPU, once; the result is cached.

``skip_search``: the imitated team reports without searching on 60% of its Searcher tasks,
so the base under-searches (skip probability 0.58; greedy, it never searches), as untrained
search agents do. Unlearning that is what RL can teach a model this small in a few dozen
updates, and it carries over to new questions (README, "The micro preset, measured"). A
base that imitates the whole team (``skip_search=0``) lacks mostly the lookup skill below,
which a few dozen RL updates on a hundred questions did not teach. At 0.5 the base sat on
the edge (0.551 or 0.434, depending on the data), where greedy decoding flips on noise.
50 questions per style and world (35 before ``skip_search``) keep more whole episodes to
imitate.

What the choices fixed, measured on dev questions of world 0 (teacher-forced NLL of the
answer's first token and greedy Answerer EM, both on 150 Answerer turns of the scripted
team, so on its evidence; greedy team EM on 70 questions, H-MAS / C-MAS):

- 3 worlds, copy circuit: first-token NLL 7.2, Answerer EM 5%, team EM 4% / 4%;
- 3 worlds, copy circuit + lookup heads: 5.9, 19%, 3% / 4%;
- 6 worlds, copy circuit + lookup heads (whole team, 35 per style): 4.8, 27%, 9% / 10%.

- One world, four epochs (an earlier default) memorised world 0: names are recalled as
  n-grams, not copied. Fresh worlds stop the memorising, but without the copy circuit
  nothing is copied either (NLL 6-10 on a name just read, EM 0-4%).
- With the circuit frozen through SFT and a space after each opening tag
  (:func:`spaced_tags`), names in sub-tasks, queries and summaries are copied (NLL
  0.0-0.3). The answer's *first* token still needs a lookup (which name in the evidence
  starts the answer); the lookup heads learn it, and six worlds give them twice the
  fresh names to learn it on (lookup heads in layer 3 instead of 2: 9% / 4%).
- More Answerer turns alone do not teach the lookup: 300 steps on 7,500 Answerer turns of
  two more worlds brought their answer loss from 1.0 to 0.4 by memorising those worlds'
  questions, while the first-token NLL on world 0 rose from 7.2 to 8.7.
"""


def build_micro_base(
    out_dir: str | Path | None = None,
    *,
    episodes_per_dataset: int = BUILD_DEFAULTS["episodes_per_dataset"],
    epochs: int = BUILD_DEFAULTS["epochs"],
    lr: float = BUILD_DEFAULTS["lr"],
    batch_tokens: int = BUILD_DEFAULTS["batch_tokens"],
    context_weight: float = BUILD_DEFAULTS["context_weight"],
    vocab_size: int = BUILD_DEFAULTS["vocab_size"],
    hidden_size: int = BUILD_DEFAULTS["hidden_size"],
    num_layers: int = BUILD_DEFAULTS["num_layers"],
    num_heads: int = BUILD_DEFAULTS["num_heads"],
    only_correct: bool = BUILD_DEFAULTS["only_correct"],
    worlds: Sequence[int] = BUILD_DEFAULTS["worlds"],
    induction: bool = BUILD_DEFAULTS["induction"],
    lookup: bool = BUILD_DEFAULTS["lookup"],
    skip_search: float = BUILD_DEFAULTS["skip_search"],
    retriever: Any = None,
    threads: int | None = None,
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """The micro base model: the scripted team's episodes on ``episodes_per_dataset``
    synthetic train questions per dataset, in both workflows (``MICRO_ENV``), imitated by
    :func:`micro_model` with :func:`algos.sft.sft`. Saved with ``save_pretrained`` (model
    and tokenizer, loadable by ``HFPolicy(path)``) plus ``micro_build.json`` (settings,
    losses, timings) in ``out_dir``, by default ``cache_dir("models", "micro-sft-<key>")``
    keyed by every setting; an existing build there is reused.

    ``only_correct`` keeps the episodes the scripted team answered right (team EM 1):
    imitating its failures would teach the ways it goes wrong (a broken chain, a guessed
    comparison) as if they were right. ``skip_search``: the share of Searcher tasks the
    scripted team reports on without searching; the episodes with such a report are kept
    even when wrong (most are), so the base skips about as often as that team
    (:func:`imitated`). ``context_weight``: the model starts from random weights, so it
    also learns to predict the contexts (prompts, passages, reports) at this weight (see
    :func:`algos.sft.sft_loss`); without it, a few hundred steps teach the tags but not the
    copying of names and questions that valid turns need. ``retriever``: what the scripted
    team searches (default: ``envs.search_team.default_retriever()``, MiniLM over the
    synthetic world); a custom one needs an explicit ``out_dir``. ``threads``: torch's
    intra-op threads during the build (restored after; None leaves torch's default, all
    cores: about 2.5 steps a second on an otherwise idle 2-core machine). On a machine busy
    with something else, 1 is faster: two threads that wait on each other make each step
    several times slower.
    """
    settings = {"vocab_size": vocab_size, "hidden_size": hidden_size, "num_layers": num_layers,
                "num_heads": num_heads, "episodes_per_dataset": episodes_per_dataset,
                "epochs": epochs, "lr": lr, "batch_tokens": batch_tokens,
                "context_weight": context_weight, "only_correct": only_correct,
                "worlds": list(worlds), "induction": induction, "lookup": lookup,
                "skip_search": skip_search, "seed": seed, "env": MICRO_ENV,
                "tied_embeddings": True, "spaced_tags": True,
                "tokenizer": TOKENIZER_VERSION,
                "retriever": None if retriever is None else type(retriever).__name__}
    if not 0 <= skip_search <= 1:
        raise ValueError(f"skip_search must be in [0, 1] (a share of Searcher tasks), got {skip_search}")
    if out_dir is None and retriever is not None:
        raise ValueError("a build with a custom retriever needs an explicit out_dir (the "
                         "default cache directory is keyed for the default retriever)")
    if out_dir is None:
        key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
        out_dir = cache_dir("models") / f"micro-sft-{key}"
    out_dir = Path(out_dir)
    if _is_build(out_dir):
        return out_dir
    with _torch_threads(threads):
        _build(out_dir, settings, retriever, progress)
    return out_dir


def _build(out_dir: Path, settings: dict[str, Any], retriever: Any, progress: bool) -> None:
    from algos.sft import sft

    s = settings
    started, cpu = time.perf_counter(), time.process_time()
    log = _log(progress)
    tokenizer = micro_tokenizer(s["vocab_size"])
    log(f"micro base: collecting scripted episodes ({s['episodes_per_dataset']} per dataset, "
        f"{len(WORKFLOWS)} workflows)")
    episodes = scripted_episodes(tokenizer, s["episodes_per_dataset"], retriever=retriever,
                                 worlds=s["worlds"], seed=s["seed"],
                                 skip_search=s["skip_search"], progress=progress)
    collected = time.perf_counter()
    scripted = {wf: team_stats([ep for ep in episodes if ep.workflow == wf]) for wf in WORKFLOWS}
    kept = imitated(episodes) if s["only_correct"] else episodes
    model = micro_model(tokenizer, s["hidden_size"], s["num_layers"], s["num_heads"],
                        seed=s["seed"], induction=s["induction"], lookup=s["lookup"])
    params = sum(p.numel() for p in model.parameters())
    log(f"micro base: SFT of a {params / 1e6:.1f}M-parameter model on {len(kept)} of "
        f"{len(episodes)} episodes, {s['epochs']} epochs")
    losses = sft(model, kept, epochs=s["epochs"], lr=s["lr"], batch_tokens=s["batch_tokens"],
                 context_weight=s["context_weight"], max_len=MICRO_ENV["max_context_tokens"],
                 seed=s["seed"], progress=progress)  # keeps the wired circuit frozen
    record = {
        "settings": settings, "parameters": params, "episodes": len(episodes),
        "trained_episodes": len(kept), "scripted_train": scripted, "steps": len(losses),
        "losses": losses,
        "seconds": {"collect": round(collected - started, 1),
                    "sft": round(time.perf_counter() - collected, 1),
                    "total": round(time.perf_counter() - started, 1),
                    "cpu": round(time.process_time() - cpu, 1)},
    }
    _save_build(model, tokenizer, record, out_dir)
    log(f"micro base: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {record['seconds']['total']}s; "
        f"saved to {out_dir}")


def _is_build(path: Path) -> bool:
    return ((path / "micro_build.json").exists() and (path / "config.json").exists()
            and (path / "tokenizer.json").exists() and any(path.glob("*.safetensors")))


def _save_build(model: Any, tokenizer: Any, record: dict[str, Any], target: Path) -> None:
    """Model, tokenizer and record into ``target`` at once (a temporary sibling, renamed)."""
    _save_atomically(_Saver([model, tokenizer], {"micro_build.json": record}), target,
                     replace=target.parent == cache_dir("models"))


@contextlib.contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _log(show: bool) -> Any:
    def log(message: str) -> None:
        if show:
            print(message, flush=True)

    return log
