"""The episode viewer: one self-contained HTML page of an episode, token by token.

    python -m agents view FILE [--index N] [--compare FILE2 [--compare-index M]]
                               [--out page.html] [--tokenizer NAME] [--serve]

``FILE``: episodes (``play --save``, ``collect(out=...)``, a benchmark run's
``episodes.jsonl``) or the learner's samples
(``<run>/samples/step_NNNNNN.jsonl``, ``val_step_NNNNNN.jsonl``), whose per-token values
(advantage, Teacher log-ratio, old log-prob, loss and KL masks) colour the tokens. The
format: :mod:`agents.viewer.records`; the page: :mod:`agents.viewer.page`.
"""

from __future__ import annotations

from agents.viewer.cli import add_view_parser, view, write_page
from agents.viewer.page import render_page
from agents.viewer.records import (
    EpisodeValues,
    SegmentValues,
    ViewError,
    read_records,
    sample_line,
    tokenizer_record,
)

__all__ = ["EpisodeValues", "SegmentValues", "ViewError", "add_view_parser", "read_records", "render_page",
           "sample_line", "tokenizer_record", "view", "write_page"]
