"""The micro recipe: a 5M-parameter team that trains on 2 CPU cores in minutes.

- ``settings``: the model name, env shape and training settings (the one definition);
- ``preset``: those settings and the hooks the preset registry and the command line call;
- ``tokenizer``: a 4k-token byte-level BPE fitted to the synthetic world and the protocol;
- ``circuit``: the hand-wired copy circuit and lookup heads, and what of them stays frozen;
- ``model``: the tiny Llama over that tokenizer, wired;
- ``episodes``: the scripted team's episodes the base imitates;
- ``measure``: team statistics and the Searchers' skip probability;
- ``build``: the SFT-warmed base, built once and cached.
- ``seeds``: the spread over seeds (a base per seed, both stages, pooled summaries).

Notes and measurements: ``README.md`` in this folder.
"""
