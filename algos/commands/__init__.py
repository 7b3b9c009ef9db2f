"""What the command line runs, above the recipes: one module per ``python -m algos`` command
(``train``, ``sft``, ``plan``, ``train_leader_sb3``) and what they share: ``presets`` (the
preset and recipe registry), ``preflight`` (checks before anything loads), ``runlock``."""
