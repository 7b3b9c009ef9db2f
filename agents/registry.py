"""Policies by name, for command lines: ``make_policy("scripted")``. The one registry of
policy specs: every command line (``python -m agents``, ``python -m benchmarks run``, the
SB3 Leader's decomposer) builds its policies here.

The kinds are the rows of :data:`POLICY_KINDS`, each with its factory, its check and how its
spec is written (``python -m agents play --help`` lists them); ``leader=...,searcher=...``
mixes them per role (:class:`agents.router.RoleRouter`).

An LM kind (``hf``, ``openai``, ``ckpt``) takes sampling settings in a query string,
``hf:smollm2?temperature=0.7&top_p=0.9``, per role too: see :mod:`agents.sampling`.

A layer above ``agents`` adds its own kinds with :func:`register_policy` (the benchmarks
add ``ckpt:<run dir>``, a learner's checkpoint), so the table grows in one place.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.backends import BACKENDS, make_backend
from agents.router import RoleRouter
from agents.sampling import Sampling, parse_sampling, split_query
from envs.protocol import ROLES


def _scripted(arg: str, *, seed: int, **_: Any) -> Any:
    from agents.scripted import ScriptedPolicy

    return ScriptedPolicy(seed=seed)


def _random(arg: str, *, seed: int, vocab_size: int | None = None, **_: Any) -> Any:
    from agents.simple import RandomPolicy

    return RandomPolicy(mode="tokens" if arg == "tokens" else "text", vocab_size=vocab_size, seed=seed)


def _human(arg: str, **_: Any) -> Any:
    from agents.simple import HumanPolicy

    return HumanPolicy()


def _hf(arg: str, *, seed: int, vocab_size: int | None = None, sampling: Sampling | None = None,
        **hf_kwargs: Any) -> Any:
    from agents.hf import hf_policy

    return hf_policy(arg or "smollm2", sampling=sampling, seed=seed, **hf_kwargs)


def _openai(arg: str, *, sampling: Sampling | None = None, **_: Any) -> Any:
    from agents.openai_chat import OpenAIPolicy

    _check_openai(arg)
    arg, markers = _openai_markers(arg)
    model, _sep, url = arg.partition("@")
    sampling = sampling or Sampling()  # unset: OpenAIPolicy's own defaults (the server cannot be asked)
    settings = {"temperature": sampling.temperature, "top_p": sampling.top_p, "max_tokens": sampling.max_new_tokens}
    return OpenAIPolicy(model, **({"base_url": url} if url else {}), markers=markers,
                        **{k: v for k, v in settings.items() if v is not None})


OPENAI_OPTIONS = ("markers",)
"""Keys an ``openai:`` spec's query takes besides the sampling settings:
``markers=[A]|[B]``, the spelled markers of the server's chat template that the built-in
list (``envs.chat.SPELLED_MARKERS``) lacks, ``|``-separated, each percent-decoded
(``%7C`` for a ``|``); each must pass ``envs.chat.check_marker``."""


def _openai_markers(arg: str) -> tuple[str, tuple[str, ...]]:
    """``(arg without its ?markers=..., the markers)`` of an ``openai:`` arg (``_split``
    keeps the option there); one-line ``ValueError`` naming the spec for a bad marker."""
    from urllib.parse import unquote

    from envs.chat import check_marker

    head, sep, option = arg.partition("?")
    if not sep:
        return arg, ()
    value = option.partition("=")[2]
    if not value:
        raise ValueError(f"openai:{head}: markers needs a value, markers=[A]|[B]")
    return head, tuple(check_marker(unquote(m), f"openai:{head}: markers") for m in value.split("|"))


def _sb3(arg: str, *, seed: int, **_: Any) -> Any:
    from agents.sb3_leader import SB3LeaderPolicy

    if not arg:
        raise ValueError("sb3 policy needs a path: sb3:<saved Leader directory (leader.safetensors + leader.json)>")
    return SB3LeaderPolicy(arg, seed=seed, make_policy=make_policy)


def _python(arg: str, **_: Any) -> Any:
    _check_python(arg)
    module, _sep, name = arg.rpartition(":")
    return getattr(importlib.import_module(module), name)()


def _check_hf(arg: str) -> None:
    from envs.data.qa import hub_offline
    from envs.tokenizer import SMOLLM2_ALIASES

    name = arg or "smollm2"
    if name.lower() in SMOLLM2_ALIASES or Path(name).expanduser().exists():
        return
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or name.endswith("/"):
        raise ValueError(f"hf:{name}: no such model directory")
    if hub_offline():
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "config.json"), str):
            raise ValueError(f"hf:{name}: not a local path, and the hub is offline (HF_HUB_OFFLINE) "
                             "with no cached copy; give a model directory, or hf:smollm2 offline")


def _check_openai(arg: str) -> None:
    arg, _markers = _openai_markers(arg)
    if not arg.partition("@")[0]:
        raise ValueError(f"openai:{arg}: needs a model, openai:<model>@<base url>")


def _check_sb3(arg: str) -> None:
    if not arg:
        raise ValueError("sb3: needs a path, sb3:<saved Leader directory (leader.safetensors + leader.json)>")
    if not Path(arg).exists():
        raise ValueError(f"sb3:{arg}: no such file or directory (train a Leader with "
                         "`python -m algos train-leader-sb3 --out DIR`)")


def _check_python(arg: str) -> None:
    module, _sep, name = arg.rpartition(":")
    if not module or not name:
        raise ValueError(f"python:{arg}: must be python:<module>:<Class>")
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        found = False
    if not found:
        raise ValueError(f"python:{arg}: no module {module!r} on the path (run from the folder that "
                         f"holds {module.replace('.', '/')}.py)")


@dataclass(frozen=True)
class PolicyKind:
    """One row of the table of policy kinds, :data:`POLICY_KINDS`."""

    factory: Callable[..., Any]
    """``factory(arg, *, seed, vocab_size, **hf_kwargs) -> policy``; ``arg`` is the text after
    ``kind:`` (empty when there is none, without the ``?`` query). A kind that samples gets
    ``sampling=`` too, an :class:`agents.sampling.Sampling`."""
    usage: str
    """How a spec of the kind is written (``hf:<model>``): every command line's help lists these."""
    check: Callable[[str], None] | None = None
    """``check(arg)`` raises ``ValueError`` with one line (naming ``kind:arg``) when the policy
    cannot be built here; it loads nothing and reaches no network (None: the kind always passes)."""
    samples: bool = False
    """The factory takes ``sampling=`` and the kind's specs may carry a ``?`` query."""


