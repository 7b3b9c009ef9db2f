"""Policies by name, for command lines: ``make_policy("scripted")``. The one registry of
policy specs: every command line (``python -m agents``, ``python -m benchmarks run``, the
SB3 Leader's decomposer) builds its policies here.

=============================  ==============================================
spec                           policy
=============================  ==============================================
``scripted``                   :class:`agents.scripted.ScriptedPolicy`
``random`` / ``random:tokens`` :class:`agents.simple.RandomPolicy` (text / token ids)
``human``                      :class:`agents.simple.HumanPolicy` (the terminal)
``hf:<model id or path>``      :class:`agents.hf.HFPolicy` (``hf:smollm2`` offline)
``openai:<model>@<base url>``  :class:`agents.openai_chat.OpenAIPolicy`
``sb3:<path>``                 :class:`agents.sb3_leader.SB3LeaderPolicy` (Leader only)
``python:<module>:<Class>``    your class, constructed without arguments
``leader=...,searcher=...``    a :class:`agents.router.RoleRouter` of the above
=============================  ==============================================

A layer above ``agents`` adds its own kinds with :func:`register_policy` (the benchmarks
add ``ckpt:<run dir>``, a learner's checkpoint), so the table grows in one place.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from agents.router import RoleRouter

ROLES = ("leader", "searcher", "answerer")

PolicyFactory = Callable[..., Any]
"""``factory(arg, *, seed, vocab_size, **hf_kwargs) -> policy``; ``arg`` is the text after
``kind:`` (empty when there is none)."""


def _scripted(arg: str, *, seed: int, **_: Any) -> Any:
    from agents.scripted import ScriptedPolicy

    return ScriptedPolicy(seed=seed)


def _random(arg: str, *, seed: int, vocab_size: int | None = None, **_: Any) -> Any:
    from agents.simple import RandomPolicy

    return RandomPolicy(mode="tokens" if arg == "tokens" else "text", vocab_size=vocab_size, seed=seed)


def _human(arg: str, **_: Any) -> Any:
    from agents.simple import HumanPolicy

    return HumanPolicy()


def _hf(arg: str, *, seed: int, vocab_size: int | None = None, **hf_kwargs: Any) -> Any:
    from agents.hf import HFPolicy

    return HFPolicy(arg or "smollm2", seed=seed, **hf_kwargs)


def _openai(arg: str, **_: Any) -> Any:
    from agents.openai_chat import OpenAIPolicy

    model, _sep, url = arg.partition("@")
    if not model:
        raise ValueError(f"openai policy needs a model: openai:<model>@<base url>, got {arg!r}")
    return OpenAIPolicy(model, **({"base_url": url} if url else {}))


def _sb3(arg: str, *, seed: int, **_: Any) -> Any:
    from agents.sb3_leader import SB3LeaderPolicy

    if not arg:
        raise ValueError("sb3 policy needs a path: sb3:<saved Leader directory or zip>")
    return SB3LeaderPolicy(arg, seed=seed, make_policy=make_policy)


def _python(arg: str, **_: Any) -> Any:
    module, _sep, name = arg.rpartition(":")
    if not module:
        raise ValueError(f"python policy must be python:<module>:<Class>, got python:{arg!r}")
    return getattr(importlib.import_module(module), name)()


POLICY_KINDS: dict[str, PolicyFactory] = {
    "scripted": _scripted,
    "random": _random,
    "human": _human,
    "hf": _hf,
    "openai": _openai,
    "sb3": _sb3,
    "python": _python,
}
"""``kind`` -> factory, for specs ``kind`` or ``kind:<arg>``."""


def register_policy(kind: str, factory: PolicyFactory) -> None:
    """Teach :func:`make_policy` the spec ``kind:<arg>`` (a later registration of the same
    kind replaces the earlier one)."""
    if not kind.isidentifier() or kind in ROLES:
        raise ValueError(f"policy kind {kind!r} must be an identifier other than a role name")
    POLICY_KINDS[kind] = factory


def make_policy(spec: str, *, seed: int = 0, vocab_size: int | None = None, **hf_kwargs: Any) -> Any:
    """A policy from its spec (table above); ``hf_kwargs`` go to HFPolicy. Raises
    ``ValueError`` naming the spec when it is not one of the kinds."""
    spec = spec.strip()
    if "=" in spec:
        routes = {}
        for part in spec.split(","):
            role, _, sub = part.partition("=")
            if role.strip() not in ROLES or not sub:
                raise ValueError(f"bad per-role policy {part!r} in {spec!r}: use leader=...,searcher=...,answerer=...")
            routes[role.strip()] = make_policy(sub, seed=seed, vocab_size=vocab_size, **hf_kwargs)
        return RoleRouter(routes)
    kind, _, arg = spec.partition(":")
    factory = POLICY_KINDS.get(kind)
    if factory is None:
        raise ValueError(f"unknown policy {spec!r}: use one of {', '.join(POLICY_KINDS)} (kind or kind:<arg>), "
                         "or leader=...,searcher=...,answerer=...")
    return factory(arg, seed=seed, vocab_size=vocab_size, **hf_kwargs)
