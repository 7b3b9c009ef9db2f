"""SB3LeaderPolicy: a Leader trained with stable-baselines3 on the macro-action view
(``envs.leader_view``), playing in any SearchTeam episode through the usual ``act``.

It reads each Leader observation's ``info`` the way :class:`envs.leader_view.LeaderMacroEnv` did in
training (the same :class:`~envs.leader_view.LeaderMacro` code), asks its model for a
macro-action, and writes the protocol text: ``<subtask>...</subtask>`` x n on the
decomposition policy's sub-tasks, or ``<select>...</select>``. It plays the Leader only;
route the other roles elsewhere (``leader=sb3:runs/sb3_leader,searcher=scripted,...``).

A saved Leader is two files side by side: ``leader.zip`` (the SB3 model) and
``leader.json`` (the algorithm, the feature names and scales, the decomposition policy).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agents.base import Observation
from envs import protocol as P
from envs.leader_view import FEATURES, LeaderMacro, Proposal, turn_text

MODEL_FILE, META_FILE = "leader.zip", "leader.json"
ALGOS = ("ppo", "a2c", "dqn")


def algo_class(name: str) -> Any:
    """The stable-baselines3 class of ``ppo``, ``a2c`` or ``dqn``."""
    import stable_baselines3

    if name not in ALGOS:
        raise ValueError(f"algo must be one of {ALGOS}, got {name!r}")
    return getattr(stable_baselines3, name.upper())


def leader_files(path: str | Path) -> tuple[Path, Path]:
    """``(model zip, metadata json)`` of a saved Leader: its directory or its zip."""
    path = Path(path)
    if path.is_dir():
        return path / MODEL_FILE, path / META_FILE
    return path, path.with_suffix(".json")


def make_decomposer(spec: str, seed: int = 0, make_policy: Callable[..., Any] | None = None) -> Any:
    """The decomposition policy a Leader was trained with: ``scripted``, or any registry
    spec built by ``make_policy`` (``agents.registry.make_policy``, passed in so that this
    module does not import the registry that imports it)."""
    if spec == "scripted":
        from agents.scripted import ScriptedPolicy

        return ScriptedPolicy(seed=seed)
    if make_policy is None:
        raise ValueError(f"decomposer {spec!r} is not 'scripted': pass make_policy="
                         "agents.registry.make_policy to build it")
    return make_policy(spec, seed=seed)


class SB3LeaderPolicy:
    """A stable-baselines3 Leader; ``act`` takes Leader observations only.

    Args:
        path: the run directory (``leader.zip`` + ``leader.json``) or the model zip.
        deterministic: take the model's most likely macro-action (else sample).
        seed: the decomposition policy's seed.
        make_policy: builds a decomposition policy that is not ``scripted`` from its spec
            (``agents.registry.make_policy``; the registry passes itself).
    """

    def __init__(self, path: str | Path, *, deterministic: bool = True, seed: int = 0,
                 make_policy: Callable[..., Any] | None = None):
        model_path, meta_path = leader_files(path)
        if not model_path.exists() or not meta_path.exists():
            raise FileNotFoundError(f"no SB3 Leader at {path}: need {model_path} and {meta_path} "
                                    "(train one with python -m algos train-leader-sb3)")
        self.meta = json.loads(meta_path.read_text())
        if tuple(self.meta.get("features", ())) != FEATURES:
            raise ValueError(f"{meta_path} was trained on features {self.meta.get('features')}, "
                             f"this code computes {list(FEATURES)}: retrain the Leader")
        self.model = algo_class(self.meta["algo"]).load(str(model_path), device="cpu")
        self.macro = LeaderMacro(self.meta["max_waves"], self.meta["max_searchers"],
                                 self.meta["max_context_tokens"])
        self.decomposer = make_decomposer(self.meta.get("decompose", "scripted"), seed, make_policy)
        self.deterministic = deterministic

    def act(self, observations: Sequence[Observation]) -> list[str]:
        if not observations:
            return []
        wrong = [o.agent for o in observations if o.role != P.LEADER]
        if wrong:
            raise ValueError(f"SB3LeaderPolicy plays the Leader only, got {wrong}; route other roles "
                             "elsewhere, e.g. leader=sb3:<path>,searcher=scripted,answerer=scripted")
        proposals = self.decomposer.act(list(observations))
        states, feats = [], []
        for obs, proposed in zip(observations, proposals, strict=True):
            state = self.macro.state(obs.info)
            proposal = Proposal.of_turn(turn_text(proposed, obs.decode or _no_decode), state)
            states.append((state, proposal))
            feats.append(self.macro.features(state, len(obs.token_ids), proposal))
        actions, _ = self.model.predict(np.stack(feats), deterministic=self.deterministic)
        return [self.macro.turn(min(int(a), self.macro.max_searchers), state, proposal)
                for a, (state, proposal) in zip(np.asarray(actions).reshape(-1), states)]


def _no_decode(ids: Sequence[int]) -> str:
    raise ValueError("the decomposition policy returned token ids but the observation has no decoder")
