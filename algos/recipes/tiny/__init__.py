"""The tiny recipe: a 0.4M-parameter team ready in seconds, for smoke tests, CI and the
scale-out checks (Ray rollout workers, torchrun), whose rollouts give mixed rewards.

- ``settings``: the model name, env shape and training settings (the one definition);
- ``preset``: those settings and the hooks the preset registry and the command line call;
- ``retriever``: a word-overlap retriever over the synthetic world (no encoder to load);
- ``build``: a few seconds of SFT of a wired tiny Llama on scripted-team episodes, cached.
"""
