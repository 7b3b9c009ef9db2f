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

The bare side of each figure is the minimal implementation of the same work. Each figure says
what its A / B is in its ``what`` (printed in the table, kept in the JSON); the sections add
them: ``rollouts`` ``decode.*`` (collect, HFPolicy's share, the replaced step and
``model.generate`` against the minimal KV-cache loop), ``env.*`` and ``collect.*``;
``learner`` ``learner.*`` and ``teacher.*``; ``retrieval`` ``retrieval.*`` and
``scaling.corpus=*``; ``scaling`` ``scaling.*``; ``engines`` ``engine.vllm.*`` (``--vllm``);
``runner`` ``collect.ray_workers_speedup`` and ``learner.ddp_step_ratio`` (``--scaleout``).

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
