"""``python -m envs``: step a SearchTeam episode by hand, or make and inspect data.

    python -m envs step [--workflow cascade] [--mode turn] [--question TEXT]
    python -m envs data synth --out DIR        # the synthetic world in FlashRAG layout
    python -m envs data show nq --root DIR
    python -m envs info                         # agents and spaces of env()

``mopd`` (the console script) dispatches ``mopd envs|agents|algos|benchmarks ...``.
"""

from __future__ import annotations

import argparse
import importlib
import sys


def _step(args: argparse.Namespace) -> int:
    from envs import make_env

    env = make_env(wrapped=True, workflow=args.workflow, render_mode="human")
    options = {"question": args.question} if args.question else None
    env.reset(seed=args.seed, options=options)
    print(env.unwrapped.context_text(env.agent_selection))
    for agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        try:
            turn = input(f"\n{agent} > ")
        except EOFError:
            print("\n(end of input)")
            return 1
        env.step(turn)
        env.render()
    return 0


def _info(args: argparse.Namespace) -> int:
    from envs import make_env

    env = make_env(workflow=args.workflow, step_mode=args.mode)
    print(f"agents: {env.possible_agents}")
    agent = env.possible_agents[0]
    print(f"observation space: {env.observation_space(agent)}")
    print(f"action space: {env.action_space(agent)}")
    print(f"questions: {len(env.questions)}  retriever: {type(env.retriever).__name__}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("agents", "algos", "benchmarks", "envs"):
        package = argv.pop(0)
        if package != "envs":
            return importlib.import_module(f"{package}.__main__").main(argv)
    if argv and argv[0] == "data":
        from envs.data.cli import main as data_main

        return data_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m envs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    step = sub.add_parser("step", help="play every role yourself, one typed turn at a time")
    info = sub.add_parser("info", help="agents and spaces of the default env")
    for p in (step, info):
        p.add_argument("--workflow", default="hierarchical", choices=["hierarchical", "cascade"])
    step.add_argument("--question", default=None, help="pin the question (default: a random synthetic one)")
    step.add_argument("--seed", type=int, default=0)
    info.add_argument("--mode", default="turn", choices=["turn", "token"])
    sub.add_parser("data", help="synth | show (see python -m envs data --help)")
    args = parser.parse_args(argv)
    return {"step": _step, "info": _info}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
