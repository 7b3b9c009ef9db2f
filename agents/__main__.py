"""``python -m agents``: play an episode turn by turn, replay a saved one, or run a demo.

    python -m agents play --question "Who directed 'The Glass Harbor'?" --policy human
    python -m agents play --dataset hotpotqa --index 3 --leader scripted --searcher hf:smollm2
    python -m agents play --policy 'hf:smollm2?temperature=0.7&top_p=0.9' --leader 'hf:smollm2?temperature=0'
    python -m agents replay episodes.jsonl [--index 0] [--all]
    python -m agents view runs/micro/team/samples/step_000012.jsonl [--index N] [--out page.html] [--serve]
    python -m agents demo [--per-dataset 20] [--policy scripted]

Policies: the kinds of ``agents.registry`` (``play --help`` lists them). An LM policy samples with its spec's ``?temperature=...`` settings,
else ``--temperature``/``--top-p``/``--max-new-tokens``, else the model's generation config
(greedy when it does not sample, as SmolLM2's); see ``agents.sampling``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from agents.collect import collect
from agents.registry import check_policy, make_policy, policy_usage
from agents.router import RoleRouter
from agents.sampling import add_sampling_arguments, describe_team, sampling_of_args, team_settings
from agents.simple import HumanPolicy, last_user_message
from envs.episode import Episode, save_episodes
from envs.protocol import (
    DEFAULT_PROMPTS,
    PROMPT_SETS,
    prompt_set,
    render_passages,
    render_search_failure,
)
from envs.terminal import RULE, ContextScreen, Quit, team_line, terminal_safe


def _terminal(out: Callable[[str], Any]) -> Callable[[str], None]:
    """``out`` behind :func:`envs.terminal.terminal_safe`: play and replay show passages,
    questions and model turns, whose escape sequences must be shown, not obeyed."""
    return lambda text: out(terminal_safe(text))


def play(args: argparse.Namespace, out: Callable[[str], None] = print) -> Episode:
    """Step one episode through the AEC API, showing every turn and what the env wrote
    (through :func:`envs.terminal.terminal_safe`, as the human policy's prompts)."""
    from envs import make_env

    out = _terminal(out)
    env = make_env(wrapped=True, workflow=args.workflow, step_mode=args.mode,
                   prompts=getattr(args, "prompts", DEFAULT_PROMPTS))
    question = args.question
    if not question:
        from envs.data import load_qa

        items = load_qa(args.dataset, args.split, root=args.root or "synthetic")
        if not 0 <= args.index < len(items):
            raise SystemExit(f"--index {args.index} is out of range: {args.dataset}/{args.split} has "
                             f"{len(items)} questions")
        question = items[args.index]
    env.reset(seed=args.seed, options={"question": question})
    raw = env.unwrapped
    kwargs = {"seed": args.seed, "vocab_size": raw.vocab_size, "sampling": sampling_of_args(args)}
    policy = make_policy(args.policy, **kwargs)
    roles = {r: getattr(args, r) for r in ("leader", "searcher", "answerer") if getattr(args, r)}
    if roles:
        policy = RoleRouter({r: make_policy(s, **kwargs) for r, s in roles.items()}, default=policy)
    for p in (policy, *getattr(policy, "policies", {}).values(), getattr(policy, "default", None)):
        if isinstance(p, HumanPolicy):
            p.show_context = False  # the loop below shows each new context once
            p.output_fn = _terminal(p.output_fn)
    out(team_line(raw.possible_agents))
    settings = team_settings(policy)
    out(f"Sampling: {describe_team(settings)}")
    out(f"Question: {raw.question.question}")
    screen = ContextScreen(raw.tokenizer.decode, out)
    for agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        obs = raw.turn_observation(agent)
        screen.header(agent, obs.info["turn"], raw.phase)
        screen.context(agent, obs.token_ids.tolist())
        action = policy.act([obs])[0]
        if args.mode == "token":
            ids = raw.prepare_turn(agent, action)[0] or [raw.eos_id]
            for token in ids:
                env.step(token)
            if env.agent_selection == agent and not raw.done and \
                    len(raw.context(agent)) > len(raw.turn_observation(agent).token_ids):  # still mid-turn
                env.step(raw.eos_id)
        else:
            env.step(action)
        info = env.infos.get(agent) or env.unwrapped.infos.get(agent, {})
        verdict = f"invalid: {info.get('reason')}" if info.get("invalid") else info.get("kind", "")
        out(f">>> {info.get('text', '').strip()}\n    [{verdict}]{'  ' + info['note'] if info.get('note') else ''}")
        if raw.done:
            continue
        screen.seen(agent, len(raw.context(agent)))
        if info.get("kind") == "search" and "passages" in raw.view(agent):  # what this search retrieved
            seen = raw.view(agent)["passages"]
            failed = info.get("search_error")
            out(render_search_failure(failed) if failed else render_passages(seen[-1] if seen else []))
        elif info.get("invalid"):  # the correction the env wrote back at once
            out(last_user_message(raw.messages(agent)))
    ep = raw.episode
    ep.sampling = settings
    out(RULE)
    _summary(ep, out)
    if args.save:
        save_episodes(args.save, [ep])
        out(f"saved to {args.save}")
    return ep


def _summary(ep: Episode, out: Callable[[str], None]) -> None:
    out(f"Candidates: {ep.candidates}")
    out(f"Final answer: {ep.final_answer!r}   gold: {ep.question['golden_answers']}   "
        f"EM {ep.final_em:.0f}   R_EM {ep.team_em:.0f}")
    out(f"Searches {ep.num_searches} · waves {ep.num_waves} · turns {ep.turns} · invalid {ep.invalid_turns} · "
        f"tokens in/out {ep.input_tokens}/{ep.output_tokens}")
    out("Rewards: " + ", ".join(f"{a} {r:.3f}" for a, r in ep.rewards.items()))


def replay(args: argparse.Namespace, out: Callable[[str], None] = print,
           read: Callable[[str], str] = input) -> int:
    """Step through a saved episode (``--all``: every turn at once), shown through
    :func:`envs.terminal.terminal_safe`. A file that is not an episode file (bad JSON, a
    record of the wrong shape or types) is one line on stderr naming file and line: 2."""
    from agents.viewer.records import ViewError, pick, read_records
    from envs.tokenizer import load_tokenizer

    out = _terminal(out)
    try:  # the viewer's checks: every record's fields and types, its turns inside its segments
        ep, _ = pick(read_records(args.file), args.index, args.file)
    except ViewError as err:
        print(f"python -m agents replay: {terminal_safe(str(err), one_line=True)}", file=sys.stderr)
        return 2
    decode = load_tokenizer(args.tokenizer).decode
    blocks = []  # one per turn: what the env had written to the agent, then its turn
    last_end: dict[int, int] = {}
    for n, (s, start, end) in enumerate(ep.turn_spans, 1):
        seg = ep.segments[s]
        before = decode(seg.token_ids[last_end.get(s, 0):start]).strip()
        last_end[s] = end
        blocks.append(f"{RULE}\nturn {n}/{len(ep.turn_spans)} · {seg.agent} ({seg.role}, wave {seg.wave})\n"
                      f"{before}\n>>> {decode(seg.token_ids[start:end]).strip()}")
    out(f"Question: {ep.question['question']}  ({len(blocks)} turns)")
    if args.all:
        for block in blocks:
            out(block)
        _summary(ep, out)
        return 0
    i = 0
    while True:
        out(blocks[i] if blocks else "(no turns)")
        try:
            key = read("[n]ext [p]rev [s]ummary [q]uit > ").strip().lower() or "n"
        except EOFError:
            return 0
        if key == "q":
            return 0
        if key == "s":
            _summary(ep, out)
        i = min(i + 1, len(blocks) - 1) if key == "n" else max(i - 1, 0) if key == "p" else i


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """What play and demo share: the prompt set, the seed and the sampling settings."""
    parser.add_argument("--prompts", default=DEFAULT_PROMPTS, metavar="NAME",
                        help=f"the env's prompt set: {', '.join(PROMPT_SETS)} (default {DEFAULT_PROMPTS})")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the env and the policies (default 0)")
    add_sampling_arguments(parser)


def demo(args: argparse.Namespace, out: Callable[[str], None] = print) -> dict[str, dict[str, float]]:
    """A policy over the synthetic world's questions, every style, both workflows."""
    from envs import env_fn
    from envs.data import DATASETS, load_qa

    policy = make_policy(args.policy, seed=args.seed, sampling=sampling_of_args(args))
    tokenizer = getattr(policy, "tokenizer", None)  # an LM policy plays with its own tokenizer
    questions = [q for name in DATASETS for q in load_qa(name, args.split, root="synthetic")[: args.per_dataset]]
    results: dict[str, dict[str, float]] = {}
    for workflow in args.workflows.split(","):
        groups = collect(env_fn(workflow=workflow, tokenizer=tokenizer, max_turn_tokens=args.max_turn_tokens,
                                prompts=getattr(args, "prompts", DEFAULT_PROMPTS)),
                         policy, questions, seed=args.seed,  # every question in one batch
                         progress=False if args.no_progress else workflow)
        rows = {}
        for name in DATASETS:
            eps = [g[0] for g, q in zip(groups, questions) if q.dataset == name]
            rows[name] = {
                "em": sum(ep.final_em for ep in eps) / len(eps),
                "searches": sum(ep.num_searches for ep in eps) / len(eps),
                "invalid": sum(ep.invalid_turns for ep in eps) / max(1, sum(ep.turns for ep in eps)),
            }
        rows["macro"] = {k: sum(r[k] for r in rows.values()) / len(rows) for k in ("em", "searches", "invalid")}
        results[workflow] = rows
        out(f"\n{args.policy} team, {workflow} workflow, synthetic {args.split} ({args.per_dataset} per dataset; "
            f"sampling: {describe_team(team_settings(policy))})")
        out(f"{'dataset':<18}{'EM':>7}{'searches':>10}{'invalid':>9}")
        for name, r in rows.items():
            out(f"{name:<18}{100 * r['em']:>7.1f}{r['searches']:>10.2f}{100 * r['invalid']:>8.1f}%")
    return results


def main(argv: list[str] | None = None) -> int:
    from envs.__main__ import add_version

    parser = argparse.ArgumentParser(prog="python -m agents", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("play", help="step one episode, showing each turn")
    p.add_argument("--question", help="a question of your own")
    p.add_argument("--dataset", default="nq", help="a dataset of the synthetic world (or of --root)")
    p.add_argument("--split", default="dev", help="split of --dataset (default dev)")
    p.add_argument("--root", default=None, help="a FlashRAG-layout data directory (default: synthetic)")
    p.add_argument("--index", type=int, default=0, help="which question of the split (default 0)")
    p.add_argument("--policy", default="scripted", help=f"policy for every role without its own: {policy_usage()}")
    for role in ("leader", "searcher", "answerer"):
        p.add_argument(f"--{role}", default=None, help=f"policy for the {role} role")
    p.add_argument("--workflow", default="hierarchical", choices=["hierarchical", "cascade"],
                   help="hierarchical: Leader, Searchers, Answerers (default); cascade: one Searcher")
    p.add_argument("--mode", default="turn", choices=["turn", "token"],
                   help="step mode: a step is a whole turn (default) or one token")
    p.add_argument("--save", default=None, help="write the episode as JSONL")
    _add_run_arguments(p)
    r = sub.add_parser("replay", help="step through a saved episode, forward and backward")
    r.add_argument("file", help="episodes JSONL, e.g. from play --save FILE")
    r.add_argument("--index", type=int, default=0, help="which episode of the file (default 0)")
    r.add_argument("--all", action="store_true", help="print every turn at once")
    r.add_argument("--tokenizer", default=None, help="tokenizer of the recorded episode (default smollm2)")
    from agents.viewer import add_view_parser, view  # view FILE: one HTML page, token by token

    add_view_parser(sub)
    d = sub.add_parser("demo", help="a policy on the synthetic questions, EM per style")
    d.add_argument("--policy", default="scripted", help=f"policy for every role (default scripted): {policy_usage()}")
    d.add_argument("--per-dataset", type=int, default=20, help="questions per dataset (default 20)")
    d.add_argument("--split", default="dev", help="synthetic split (default dev)")
    d.add_argument("--workflows", default="hierarchical,cascade", help="comma list of workflows to run")
    d.add_argument("--max-turn-tokens", type=int, default=256, help="per-turn token budget")
    _add_run_arguments(d)
    d.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    for option in ("policy", "leader", "searcher", "answerer"):  # before the env or a model loads
        try:
            check_policy(getattr(args, option, None) or "scripted")
        except ValueError as err:
            print(f"python -m agents: error: --{option} {err}", file=sys.stderr)
            return 2
    try:
        prompt_set(getattr(args, "prompts", DEFAULT_PROMPTS))
    except ValueError as err:
        print(f"python -m agents: error: --prompts: {err}", file=sys.stderr)
        return 2
    if args.command == "replay":
        return replay(args)
    if args.command == "view":
        return view(args)
    try:
        (play if args.command == "play" else demo)(args)
    except EOFError as err:  # a person left (Quit) or input ended: only play says so
        if args.command != "play":
            raise
        if isinstance(err, Quit):
            print("(left before the end of the episode; nothing saved)")
            return 0
        print("\n(end of input before the end of the episode; nothing saved)")
        return 1
    except Exception as err:  # a server's failure (OpenAI-compatible, a retriever's) is one line
        from agents.openai_chat import OpenAIError
        from envs.retrieval.remote import RetrievalError

        sdk = sys.modules.get("openai")  # the SDK's own errors too, once it is loaded
        remote = (OpenAIError, RetrievalError) + ((sdk.OpenAIError,) if hasattr(sdk, "OpenAIError")
                                                  else ())
        if not isinstance(err, remote):
            raise
        print(f"python -m agents {args.command}: {terminal_safe(str(err), one_line=True)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
