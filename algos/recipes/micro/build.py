"""The micro base model: the scripted team's episodes imitated by a wired micro model with
:func:`algos.sft.sft`, built once and cached (about 13 minutes on a 2-core CPU).

>>> path = build_micro_base()       # cached after the first build  # doctest: +SKIP
>>> policy = HFPolicy(str(path), temperature=0)                      # doctest: +SKIP
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from algos.recipes.cache import build_dir, save_base
from algos.recipes.micro.episodes import (
    WORKFLOWS,
    fact_rows,
    imitated,
    recalled_right,
    scripted_episodes,
)
from algos.recipes.micro.measure import team_stats
from algos.recipes.micro.model import micro_model
from algos.recipes.micro.settings import ENV, FACTS_BUILD, SEARCH_SKIP
from algos.recipes.micro.tokenizer import (
    TOKENIZER_VERSION,
    micro_tokenizer,
    synthetic_world,
    tokenizer_fingerprint,
)
from algos.reproducible import current_threads, run_threads, weight_hash

BUILD_DEFAULTS: dict[str, Any] = {
    "vocab_size": 4096, "hidden_size": 256, "num_layers": 4, "num_heads": 8,
    "episodes_per_dataset": 50, "epochs": 1, "lr": 2e-3, "batch_tokens": 1024,
    "context_weight": 0.5, "only_correct": True, "worlds": (0, 1, 2, 3, 4, 5), "induction": True,
    "lookup": True, "skip_search": 0.6, "facts": 0, "recall": False, "known_worlds": None,
    "skip_known": None, "recall_practice": 0,
}
"""The build's defaults: 1,831 steps over the scripted team's episodes in six synthetic
worlds, each seen once, by a model with the wired copy circuit and lookup heads
(:mod:`algos.recipes.micro.circuit`). ``skip_search``: the imitated team reports without
searching on 60% of its Searcher tasks, so the base under-searches, as untrained search
agents do, and RL has that to unlearn (why 0.6 and not 0.5: ``docs/micro.md``, "Tuning the
preset").

``facts`` and ``recall`` (off by default; issue 30's closed-book path): ``facts`` mixes each
world's geography sentences into the SFT that many times (:func:`~algos.recipes.micro.episodes.fact_rows`:
what a real LM knows without searching), and with ``recall`` the imitated team's Searchers
that skip the search state the fact they know on a one-hop task (``ScriptedPolicy(memory=...)``).
``known_worlds``: the worlds whose geography the base learns and recalls (None: all of
``worlds``); ``skip_known``: the share of the tasks it knows the answer to that the imitated
team skips the search on (None: ``skip_search``); ``recall_practice``: that many further
training questions per dataset of each known world (after the first ``episodes_per_dataset``)
played by the team recalling every task it knows and searching the rest, the episodes where
a recalled fact led to a right answer joining the SFT (:func:`~algos.recipes.micro.episodes.recalled_right`).

What the other choices fixed: ``README.md`` in this folder.
"""

SOURCES = ("agents.reading", "agents.scripted", "agents.collect", "agents.models", "agents.logprobs",
           "envs.protocol", "envs.chat", "envs.team",
           "envs.observation", "envs.turns", "envs.data.synthwiki", "envs.data.synthwiki.names",
           "envs.data.synthwiki.world", "envs.data.synthwiki.render",
           "envs.data.synthwiki.questions", "envs.retrieval.dense", "algos.sft",
           "algos.engine.freeze", "algos.batch", "algos.recipes.micro.episodes",
           "algos.recipes.micro.circuit", "algos.recipes.micro.model",
           "algos.recipes.micro.tokenizer", "algos.recipes.micro.build")
"""The modules whose code decides the base's weights (the scripted team's play, the env's
words, the synthetic world, the retriever, the model and its SFT). Their fingerprints are
recorded in ``micro_build.json``; a cached base made by other code is reused with a warning
that names the modules that changed (not rebuilt: any edit, a comment too, would cost a
13-minute build)."""

BUILD_VERSION = 2
"""Bumped when the build's code changes what it makes from the same settings (2: the thread
count, torch and transformers versions and the CPU's kernel set joined the cache key)."""