POLICY_KINDS: dict[str, PolicyKind] = {
    "scripted": PolicyKind(_scripted, "scripted"),
    "random": PolicyKind(_random, "random"),
    "human": PolicyKind(_human, "human"),
    "hf": PolicyKind(_hf, "hf:<model>", _check_hf, samples=True),
    "openai": PolicyKind(_openai, "openai:<model>@<url>", _check_openai, samples=True),
    "sb3": PolicyKind(_sb3, "sb3:<path>", _check_sb3),
    "python": PolicyKind(_python, "python:<module>:<Class>", _check_python),
}
"""``kind`` -> its row, for specs ``kind`` or ``kind:<arg>``; :func:`register_policy` adds a row."""


def register_policy(kind: str, factory: Callable[..., Any],
                    check: Callable[[str], None] | None = None, *, samples: bool = False,
                    usage: str | None = None) -> None:
    """Teach :func:`make_policy` the spec ``kind:<arg>``, and :func:`check_policy` its
    ``check`` (a later registration of the same kind replaces the earlier one); ``samples``
    and ``usage`` (default ``kind:<arg>``) as :class:`PolicyKind`'s."""
    if not kind.isidentifier() or kind in ROLES:
        raise ValueError(f"policy kind {kind!r} must be an identifier other than a role name")
    POLICY_KINDS[kind] = PolicyKind(factory, usage or f"{kind}:<arg>", check, samples)


