"""The performance suite: what mopd's machinery costs next to the limits, the minimal code
that does the same work.

    python -m benchmarks perf                       # tiny random Llama, full sizes
    python -m benchmarks perf --quick               # small sizes, under 3 minutes on 2 cores
    python -m benchmarks perf --model smollm2 --out perf-smollm2.json
    python -m benchmarks perf --quick --scaleout    # + Ray workers and torchrun ranks (issue 15)

Every timing figure is a ratio of two costs measured in the same run, interleaved, on one
thread: docs/performance.md says how, and what the bare and ``before`` sides are. Cost ratios
are ``mopd / bare`` (above 1: mopd is slower by that factor); speedups are ``slow / fast``;
shares are fractions of one timed run.

The bare side of each figure is the minimal implementation of the same work:

===============================================  =========================================
figure                                           A / B
===============================================  =========================================
``decode.{greedy,sampled}.collect_vs_minimal``   ``collect`` with an HFPolicy (16 env
                                                 copies) / :func:`minimal_decode`, a
                                                 hand-written KV-cache loop over the same
                                                 prompts, batches and lengths; the same
                                                 tokens and log-probs (checked: details)
``decode.*.policy_vs_minimal``                   HFPolicy's share of that collect / it
``decode.*.before_vs_after``                     the collect with the replaced decoding
                                                 step / with this one
``decode.*.peer.generate_vs_minimal``            peer: ``model.generate`` / the minimal loop
``env.outside_policy_share``                     (collect - policy) / collect (greedy)
``env.construction_share``                       making the env copies / the collect
``collect.batched_speedup.{model,scripted}``     ``collect(max_envs=1)`` / batched collect
``collect.env_construction_share.scripted``      making the envs / the scripted collect
``learner.update_vs_fwd_bwd``                    ``Trainer.update`` / a plain forward +
                                                 ``cross_entropy`` + backward (the model's
                                                 own logits) on the same rows
``learner.update.before_vs_after``               update with full-vocabulary logits / now
``learner.memory.mb_per_trained_token``          peak memory per trained token (MB, not a
                                                 ratio; slope between two batch sizes)
``learner.memory.before_vs_after``               that figure before / after
``learner.memory.update_vs_fwd_bwd``             that figure / the plain forward+backward's
``teacher.score_rows_vs_forward``                ``score_rows`` / a no-grad forward
``retrieval.flat@N.search_vs_faiss``             ``DenseRetriever.search`` / faiss alone on
                                                 precomputed query vectors, N passages
``retrieval.<kind>@N.speedup``                   flat search / ``<kind>`` search, end to end
``retrieval.<kind>@N.faiss_speedup``             the same, faiss alone
``retrieval.recall_at_3.<kind>.<corpus>``        recall@3 of ``<kind>`` against flat, MiniLM
                                                 embeddings of a real or synthetic corpus
                                                 (a fraction, not a ratio of costs)
``retrieval.batched_speedup``                    one query per call / all in one call
``scaling.<dim>=<v>.{time,input_tokens,          cost at setting v / at the smallest, for
output_tokens}``                                 G, waves, Searchers (collect), passages
``collect.ray_workers_speedup`` (``--scaleout``)  1 Ray worker's collect / 2 workers' (the
                                                 tiny base; ``benchmarks/scaleout_perf.py``)
``learner.ddp_step_ratio`` (``--scaleout``)      a learner step on 2 gloo ranks / in one
                                                 process, same global batch
===============================================  =========================================

Policies: the model-bound sections use ``--model`` (default a tiny random Llama from
``agents.models.tiny_causal_lm`` over the env's tokenizer; ``smollm2`` the real one; ``micro``
the SFT-warmed micro model); greedy, and sampled at the trainer's temperature and top-p.
Elsewhere the scripted team plays (fast, deterministic). The scaling runs use a Leader that
always dispatches every wave and every Searcher slot, so the cost follows the setting. A
random model never writes a valid turn: Leader retries, then Answerers.

Modules: ``cli``, ``runner`` (the sections in order, the ``--scaleout`` add-on), ``settings``,
``harness`` (interleaved timing), ``baselines`` (the bare and ``before`` sides), one per section.
"""

import os

# before transformers and sentence-transformers are first imported by a section
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