def build_micro_base(out_dir: str | Path | None = None, *, retriever: Any = None,
                     threads: int | None = None, seed: int = 0, progress: bool = True,
                     build: bool = True, **options: Any) -> Path:
    """The micro base model: the scripted team's episodes on ``episodes_per_dataset``
    synthetic train questions per dataset, in both workflows, imitated by :func:`micro_model`
    with :func:`algos.sft.sft`; ``options`` override :data:`BUILD_DEFAULTS`. Saved (with
    ``micro_build.json``: settings, losses, timings, the weights' hash) in ``out_dir``, by
    default a cache folder keyed by every setting (:func:`arithmetic`'s included); an existing
    build there is reused, and ``build=False`` only finds one (``FileNotFoundError``).

    ``only_correct`` keeps the episodes the scripted team answered right, and those with a
    skipped search (:func:`imitated`). ``context_weight``: the model starts from random
    weights, so it also learns to predict the contexts (without it, a few hundred steps teach
    the tags but not the copying of names). ``retriever`` (default: MiniLM over the synthetic
    world): a custom one needs an explicit ``out_dir``."""
    unknown = sorted(set(options) - set(BUILD_DEFAULTS))
    if unknown:
        raise ValueError(f"build_micro_base: unknown options {unknown}; "
                         f"known: {sorted(BUILD_DEFAULTS)}")
    o = {**BUILD_DEFAULTS, **options}
    worlds, facts, recall, skip_search, skip_known, recall_practice = (o[k] for k in (
        "worlds", "facts", "recall", "skip_search", "skip_known", "recall_practice"))
    settings = {**{k: o[k] for k in ("vocab_size", "hidden_size", "num_layers", "num_heads",
                                     "episodes_per_dataset", "epochs", "lr", "batch_tokens",
                                     "context_weight", "only_correct")},
                "worlds": list(worlds), "induction": o["induction"], "lookup": o["lookup"],
                "skip_search": skip_search, "seed": seed, "env": ENV,
                "tied_embeddings": True, "spaced_tags": True,
                "tokenizer": TOKENIZER_VERSION,
                "tokenizer_fingerprint": tokenizer_fingerprint(o["vocab_size"]),
                "retriever": None if retriever is None else type(retriever).__name__,
                **arithmetic(current_threads() if threads is None else threads)}
    # in the cache key only when set, so that the bases built before they existed keep theirs
    known = None if o["known_worlds"] is None else sorted(set(o["known_worlds"]))
    settings.update({k: v for k, v in (("facts", facts), ("recall", recall), ("known_worlds", known),
                                       ("skip_known", skip_known), ("recall_practice", recall_practice))
                     if v != BUILD_DEFAULTS[k]})
    if isinstance(facts, bool) or not isinstance(facts, int) or facts < 0:
        raise ValueError(f"facts must be an integer >= 0 (passes over the geography sentences), got {facts!r}")
    if not 0 <= skip_search <= 1:
        raise ValueError(f"skip_search must be in [0, 1] (a share of Searcher tasks), got {skip_search}")
    if skip_known is not None and not 0 <= skip_known <= 1:
        raise ValueError(f"skip_known must be in [0, 1] (a share of the tasks the base knows), got {skip_known}")
    if isinstance(recall_practice, bool) or not isinstance(recall_practice, int) or recall_practice < 0:
        raise ValueError(f"recall_practice must be an integer >= 0 (questions per dataset), got {recall_practice!r}")
    if recall_practice and not recall:
        raise ValueError("recall_practice needs recall=True (it practises recalling what the base knows)")
    if known is not None and not set(known) <= set(worlds):
        raise ValueError(f"known_worlds {known} must be among the worlds {list(worlds)}")
    if out_dir is None and retriever is not None:
        raise ValueError("a build with a custom retriever needs an explicit out_dir (the "
                         "default cache directory is keyed for the default retriever)")
    if out_dir is None:
        out_dir = build_dir("micro-sft", settings)
    out_dir = Path(out_dir)
    if _is_build(out_dir):
        _declare_frozen_circuit(out_dir)
        _warn_if_other_code(out_dir)
        return out_dir
    if not build:
        raise FileNotFoundError(f"no micro base built at {out_dir} for these settings "
                                "(python -m algos sft --preset micro builds it, about 13 minutes)")
    with run_threads(settings["threads"]):
        _build(out_dir, settings, retriever, progress)
    return out_dir


