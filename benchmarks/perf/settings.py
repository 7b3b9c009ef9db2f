"""The sizes of one perf run: ``PerfSettings``, its presets (``full``, ``quick``, ``test``)
and the names ``--model`` takes."""

from __future__ import annotations

from dataclasses import dataclass

MODELS = ("random", "smollm2", "micro")
INDEX_KINDS = ("flat", "hnsw", "ivf")


@dataclass(frozen=True)
class PerfSettings:
    """The sizes of one perf run (see ``PRESETS``)."""

    model: str = "random"
    """``random`` (an untrained Llama, hidden 64, 2 layers, the env's 49k vocabulary; not
    the ``tiny`` recipe's SFT model), ``smollm2`` or ``micro``."""
    reps: int = 5
    """Timed A/B pairs per figure, after one untimed warm-up of each side."""
    questions: int = 4
    group_size: int = 4
    """The model-bound rollouts run ``questions x group_size`` env copies side by side."""
    max_turn_tokens: int = 32
    """Turn budget of the model-bound rollouts (a random model always fills it)."""
    num_candidates: int = 5
    """Answerers in the model-bound rollouts."""
    rows: int = 32
    """Training rows (agent contexts from scripted episodes) for the learner sections; the
    memory slope is taken between half of them and all of them."""
    max_row_tokens: int = 1024
    queries: int = 64
    """Search queries per retrieval call."""
    scaling_questions: int = 2
    group_sizes: tuple[int, ...] = (2, 4, 8)
    waves: tuple[int, ...] = (1, 2, 3)
    searchers: tuple[int, ...] = (1, 2, 3)
    scaling_group_size: int = 2
    """G of the waves and Searchers runs."""
    corpus_sizes: tuple[int, ...] = (100_000, 1_000_000)
    """Passage counts of the flat-index runs (random vectors; see ``benchmarks.perf.retrieval``)."""
    approximate: tuple[tuple[str, int], ...] = (("ivf", 100_000), ("hnsw", 100_000), ("ivf", 1_000_000))
    """(index kind, passages) pairs measured against flat; each size must be in ``corpus_sizes``
    (building HNSW over 100k passages takes minutes on one core, IVF seconds)."""
    recall_queries: int = 300
    """At most this many questions per corpus for recall (spread over its question list)."""
    realdata: str | None = None
    """Folder of the real corpora (``corpora/*.jsonl`` and question files) for recall; None:
    ``../shared/realdata`` beside the project when it exists; "": none."""
    seed: int = 0
    threads: int = 1
    """torch's and faiss's intra-op threads during the run (``algos.reproducible.run_threads``;
    one: two threads on busy cores wait on each other and blur the ratios)."""

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"PerfSettings.model={self.model!r}: must be one of {MODELS}")
        for name in ("reps", "questions", "group_size", "max_turn_tokens", "num_candidates", "rows",
                     "max_row_tokens", "queries", "scaling_questions", "scaling_group_size", "recall_queries",
                     "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"PerfSettings.{name}={getattr(self, name)!r}: must be >= 1")
        for name in ("group_sizes", "waves", "searchers", "corpus_sizes"):
            values = getattr(self, name)
            if len(values) < 2 or min(values) < 1:
                raise ValueError(f"PerfSettings.{name}={values!r}: give two or more settings, each >= 1")
        for kind, size in self.approximate:
            if kind not in INDEX_KINDS[1:] or size not in self.corpus_sizes:
                raise ValueError(f"PerfSettings.approximate has ({kind!r}, {size}): the kind must be "
                                 f"hnsw or ivf and the size one of corpus_sizes {self.corpus_sizes}")


PRESETS: dict[str, PerfSettings] = {
    "full": PerfSettings(),
    # under 3 minutes on 2 busy cores with the tiny model
    "quick": PerfSettings(reps=3, max_turn_tokens=8, num_candidates=2, rows=16,
                          max_row_tokens=768, queries=32, scaling_questions=1,
                          group_sizes=(2, 4), waves=(1, 2), searchers=(1, 3),
                          approximate=(("ivf", 100_000),)),
    # the smallest run that still measures every figure (tests)
    "test": PerfSettings(reps=2, questions=2, group_size=4, max_turn_tokens=4, num_candidates=1,
                         rows=4, max_row_tokens=256, queries=8, scaling_questions=1,
                         group_sizes=(1, 2), waves=(1, 2), searchers=(1, 2), scaling_group_size=1,
                         corpus_sizes=(300, 1200), approximate=(("ivf", 1200), ("hnsw", 1200)),
                         recall_queries=40, realdata=""),
}
