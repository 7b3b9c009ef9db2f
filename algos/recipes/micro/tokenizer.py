"""The micro tokenizer: a small byte-level BPE fitted to the synthetic world and the turn
protocol, with a ChatML template, trained once and cached.

Why: on a CPU most of a tiny model's cost is its output layer, so a 49k vocabulary makes
even a 16M-parameter model slow (DESIGN.md, "What things cost"). A 4k vocabulary trained
on the text the env actually shows (passages, questions, prompts, tags) keeps contexts
short and the output layer cheap, and the env takes any tokenizer, so nothing else changes.

>>> tok = micro_tokenizer()      # trained on first use, then loaded from the cache  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envs import protocol as P
from envs.paths import cache_dir
from envs.quiet import quiet_progress

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

TOKENIZER_VERSION = 1
"""Bumped whenever the way the tokenizer is trained changes (cached ones are then retrained)."""

PROTOCOL_WEIGHT = 200
"""How many times the protocol text counts against the world's text when the BPE is fitted
(an episode shows the prompts once per agent, so they are far more frequent than any one
passage)."""


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


def synthetic_world(seed: int) -> Any:
    """The synthetic world of ``seed``: 0 is ``default_world()`` (built once per process)."""
    from envs.data.synthwiki import build_world, default_world

    return default_world() if seed == 0 else build_world(seed)


def _world_texts(seed: int) -> list[str]:
    """The synthetic world's passages (as the env renders them), questions and answers."""
    from envs.data.qa import DATASETS
    from envs.data.synthwiki import SPLITS

    world = synthetic_world(seed)
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
    """A byte-level BPE of ``vocab_size`` tokens (:data:`SPECIAL_TOKENS` and the tags
    included) fitted to the synthetic world of ``seed`` and the protocol text, with a ChatML
    template; deterministic, and every string round-trips (``decode(encode(s)) == s``)."""
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
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(PROTOCOL_TOKENS),
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=2, show_progress=False)
    bpe.train_from_iterator(texts, trainer)
    bpe.add_tokens([AddedToken(t, normalized=False, special=False) for t in PROTOCOL_TOKENS])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token=PAD, eos_token=IM_END,
                                  additional_special_tokens=[IM_START],
                                  clean_up_tokenization_spaces=False)
    tok.chat_template = CHATML_TEMPLATE
    return tok


def tokenizer_fingerprint(vocab_size: int, seed: int = 0) -> str:
    """What a cached tokenizer was trained from; a mismatch (the protocol text changed,
    say) retrains it."""
    inputs = [TOKENIZER_VERSION, vocab_size, seed, PROTOCOL_WEIGHT, SPECIAL_TOKENS,
              PROTOCOL_TOKENS, _protocol_texts()]
    return hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:16]


def micro_tokenizer(vocab_size: int = 4096, seed: int = 0) -> Any:
    """:func:`train_micro_tokenizer`'s tokenizer, trained once and cached (retrained when
    :func:`tokenizer_fingerprint` changes)."""
    from transformers import PreTrainedTokenizerFast

    path = cache_dir("tokenizers", f"micro-{vocab_size}-seed{seed}")
    fingerprint = tokenizer_fingerprint(vocab_size, seed)
    stamp = path / "micro_tokenizer.json"
    if not (path / "tokenizer.json").exists() or not stamp.exists() or \
            json.loads(stamp.read_text()).get("fingerprint") != fingerprint:
        tok = train_micro_tokenizer(vocab_size, seed)
        save_atomically(Saver([tok], {"micro_tokenizer.json": {"fingerprint": fingerprint}}),
                         path, replace=True)
    return PreTrainedTokenizerFast.from_pretrained(path)


class Saver:
    """Saves objects with ``save_pretrained`` and JSON records, into one directory. A record
    may be a function of that directory, called once the objects are in it (a record that
    describes what was saved, such as a hash of the weights)."""

    def __init__(self, objects: Sequence[Any], records: dict[str, Any]):
        self.objects, self.records = list(objects), records

    def save_pretrained(self, path: Path) -> None:
        for obj in self.objects:
            with quiet_progress():
                obj.save_pretrained(path)
        for name, record in self.records.items():
            if callable(record):
                record = record(Path(path))
            (Path(path) / name).write_text(json.dumps(record, indent=1) + "\n")


def save_atomically(saver: Any, target: Path, *, replace: bool = False) -> None:
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