def build_searching_base(out_dir: str | Path | None = None, **options: Any) -> Path:
    """The ``micro_search`` preset's base: :func:`build_micro_base` with ``skip_search`` at
    :data:`~algos.recipes.micro.settings.SEARCH_SKIP` unless ``options`` say otherwise (the
    same cache entry as ``python -m algos sft --preset micro --skip-search 0.25``)."""
    return build_micro_base(out_dir, **{"skip_search": SEARCH_SKIP, **options})


def build_closed_book_base(out_dir: str | Path | None = None, **options: Any) -> Path:
    """The ``micro_facts`` preset's base: :func:`build_micro_base` with
    :data:`~algos.recipes.micro.settings.FACTS_BUILD` unless ``options`` say otherwise (the
    same cache entry as ``python -m algos sft --preset micro`` with those settings)."""
    return build_micro_base(out_dir, **{**FACTS_BUILD, **options})


def fresh_micro_model() -> tuple[Any, Any]:
    """``(model, tokenizer)``: a fresh micro model wired like the base, for SFT on episodes
    collected with the micro tokenizer (``python -m algos sft --model micro``)."""
    tokenizer = micro_tokenizer()
    return micro_model(tokenizer, induction=BUILD_DEFAULTS["induction"], lookup=BUILD_DEFAULTS["lookup"]), tokenizer


def arithmetic(threads: int) -> dict[str, Any]:
    """What besides the settings decides the floating-point results of a build, and so its
    weights: the thread count, the torch and transformers versions (kernels, initialisers)
    and the CPU kernel set torch dispatches to (``AVX512``, ``AVX2``, ...)."""
    import torch
    import transformers

    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    return {"threads": threads, "torch": torch.__version__,
            "transformers": transformers.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "build": BUILD_VERSION}


def _build(out_dir: Path, settings: dict[str, Any], retriever: Any, progress: bool) -> None:
    from algos.sft import sft

    s = settings
    started, cpu = time.perf_counter(), time.process_time()
    log = functools.partial(print, flush=True) if progress else lambda message: None
    tokenizer = micro_tokenizer(s["vocab_size"])
    log(f"micro base: collecting scripted episodes ({s['episodes_per_dataset']} per dataset, "
        f"{len(WORKFLOWS)} workflows)")
    episodes = scripted_episodes(tokenizer, s["episodes_per_dataset"], retriever=retriever,
                                 worlds=s["worlds"], seed=s["seed"],
                                 skip_search=s["skip_search"], recall=s.get("recall", False),
                                 known_worlds=s.get("known_worlds"), skip_known=s.get("skip_known"),
                                 progress=progress)
    collected = time.perf_counter()
    scripted = {wf: team_stats([ep for ep in episodes if ep.workflow == wf]) for wf in WORKFLOWS}
    known = s["worlds"] if s.get("known_worlds") is None else s["known_worlds"]
    recalled = ([f for w in known for f in synthetic_world(w).geography().values()]
                if s.get("recall") else ())
    kept = imitated(episodes, recalled) if s["only_correct"] else episodes
    practised = []
    if s.get("recall_practice"):  # every known task recalled, the rest searched
        practice = scripted_episodes(tokenizer, s["recall_practice"], retriever=retriever, worlds=known,
                                     seed=s["seed"], recall=True, skip_known=1.0,
                                     start=s["episodes_per_dataset"], progress=progress)
        practised = recalled_right(practice, recalled)
    facts = fact_rows(tokenizer, known, s.get("facts", 0))
    model = micro_model(tokenizer, s["hidden_size"], s["num_layers"], s["num_heads"],
                        seed=s["seed"], induction=s["induction"], lookup=s["lookup"])
    params = sum(p.numel() for p in model.parameters())
    log(f"micro base: SFT of a {params / 1e6:.1f}M-parameter model on {len(kept)} of "
        f"{len(episodes)} episodes{f' and {len(practised)} of closed-book practice' if practised else ''}"
        f"{f' and {len(facts)} fact rows' if facts else ''}, {s['epochs']} epochs")
    losses = sft(model, [*kept, *practised], epochs=s["epochs"], lr=s["lr"], batch_tokens=s["batch_tokens"],
                 context_weight=s["context_weight"], max_len=ENV["max_context_tokens"],
                 rows=facts, seed=s["seed"], progress=progress)  # keeps the wired circuit frozen
    record = {
        "settings": settings, "sources": source_fingerprints(), "parameters": params, "episodes": len(episodes),
        "trained_episodes": len(kept), "practised_episodes": len(practised), "fact_rows": len(facts),
        "scripted_train": scripted, "steps": len(losses), "losses": losses,
        "seconds": {"collect": round(collected - started, 1),
                    "sft": round(time.perf_counter() - collected, 1),
                    "total": round(time.perf_counter() - started, 1),
                    "cpu": round(time.process_time() - cpu, 1)},
    }
    _save_build(model, tokenizer, record, out_dir)
    log(f"micro base: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {record['seconds']['total']}s; "
        f"saved to {out_dir}")
    built = json.loads((out_dir / "micro_build.json").read_text())
    log(f"micro base: weights {built['weight_hash']} (seed {s['seed']}, {s['threads']} "
        f"thread{'s' if s['threads'] != 1 else ''})")


