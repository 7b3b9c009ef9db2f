"""SearchTeam, version 0: ``env()`` (wrapped) and ``raw_env()``. See ``envs.search_team``."""

from envs.search_team import __doc__, env, raw_env  # noqa: F401

__all__ = ["env", "raw_env"]
