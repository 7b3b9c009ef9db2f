"""SearchTeam on OpenEnv (optional extra: ``pip install -e .[openenv]``).

``python -m envs.openenv serve`` serves the env (``server.make_app``); ``client`` holds the
typed client; ``models`` the wire types. One step is one whole turn of the agent the
observation names; the final observation carries per-agent rewards and the whole episode
record. ``agents.openenv_client.collect_remote`` is ``agents.collect`` over the wire.
See ``docs/ecosystems.md``.
"""
