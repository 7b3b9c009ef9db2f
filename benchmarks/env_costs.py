"""What the SearchTeam env itself costs: measurements, not tests.

    python benchmarks/env_costs.py [--episodes 50] [--queries 512]

Prints the turn-mode step time (µs per turn, retriever excluded: a constant retriever
answers), token-mode throughput (tokens/s through ``step``), and the dense retriever's
queries/s over the synthetic corpus (batched and one at a time).
"""

from __future__ import annotations

import argparse
import time

TURNS = {
    "leader": ["<subtask>Where was Velmora Quist born?</subtask><subtask>Which country is Port Velm in?</subtask>",
               "<select>1, 2</select>"],
    "searcher": ["<search>Velmora Quist born</search>", "<search>Port Velm country</search>",
                 "<summary>Velmora Quist was born in Port Velm, a city in Ostria.</summary>"],
    "answerer": ["<answer>Ostria</answer>"],
}


class ConstantRetriever:
    """Answers every query with the same three passages: the retriever's cost is zero."""

    def __init__(self) -> None:
        from envs.retrieval import Passage

        self.passages = [Passage(str(i), f"Title {i}", "Some encyclopedia text about a place. " * 6)
                         for i in range(3)]

    def search(self, queries, top_k=3):
        return [self.passages[:top_k] for _ in queries]


def _play(env, ids_by_role, token_mode: bool) -> int:
    """One episode; returns the number of steps taken."""
    from envs.protocol import role_of

    env.reset(seed=0, options={"question": "In which country was Velmora Quist born?"})
    cursor: dict[str, int] = {}
    steps = 0
    for agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        role = role_of(agent)
        key = f"{agent}/{env.unwrapped.view(agent)['wave']}"
        turns = ids_by_role[role]
        k = cursor.get(key, 0)
        ids = turns[min(k, len(turns) - 1)]
        if token_mode:
            for t in ids:
                env.step(t)
                steps += 1
        else:
            env.step(ids)
            steps += 1
        cursor[key] = k + 1
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--queries", type=int, default=512)
    args = parser.parse_args()

    from envs import make_env
    from envs.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    ids = {role: [tokenizer.encode(t, add_special_tokens=False) for t in turns]
           for role, turns in TURNS.items()}
    for mode in ("turn", "token"):
        env = make_env(tokenizer=tokenizer, retriever=ConstantRetriever(), questions=["unused"], step_mode=mode)
        _play(env, ids, mode == "token")  # warm-up
        start = time.perf_counter()
        steps = sum(_play(env, ids, mode == "token") for _ in range(args.episodes))
        elapsed = time.perf_counter() - start
        turns = env.unwrapped.episode.turns * args.episodes
        if mode == "turn":
            print(f"turn mode : {1e6 * elapsed / turns:8.1f} µs per turn ({turns} turns, retriever excluded)")
        else:
            print(f"token mode: {steps / elapsed:8.0f} tokens/s through step() ({steps} tokens)")

    from envs.data.synthwiki import default_world
    from envs.retrieval import DenseRetriever

    world = default_world()
    retriever = DenseRetriever(world.corpus)
    questions = [q.question for qs in world.all_questions("test").values() for q in qs]
    queries = (questions * (args.queries // max(1, len(questions)) + 1))[: args.queries]
    retriever.search(queries[:8], 3)  # warm-up
    start = time.perf_counter()
    retriever.search(queries, 3)
    batched = len(queries) / (time.perf_counter() - start)
    start = time.perf_counter()
    for q in queries[:64]:
        retriever.search([q], 3)
    single = 64 / (time.perf_counter() - start)
    print(f"retrieval : {batched:8.0f} queries/s batched ({len(queries)} queries, "
          f"{len(world.corpus)} passages), {single:.0f} one at a time; ratio {batched / single:.1f}x")


if __name__ == "__main__":
    main()
