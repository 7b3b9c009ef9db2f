"""Mix policies per role: one sub-batch per policy, answers put back in order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agents.base import Action, Observation, Policy


class RoleRouter:
    """``RoleRouter({"leader": p1, "searcher": p2, "answerer": p3})``.

    Each policy gets one call per batch with the observations of its roles; a role with no
    entry goes to ``default`` (an error when there is none).
    """

    def __init__(self, policies: Mapping[str, Policy], default: Policy | None = None):
        self.policies = dict(policies)
        self.default = default

    def policy_for(self, role: str) -> Policy:
        policy = self.policies.get(role, self.default)
        if policy is None:
            raise KeyError(f"no policy for role {role!r}; roles routed: {sorted(self.policies)}")
        return policy

    def act(self, observations: Sequence[Observation]) -> list[Action | str]:
        groups: dict[int, tuple[Policy, list[int]]] = {}
        for i, obs in enumerate(observations):
            policy = self.policy_for(obs.role)
            groups.setdefault(id(policy), (policy, []))[1].append(i)
        actions: list[Action | str | None] = [None] * len(observations)
        for policy, idx in groups.values():
            for i, action in zip(idx, policy.act([observations[i] for i in idx]), strict=True):
                actions[i] = action
        return actions  # type: ignore[return-value]
