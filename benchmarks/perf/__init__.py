"""The performance suite: what mopd's machinery costs next to the limits, the minimal code
that does the same work.

    python -m benchmarks perf                       # tiny random Llama, full sizes
    python -m benchmarks perf --quick               # small sizes, under 3 minutes on 2 cores
    python -m benchmarks perf --model smollm2 --out perf-smollm2.json
    python -m benchmarks perf --quick --scaleout    # + Ray workers and torchrun ranks (issue 15)

Every timing figure is a ratio of two costs measured in the same run, interleaved, on one
thread (docs/performance.md says how, and what the bare and ``before`` sides are): cost ratios
are ``mopd / bare`` (above 1: mopd is slower by that factor), speedups ``slow / fast``, shares
fractions of one timed run. Each figure's ``what`` says what its A / B is. The model-bound
sections play ``--model`` (greedy, and sampled at the trainer's temperature and top-p), the
others the scripted team. A random model never writes a valid turn: Leader retries, then
Answerers.
"""

import os

# before transformers and sentence-transformers are first imported by a section
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
