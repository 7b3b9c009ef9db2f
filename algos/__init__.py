"""The MultiAgent-OPD learner, its floors in folders (``docs/layout.md``): ``engine/`` (one
update on 1..K processes) below the method (roles, advantages, losses, Teacher, critic, the
Trainer's loop), ``recipes/`` and ``commands/`` (what ``python -m algos`` runs) above it."""

import importlib
import importlib.util
import sys

MOVED = {f"algos.{old}": f"algos.{new}" for old, new in {
    "pipeline": "commands.train", "preflight": "commands.preflight", "plan": "commands.plan",
    "presets": "commands.presets", "sft_cli": "commands.sft", "train_leader_sb3": "commands.train_leader_sb3",
    "runlock": "engine.runlock", "commands.runlock": "engine.runlock", "checkpoint": "engine.checkpoint",
    "precision": "engine.precision", "distributed": "engine.distributed", "freeze": "engine.freeze"}.items()}
"""Old module name (users import it) -> its name now; ``import algos.pipeline`` gives
``algos.commands.train`` itself, one object (a patch through either name patches both)."""


class _Moved:  # the import system's finder and loader of the names in MOVED
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # the import system then sets __spec__ to the old name's
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state


sys.meta_path.append(_Moved())
