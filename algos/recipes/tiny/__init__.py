"""The tiny recipe: a 1M-parameter team ready in about a minute, for smoke tests, CI and the
scale-out checks (Ray rollout workers, torchrun), whose rollouts give mixed rewards.

- ``settings``: the model name, env shape and training settings (the one definition);
- ``preset``: those settings and the hooks the preset registry and the command line call;
- ``retriever``: the old import of ``envs.retrieval.lexical.WordOverlapRetriever``, the
  preset's retriever (``retriever="words"``: no encoder to load);
- ``build``: about a minute of SFT of a wired tiny Llama on scripted-team episodes, cached.
"""
