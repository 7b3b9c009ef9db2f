"""Transformers' progress bars, off inside a block.

``from_pretrained`` prints ``Loading weights`` and ``save_pretrained`` prints ``Writing model
shards`` as tqdm bars; from a trainer that loads a Teacher and saves checkpoints, they land
in the middle of its log as unexplained noise. The bars come back afterwards if they were on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