def source_fingerprints() -> dict[str, str]:
    """``{module: sha256 of its source file, 12 hex digits}`` for :data:`SOURCES`."""
    import importlib.util

    prints = {}
    for name in SOURCES:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        prints[name] = (hashlib.sha256(Path(origin).read_bytes()).hexdigest()[:12]
                        if origin and Path(origin).is_file() else "missing")
    return prints


def _warn_if_other_code(path: Path) -> None:
    """One line on stderr when the cached base at ``path`` was built by other code than
    this (a record without fingerprints, from before they were kept, says nothing)."""
    import sys

    try:
        built = json.loads((path / "micro_build.json").read_text()).get("sources")
    except (ValueError, UnicodeDecodeError, AttributeError):
        built = None
    if not isinstance(built, dict):
        return
    now = source_fingerprints()
    changed = sorted(name for name in now if built.get(name) != now[name])
    if changed:
        print(f"micro base {path}: built by other code ({', '.join(changed)} changed since); "
              "reused as it is; a fresh build may differ (the weights' hash tells): remove the folder to rebuild",
              file=sys.stderr, flush=True)


def _is_build(path: Path) -> bool:
    return ((path / "micro_build.json").exists() and (path / "config.json").exists()
            and (path / "tokenizer.json").exists() and any(path.glob("*.safetensors")))


def _declare_frozen_circuit(path: Path) -> None:
    """A base built before models declared their frozen parameters has the circuit's layout
    (``induction``) in its config but no ``mopd_frozen``: write the declaration in, so RL
    keeps the circuit frozen as it did then. The weights are not touched."""
    from types import SimpleNamespace

    from algos.engine.freeze import FROZEN_KEY
    from algos.recipes.micro.circuit import frozen_entries

    config_path = path / "config.json"
    config = json.loads(config_path.read_text())
    if not config.get("induction") or FROZEN_KEY in config:
        return
    config[FROZEN_KEY] = frozen_entries(SimpleNamespace(**config))
    tmp = config_path.with_name(config_path.name + ".tmp")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, config_path)


def _save_build(model: Any, tokenizer: Any, record: dict[str, Any], target: Path) -> None:
    """Model, tokenizer and record into ``target`` at once; the record gains the weights' hash."""
    def with_hash(saved: Path) -> dict[str, Any]:  # the weights as written, so as loaded
        return {"settings": record["settings"], "weight_hash": weight_hash(saved),
                **{k: v for k, v in record.items() if k != "settings"}}

    save_base(model, tokenizer, {"micro_build.json": with_hash}, target)

