"""SearchTeam on OpenEnv (optional extra: ``pip install -e .[openenv]``): ``server`` (``python
-m envs.openenv serve``), the typed ``client`` and the wire ``models``. See docs/ecosystems.md.
"""
