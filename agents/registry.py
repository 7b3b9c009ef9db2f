"""Policies by name, for command lines: ``make_policy("scripted")``.

=============================  ==============================================
spec                           policy
=============================  ==============================================
``scripted``                   :class:`agents.scripted.ScriptedPolicy`
``random`` / ``random:tokens`` :class:`agents.simple.RandomPolicy` (text / token ids)
``human``                      :class:`agents.simple.HumanPolicy` (the terminal)
``hf:<model id or path>``      :class:`agents.hf.HFPolicy` (``hf:smollm2`` offline)
``openai:<model>@<base url>``  :class:`agents.openai_chat.OpenAIPolicy`
``python:<module>:<Class>``    your class, constructed without arguments
``leader=...,searcher=...``    a :class:`agents.router.RoleRouter` of the above
=============================  ==============================================
"""

from __future__ import annotations

import importlib
from typing import Any

from agents.router import RoleRouter


def make_policy(spec: str, *, seed: int = 0, vocab_size: int | None = None, **hf_kwargs: Any) -> Any:
    """A policy from its spec (table above); ``hf_kwargs`` go to HFPolicy."""
    spec = spec.strip()
    if "=" in spec:
        routes = {}
        for part in spec.split(","):
            role, _, sub = part.partition("=")
            if role.strip() not in ("leader", "searcher", "answerer") or not sub:
                raise ValueError(f"bad per-role policy {part!r} in {spec!r}: use leader=...,searcher=...,answerer=...")
            routes[role.strip()] = make_policy(sub, seed=seed, vocab_size=vocab_size, **hf_kwargs)
        return RoleRouter(routes)
    kind, _, arg = spec.partition(":")
    if kind == "scripted":
        from agents.scripted import ScriptedPolicy

        return ScriptedPolicy(seed=seed)
    if kind == "random":
        from agents.simple import RandomPolicy

        return RandomPolicy(mode="tokens" if arg == "tokens" else "text", vocab_size=vocab_size, seed=seed)
    if kind == "human":
        from agents.simple import HumanPolicy

        return HumanPolicy()
    if kind == "hf":
        from agents.hf import HFPolicy

        return HFPolicy(arg or "smollm2", seed=seed, **hf_kwargs)
    if kind == "openai":
        from agents.openai_chat import OpenAIPolicy

        model, _, url = arg.partition("@")
        if not model:
            raise ValueError(f"openai policy needs a model: openai:<model>@<base url>, got {spec!r}")
        return OpenAIPolicy(model, **({"base_url": url} if url else {}))
    if kind == "python":
        module, _, name = arg.rpartition(":")
        if not module:
            raise ValueError(f"python policy must be python:<module>:<Class>, got {spec!r}")
        return getattr(importlib.import_module(module), name)()
    raise ValueError(
        f"unknown policy {spec!r}: use scripted, random, human, hf:<model>, openai:<model>@<url>, "
        "python:<module>:<Class>, or leader=...,searcher=...,answerer=..."
    )
