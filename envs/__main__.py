"""``python -m envs``: step a SearchTeam episode by hand, or make and inspect data.

    python -m envs step [--workflow cascade] [--question TEXT] [--seed 0]
    python -m envs data synth --out DIR        # the synthetic world in FlashRAG layout
    python -m envs data show nq --root DIR
    python -m envs info [--mode token]          # agents and spaces of env()

``step``: you type every agent's turn; each agent's new context is shown first (its prompt
the first time). ``:help`` lists the commands (``:ctx``, ``:all ANSWER``, ``:quit``), the
same as ``python -m agents play --policy human``.

``mopd`` (the console script, ``benchmarks.cli``) is this command, and dispatches
``mopd agents|algos|benchmarks ...`` to ``python -m agents|algos|benchmarks ...``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def package_version() -> str:
    """The installed mopd's version (``importlib.metadata``), or ``unknown`` when the
    project runs from a checkout that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mopd")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def add_version(parser: argparse.ArgumentParser) -> None:
    """``--version``: prints ``<prog> <version>`` and exits (every ``python -m`` command)."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}",
                        help="print the installed mopd version and exit")


def _step(args: argparse.Namespace) -> int:
    """Play every agent of one episode at the terminal. Returns 0 at the episode's end or
    on ``:quit``, 1 when the input ends first. Everything shown goes through
    ``envs.terminal.safe_print``: a passage's escape sequences are shown, not obeyed."""
    from envs import make_env
    from envs.terminal import RULE, ContextScreen, Quit, read_turn, team_line
    from envs.terminal import safe_print as show  # passages and turns may hold escape sequences

    env = make_env(wrapped=True, workflow=args.workflow)
    env.reset(seed=args.seed, options={"question": args.question} if args.question else None)
    raw = env.unwrapped
    decode = raw.tokenizer.decode
    show(f"You play every agent of one SearchTeam episode ({args.workflow} workflow).")
    show(team_line(raw.possible_agents))
    show("Each agent's context is shown as its model reads it (ChatML), new parts only. At the\n"
         "'agent> ' prompt type that agent's whole turn on one line. :help lists the commands\n"
         "(:ctx shows the whole context); :quit or Ctrl-D leaves.")
    show(f"Question: {raw.question.question}")
    screen = ContextScreen(decode, show)
    for_all: str | None = None  # ':all ANSWER' of an Answerer, for every later Answerer
    for agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        role = raw.view(agent)["role"]
        context = raw.context(agent)
        screen.header(agent, raw.view(agent)["turn"], raw.phase)
        if role == "answerer" and for_all is not None:
            show(f"{agent}> {for_all}   (:all)")
            turn = for_all
        else:
            screen.context(agent, context)
            try:
                typed = read_turn(agent, role, lambda a=agent: raw.context_text(a))
            except Quit:
                show("(left before the end of the episode)")
                return 0
            except EOFError:
                show("\n(end of input before the end of the episode)")
                return 1
            turn = typed.text
            if typed.for_all:
                for_all = turn
        own = len(context) + len(raw.prepare_turn(agent, turn).ids)
        env.step(turn)
        info = raw.infos.get(agent, {})
        if info.get("invalid") or info.get("note"):
            show(f"  [{'invalid: ' + str(info.get('reason')) if info.get('invalid') else info.get('kind')}]"
                 f"{'  ' + info['note'] if info.get('note') else ''}")
        if raw.done:
            continue
        after = raw.context(agent)  # what the env wrote back at once: passages, a correction
        reply = after[own:]
        if decode(reply, skip_special_tokens=True).strip():
            show(decode(reply).rstrip())
        screen.seen(agent, len(after))
    ep = raw.episode
    show(f"{RULE}\nCandidates: {ep.candidates}")
    gold = list(ep.question["golden_answers"]) or "none (a question of your own: EM is 0)"
    show(f"Final answer: {ep.final_answer!r}   gold: {gold}   EM {ep.final_em:.0f}   R_EM {ep.team_em:.0f}")
    show("Rewards: " + ", ".join(f"{a} {r:.3f}" for a, r in ep.rewards.items()))
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


def main(argv: list[str] | None = None, packages: Sequence[str] = ()) -> int:
    """``packages``: the ones the ``mopd`` dispatcher above serves, listed in the help."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "data":
        from envs.data.cli import main as data_main

        return data_main(argv[1:])
    prog = "mopd" if Path(sys.argv[0]).stem == "mopd" else "python -m envs"  # the console script?
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.replace("python -m envs", prog),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    step = sub.add_parser("step", help="play every role yourself, one typed turn at a time")
    info = sub.add_parser("info", help="agents and spaces of the default env")
    for p in (step, info):
        p.add_argument("--workflow", default="hierarchical", choices=["hierarchical", "cascade"],
                       help="hierarchical: Leader, Searchers, Answerers (default); cascade: one "
                            "Searcher, then the Answerers")
    step.add_argument("--question", default=None, help="pin the question (default: a random synthetic one)")
    step.add_argument("--seed", type=int, default=0, help="seeds the question draw (default 0)")
    info.add_argument("--mode", default="turn", choices=["turn", "token"],
                      help="step mode: an action is a whole turn (default) or one token")
    sub.add_parser("data", help=f"synth | show (see {prog} data --help)")
    for package in packages:
        sub.add_parser(package, add_help=False, help=f"the same as python -m {package} (see its --help)")
    args = parser.parse_args(argv)
    return {"step": _step, "info": _info}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