def policy_usage() -> str:
    """The kinds as a command line's help lists them, per-role specs last."""
    return ", ".join(k.usage for k in POLICY_KINDS.values()) + ", or per role leader=...,searcher=...,answerer=..."


def _split(spec: str) -> list[tuple[str | None, str, str, Sampling]]:
    """``[(role or None, kind, arg, sampling)]`` of a spec; ``ValueError`` naming a bad part
    (an unknown kind, a bad per-role part, a bad sampling query)."""
    spec = spec.strip()
    if "," not in spec and "=" not in split_query(spec)[0]:
        parts: list[tuple[str | None, str]] = [(None, spec)]
    else:
        parts = []
        for part in spec.split(","):
            role, _, sub = part.partition("=")
            if role.strip() not in ROLES or not sub.strip() or "=" in split_query(sub)[0]:
                raise ValueError(f"bad per-role policy {part!r} in {spec!r}: use leader=...,searcher=...,answerer=...")
            parts.append((role.strip(), sub.strip()))
    out = []
    for role, sub in parts:
        head, query = split_query(sub)
        kind, _, arg = head.partition(":")
        if kind not in POLICY_KINDS:
            raise ValueError(f"unknown policy {sub!r}: use one of {', '.join(POLICY_KINDS)} (kind or kind:<arg>), "
                             "or leader=...,searcher=...,answerer=...")
        if query is not None and not POLICY_KINDS[kind].samples:
            raise ValueError(f"{sub}: a {kind} policy takes no sampling settings (only "
                             f"{', '.join(k for k, row in POLICY_KINDS.items() if row.samples)} do)")
        if kind == "openai" and query is not None:  # its own options stay with its arg
            pairs = query.split("&")
            options = [p for p in pairs if p.partition("=")[0] in OPENAI_OPTIONS]
            if len(options) > 1:
                raise ValueError(f"{sub}: markers is given twice")
            arg += "".join(f"?{o}" for o in options)
            query = "&".join(p for p in pairs if p not in options) if len(options) < len(pairs) else None
        out.append((role, kind, arg, parse_sampling(query, sub)))
    return out


def check_policy(spec: str) -> None:
    """Raise ``ValueError`` with one line when ``spec`` names no policy this machine can
    build: an unknown kind, a malformed per-role spec, or a kind whose check fails (a
    ``ckpt:`` run without a checkpoint, an ``hf:`` id while the hub is offline, ...).
    Loads no model and reaches no network, so a command runs it before it creates its
    output folder; a spec that passes may still fail to load."""
    for _role, kind, arg, _sampling in _split(spec):
        check = POLICY_KINDS[kind].check
        if check is not None:
            check(arg)


def make_policy(spec: str, *, seed: int = 0, vocab_size: int | None = None, sampling: Sampling | None = None,
                **hf_kwargs: Any) -> Any:
    """A policy from its spec (table above); ``hf_kwargs`` go to HFPolicy. ``sampling``: the
    command line's settings, for the LM kinds whose spec does not set them. Raises
    ``ValueError`` naming the spec when it is not one of the kinds."""
    parts = _split(spec)
    built = [(role, POLICY_KINDS[kind].factory(arg, seed=seed, vocab_size=vocab_size, **hf_kwargs,
                                               **({"sampling": own.over(sampling)} if POLICY_KINDS[kind].samples
                                                  else {})))
             for role, kind, arg, own in parts]
    if parts[0][0] is None:
        return built[0][1]
    return RoleRouter({role: policy for role, policy in built})


ROLLOUT_BACKENDS = tuple(BACKENDS)
"""The ``rollout_backend`` values: the rows of ``agents.backends.BACKENDS``."""


def make_rollout_policy(backend: str, model: Any, tokenizer: Any, **sampling: Any) -> Any:
    """A learner's rollout backend: :func:`agents.backends.make_backend` (the table of
    ``rollout_backend`` values, what ``model`` is for each, and their settings)."""
    return make_backend(backend, model, tokenizer, **sampling)
