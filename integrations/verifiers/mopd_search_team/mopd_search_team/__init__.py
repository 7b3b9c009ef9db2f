"""SearchTeam as a verifiers 0.4 taskset (id ``mopd-search-team``) with its own multi-agent
env: verifiers imports this module by the taskset id and takes the Taskset and Env
subclasses from ``__all__``.

>>> env = load_environment(taskset={"limit": 2}, workflow="cascade")  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from mopd_search_team.env import SearchTeamEnv, SearchTeamEnvConfig
from mopd_search_team.taskset import SearchTeamTaskset, SearchTeamTasksetConfig

TASKSET_ID = "mopd-search-team"

__all__ = ["SearchTeamEnv", "SearchTeamEnvConfig", "SearchTeamTaskset", "SearchTeamTasksetConfig",
           "TASKSET_ID", "load_environment"]


def load_environment(taskset: dict[str, Any] | None = None, **env: Any) -> SearchTeamEnv:
    """The env for Python callers: ``taskset`` overrides ``SearchTeamTasksetConfig``'s
    fields, ``env`` ``SearchTeamEnvConfig``'s (seats as dicts, e.g.
    ``searcher={"model": "other"}``), validated by verifiers as ``vf-eval`` does."""
    from verifiers.v1.utils.loaders import load_environment as build
    from verifiers.v1.utils.loaders import resolve_env_config

    return build(resolve_env_config({**env, "taskset": {**(taskset or {}), "id": TASKSET_ID}}))
