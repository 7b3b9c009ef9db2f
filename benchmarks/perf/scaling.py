"""The scaling section: rollout cost and tokens against G, waves and Searchers, played by
``FullBudgetTeam`` so that the cost follows the setting (passage count: ``retrieval``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agents.base import Observation
from benchmarks.perf.harness import Bench, Trial, figure, interleaved
from envs import protocol as P


class FullBudgetTeam:
    """The scripted team, except that the Leader dispatches every Searcher slot in every
    wave it has (cycling the scripted Leader's sub-tasks, or the question), so a rollout's
    cost follows ``max_waves`` and ``max_searchers``."""

    def __init__(self, seed: int = 0):
        from agents.scripted import ScriptedPolicy

        self.scripted = ScriptedPolicy(seed=seed)

    def act(self, observations: Sequence[Observation]) -> list[str]:
        return [self._leader(o) if o.role == P.LEADER else self.scripted.act([o])[0] for o in observations]

    def _leader(self, obs: Observation) -> str:
        """Reads the Leader's ``info`` (waves left, Searcher slots, question), never its prompt."""
        info = obs.info
        turn = self.scripted.act([obs])[0]
        if info["waves_left"] <= 0:
            return turn  # it selects when no wave is left
        slots = info["max_searchers"]
        parsed = P.parse_leader(turn, len(info["reports"]), slots)
        tasks = list(parsed.subtasks) or [info["question"].strip()]
        return "".join(f"<subtask>{tasks[i % len(tasks)]}</subtask>" for i in range(slots))


def scaling(bench: Bench) -> None:
    """Rollout cost against G, waves and Searchers (passage count: in :func:`retrieval`)."""
    from agents.collect import collect

    s = bench.settings
    questions = bench.pick(s.scaling_questions)
    team = FullBudgetTeam(seed=s.seed)
    dims = {"group_size": [(g, {}, g) for g in s.group_sizes],
            "waves": [(w, {"max_waves": w}, s.scaling_group_size) for w in s.waves],
            "searchers": [(k, {"max_searchers": k}, s.scaling_group_size) for k in s.searchers]}

    def rollout(env_fn: Callable[[], Any], group: int) -> Trial:
        def trial() -> dict[str, float]:
            eps = [ep for g in collect(env_fn, team, questions, group, seed=s.seed) for ep in g]
            return {"input_tokens": sum(ep.input_tokens for ep in eps),
                    "output_tokens": sum(ep.output_tokens for ep in eps),
                    "searches": sum(ep.num_searches for ep in eps),
                    "waves": sum(ep.num_waves for ep in eps), "episodes": len(eps)}
        return trial

    for dim, settings in dims.items():
        t = interleaved({str(v): rollout(bench.env_fn(**kw), g) for v, kw, g in settings}, s.reps)
        base = str(settings[0][0])
        bench.details[f"scaling.{dim}"] = {
            str(v): {k.split(".", 1)[1]: t[k][-1] for k in t if k.startswith(f"{v}.")} for v, _, _ in settings}
        for value, _, _ in settings[1:]:
            v = str(value)
            bench.add(f"scaling.{dim}={v}.time", figure(
                t[v], t[base], f"collect time at {dim}={v} / at {base} (linear: {value / settings[0][0]:.2f})"))
            for key in ("input_tokens", "output_tokens"):
                bench.add(f"scaling.{dim}={v}.{key}", figure(
                    t[f"{v}.{key}"], t[f"{base}.{key}"], f"{key} at {dim}={v} / at {base}"))
