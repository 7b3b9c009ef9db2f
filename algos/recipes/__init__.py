"""Recipes above the learner: everything one preset needs that the general learner must not
know (how its base model is built, what of it stays frozen, its tokenizer, its settings).

The learner (``algos.trainer``, ``algos.sft``, ``algos.batch``, ...) imports nothing from here;
only the preset registry (``algos.presets.PRESETS``) and the command line do. A recipe tells
the learner what it needs through the model itself: a path to load, and the parameters its
saved config declares frozen (``algos.freeze``).
"""
