"""Train only the Leader, with stable-baselines3, on the macro-action view.

    python -m algos train-leader-sb3 --algo ppo --timesteps 8192 --out runs/sb3_leader
    python -m benchmarks run --policy leader=sb3:runs/sb3_leader,searcher=scripted,answerer=scripted

The Leader chooses how much to search (``envs.leader_view.LeaderMacroEnv``: dispatch n
Searchers on the decomposition policy's sub-tasks, or stop); fixed policies play the
Searchers and the Answerers (scripted by default; any policy spec, an LLM included). The
run directory gets ``leader.safetensors`` (the policy's weights), ``leader.json`` (what
``sb3:<path>`` needs to rebuild the policy, as plain JSON, plus the config and the held-out
numbers) and ``monitor.csv``; see ``agents.sb3_leader`` for why it is not SB3's zip.
``--resave DIR`` rewrites a Leader saved as SB3's zip (``leader.zip``) in that form, reading
only its weights, then exits.
After training, the Leader and a uniformly random macro-action Leader are scored on
held-out questions (the synthetic world's dev split) and both numbers are printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agents.sb3_leader import (
    ALGOS,
    DECOMPOSERS,
    MODEL_FILE,
    algo_class,
    make_decomposer,
    network_settings,
    resave_leader,
    save_leader,
)
from envs.leader_view import FEATURES, LeaderMacroEnv
from envs.retrieval.passage import MemoRetriever

DEFAULT_HYPERPARAMS: dict[str, dict[str, Any]] = {
    # Short episodes (at most max_waves decisions) with all reward at the end: no discount.
    "ppo": {"n_steps": 256, "batch_size": 64, "n_epochs": 10, "gamma": 1.0, "gae_lambda": 0.95,
            "learning_rate": 3e-4, "ent_coef": 0.01, "policy_kwargs": {"net_arch": [64, 64]}},
    "a2c": {"n_steps": 16, "gamma": 1.0, "learning_rate": 7e-4, "ent_coef": 0.01,
            "policy_kwargs": {"net_arch": [64, 64]}},
    "dqn": {"learning_starts": 256, "buffer_size": 50_000, "train_freq": 4, "target_update_interval": 500,
            "exploration_fraction": 0.3, "gamma": 1.0, "policy_kwargs": {"net_arch": [64, 64]}},
}
"""Per-algorithm defaults; ``algo_kwargs`` overrides them key by key."""


def synthetic_questions(split: str, per_dataset: int) -> list[Any]:
    """The first ``per_dataset`` questions of each of the seven synthetic datasets."""
    from envs.data.synthwiki import default_world

    return [q for qs in default_world().all_questions(split).values() for q in qs[:per_dataset]]


def _tokenizer_of(policy: Any) -> Any:
    for p in [policy, *getattr(policy, "policies", {}).values()]:
        if getattr(p, "tokenizer", None) is not None:
            return p.tokenizer
    return None


def make_leader_env(questions: Sequence[Any], *, others: str | Any = "scripted", decompose: str = "scripted",
                    retriever: Any = None, tokenizer: Any = None, search_cost: float = 0.0, seed: int = 0,
                    env_kwargs: dict[str, Any] | None = None) -> LeaderMacroEnv:
    """A :class:`LeaderMacroEnv` over ``questions``. ``others`` is a policy spec (or object)
    for the Searchers and Answerers; ``retriever`` defaults to MiniLM over the synthetic
    world and is memoised; ``tokenizer`` defaults to the others' own, else SmolLM2's."""
    from agents.registry import make_policy
    from envs import make_env

    if isinstance(others, str):
        others = make_policy(others, seed=seed)
    if retriever is None:
        from envs.retrieval.factory import default_retriever

        retriever = default_retriever()
    raw = make_env(tokenizer=tokenizer or _tokenizer_of(others), retriever=MemoRetriever(retriever),
                   questions=list(questions), **(env_kwargs or {}))
    return LeaderMacroEnv(raw, others, make_decomposer(decompose, seed, make_policy=make_policy),
                          search_cost=search_cost)


def evaluate_leader(env: LeaderMacroEnv, choose: Callable[[np.ndarray], int], questions: Sequence[Any],
                    seed: int = 0) -> dict[str, float]:
    """One episode per question with ``choose(observation) -> macro-action``: mean return
    (the Leader's reward minus search costs), team EM, searches and waves per episode."""
    returns, infos = [], []
    for i, question in enumerate(questions):
        obs, _ = env.reset(seed=seed + i, options={"question": question})
        total, done, info = 0.0, False, {}
        while not done:
            obs, reward, done, _, info = env.step(choose(obs))
            total += reward
        returns.append(total)
        infos.append(info)
    means = {k: float(np.mean([i[k] for i in infos])) for k in ("team_em", "searches", "waves")}
    return {"mean_reward": float(np.mean(returns)), **means, "episodes": len(returns)}


def train_leader_sb3(algo: str = "ppo", timesteps: int = 8192, others: str | Any = "scripted",
                     out: str | Path = "runs/sb3_leader", seed: int = 0, *, decompose: str = "scripted",
                     search_cost: float = 0.0, train_questions: Sequence[Any] | None = None,
                     eval_questions: Sequence[Any] | None = None, retriever: Any = None, tokenizer: Any = None,
                     env_kwargs: dict[str, Any] | None = None, algo_kwargs: dict[str, Any] | None = None,
                     progress: bool = False, log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Train a Leader with ``algo`` for ``timesteps`` Leader decisions; save it to ``out``.

    Questions default to 40 per synthetic dataset (train split) for training and 10 per
    dataset (dev split) for the held-out evaluation. Returns the metadata written to
    ``leader.json``: config, training time, and ``eval`` = the trained and the random
    Leader's :func:`evaluate_leader` numbers.
    """
    from stable_baselines3.common.monitor import Monitor

    if timesteps < 1:
        raise ValueError(f"timesteps must be >= 1, got {timesteps}")
    if decompose not in DECOMPOSERS:
        raise ValueError(f"decompose must be one of {', '.join(DECOMPOSERS)} (a saved Leader names only "
                         f"built-in decomposers), got {decompose!r}")
    cls = algo_class(algo)
    kwargs = {**DEFAULT_HYPERPARAMS[algo], **(algo_kwargs or {})}
    # a copy: SB3 writes into policy_kwargs (A2C adds its optimizer), which must not reach the defaults
    kwargs["policy_kwargs"] = dict(kwargs.get("policy_kwargs") or {})
    hyperparams = {**kwargs, "policy_kwargs": network_settings(kwargs["policy_kwargs"])}  # refused here if unsaveable
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train_questions = list(train_questions) if train_questions is not None else synthetic_questions("train", 40)
    eval_questions = list(eval_questions) if eval_questions is not None else synthetic_questions("dev", 10)
    others_spec = others if isinstance(others, str) else type(others).__name__
    env = make_leader_env(train_questions, others=others, decompose=decompose, retriever=retriever,
                          tokenizer=tokenizer, search_cost=search_cost, seed=seed, env_kwargs=env_kwargs)
    model = cls("MlpPolicy", Monitor(env, str(out / "monitor.csv")), seed=seed, device="cpu", verbose=0, **kwargs)
    start = time.perf_counter()
    model.learn(total_timesteps=timesteps, progress_bar=progress)
    seconds = time.perf_counter() - start

    trained = evaluate_leader(env, lambda obs: int(model.predict(obs, deterministic=True)[0]),
                              eval_questions, seed=seed)
    rng = np.random.default_rng(seed)  # the floor to beat: a uniformly random macro-action
    floor = evaluate_leader(env, lambda obs: int(rng.integers(env.action_space.n)), eval_questions,
                            seed=seed)
    cfg = env.raw.config
    meta = {
        "algo": algo, "features": list(FEATURES), "max_waves": cfg.max_waves, "max_searchers": cfg.max_searchers,
        "max_context_tokens": cfg.max_context_tokens, "decompose": decompose, "others": others_spec,
        "search_cost": search_cost, "timesteps": timesteps, "seed": seed, "hyperparams": hyperparams,
        "env_kwargs": env_kwargs or {}, "train_questions": len(train_questions),
        "eval_questions": len(eval_questions), "train_seconds": round(seconds, 1),
        "eval": {"trained": trained, "random": floor},
    }
    meta = save_leader(model, out, json.loads(json.dumps(meta, default=str)))
    log(f"{algo} Leader, {timesteps} steps in {seconds:.0f}s -> {out / MODEL_FILE}")
    log(f"held-out ({len(eval_questions)} questions) mean reward: trained {trained['mean_reward']:.3f} "
        f"(EM {trained['team_em']:.3f}, {trained['searches']:.1f} searches) vs random "
        f"{floor['mean_reward']:.3f} (EM {floor['team_em']:.3f}, {floor['searches']:.1f} searches)")
    return meta


def _env_overrides(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"--env {pair!r}: expected name=value, e.g. --env num_candidates=1")
        try:
            out[name] = int(raw)
        except ValueError:
            out[name] = raw
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m algos train-leader-sb3", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=ALGOS, default="ppo", help="stable-baselines3 algorithm (default ppo)")
    parser.add_argument("--timesteps", type=int, default=8192, help="Leader decisions to train on")
    parser.add_argument("--others", default="scripted", help="policy spec of the Searchers and Answerers")
    parser.add_argument("--decompose", default="scripted", choices=DECOMPOSERS,
                        help="built-in policy that proposes the sub-tasks (default scripted)")
    parser.add_argument("--out", default="runs/sb3_leader", help="where the Leader is saved (default runs/sb3_leader)")
    parser.add_argument("--seed", type=int, default=0, help="seeds SB3, the env and the questions (default 0)")
    parser.add_argument("--search-cost", type=float, default=0.0, help="subtracted from the reward per search")
    parser.add_argument("--train-per-dataset", type=int, default=40, help="train-split questions per dataset")
    parser.add_argument("--eval-per-dataset", type=int, default=10, help="dev-split questions per dataset")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="SearchTeam setting, e.g. --env num_candidates=1 --env max_waves=2")
    parser.add_argument("--progress", action="store_true", help="show SB3's progress bar")
    parser.add_argument("--resave", metavar="DIR", help="rewrite DIR's SB3 zip Leader (leader.zip + leader.json) "
                        "as leader.safetensors + leader.json, reading only its weights, and exit")
    args = parser.parse_args(argv)
    if args.resave:
        try:
            written = resave_leader(args.resave)
        except (ValueError, FileNotFoundError) as err:
            print(f"{parser.prog}: error: {err}", file=sys.stderr)
            return 2
        print(f"re-saved {written}; {Path(args.resave) / 'leader.zip'} is no longer read and may be deleted")
        return 0
    import torch

    from algos.engine.runlock import run_lock

    torch.set_num_threads(1)  # a 64x64 MLP: threads only cost
    with run_lock(args.out):  # one run per --out: two would interleave monitor.csv and the saved Leader
        train_leader_sb3(args.algo, args.timesteps, args.others, args.out, args.seed, decompose=args.decompose,
                         search_cost=args.search_cost,
                         train_questions=synthetic_questions("train", args.train_per_dataset),
                         eval_questions=synthetic_questions("dev", args.eval_per_dataset),
                         env_kwargs=_env_overrides(args.env), progress=args.progress)
    return 0
