"""Parameters a model declares frozen, and the one mechanism that keeps them frozen through
every update (SFT and RL).

A model declares, in its config under ``mopd_frozen`` (saved with ``save_pretrained``, so a
checkpoint carries it), the parameters or parts of parameters no update may change. Each
entry is a parameter name pattern (``fnmatch`` over ``model.named_parameters()``, tied
names included), optionally followed by an index of up to as many comma-separated slices or
integers as the parameter has dimensions::

    model.layers.0.*                              every parameter of layer 0
    model.embed_tokens.weight[:, 192:256]         columns 192..255 of every row
    model.layers.1.self_attn.q_proj.weight[0:32]  rows 0..31 (one head's queries)

Inside :func:`frozen`, a gradient hook zeroes the gradient of every declared element. With
AdamW and no weight decay, a gradient that is always zero leaves a weight exactly where it
was (its moments stay zero); every other weight trains as usual. A model with no declaration
trains whole: the learner needs to know nothing about why a recipe froze what it froze.

>>> declare_frozen(model, ["model.layers.0.*"])   # doctest: +SKIP
>>> with frozen(model):                            # doctest: +SKIP
...     loss.backward(); optimizer.step()
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
from collections.abc import Iterator, Sequence
from typing import Any

import torch

FROZEN_KEY = "mopd_frozen"
"""The config attribute that holds a model's frozen-parameter declaration (a list of str)."""

_ENTRY = re.compile(r"^\s*([^\[\]\s]+)\s*(?:\[([^\[\]]*)\])?\s*$")
_INDEX_PART = re.compile(r"^\s*(-?\d+)?\s*(:)?\s*(-?\d+)?\s*$")


def declared_frozen(model: Any) -> list[str]:
    """The model's declaration (``model.config.mopd_frozen``); ``[]`` when it has none."""
    entries = getattr(getattr(model, "config", None), FROZEN_KEY, None) or []
    if isinstance(entries, str) or not all(isinstance(e, str) for e in entries):
        raise ValueError(f"config.{FROZEN_KEY} must be a list of str, got {entries!r}")
    return list(entries)


def declare_frozen(model: Any, entries: Sequence[str]) -> Any:
    """Write ``entries``, each checked against ``model``'s parameters (ValueError naming the
    first bad one), into ``model.config.mopd_frozen``, replacing any; returns ``model``."""
    entries = [str(e) for e in entries]
    _masks(model, entries)  # validates
    setattr(model.config, FROZEN_KEY, entries)
    return model


def frozen_masks(model: Any) -> dict[str, torch.Tensor]:
    """For every parameter with a declared frozen part: its name (the first of its tied
    names) -> a mask shaped like it, 0 where frozen, 1 where it trains."""
    masks = _masks(model, declared_frozen(model))
    names = {}
    for name, param in model.named_parameters():
        names.setdefault(id(param), name)
    return {names[key]: mask for key, (_, mask) in masks.items()}


@contextlib.contextmanager
def frozen(model: Any) -> Iterator[None]:
    """Inside the block (an update's backwards and optimizer steps), gradients never reach
    what ``model`` declares frozen; outside it, nothing is changed."""
    masks = _masks(model, declared_frozen(model))
    handles = [param.register_hook(lambda grad, m=mask: grad * m) for param, mask in masks.values()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _masks(model: Any, entries: Sequence[str]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """id(parameter) -> (parameter, 0/1 mask) for the parameters ``entries`` touch."""
    named = list(model.named_parameters(remove_duplicate=False))
    masks: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for entry in entries:
        match = _ENTRY.match(entry)
        if match is None:
            raise ValueError(f"config.{FROZEN_KEY} entry {entry!r}: expected a parameter name "
                             "pattern, optionally followed by [slices], e.g. 'model.layers.0.*' "
                             "or 'model.embed_tokens.weight[:, 192:256]'")
        pattern, index_text = match.groups()
        hits = [p for name, p in named if fnmatch.fnmatchcase(name, pattern)]
        if not hits:
            raise ValueError(f"config.{FROZEN_KEY} entry {entry!r} matches no parameter of "
                             f"{type(model).__name__}")
        for param in hits:
            index = _index(entry, index_text, tuple(param.shape))
            masks.setdefault(id(param), (param, torch.ones_like(param)))[1][index] = 0
    return masks


def _index(entry: str, text: str | None, shape: tuple[int, ...]) -> tuple[Any, ...]:
    """The parsed ``[...]`` part of ``entry`` for a parameter of ``shape``; every bound
    checked (torch would silently clip a slice that runs past the end)."""
    if text is None:
        return (slice(None),)
    parts = text.split(",")
    if len(parts) > len(shape):
        raise ValueError(f"config.{FROZEN_KEY} entry {entry!r}: {len(parts)} indices for a "
                         f"parameter of shape {list(shape)}")
    index: list[Any] = []
    for part, size in zip(parts, shape):
        match = _INDEX_PART.match(part)
        start, colon, stop = match.groups() if match else (None, None, None)
        if match is None or (not colon and (start is None or stop is not None)):
            raise ValueError(f"config.{FROZEN_KEY} entry {entry!r}: cannot read index {part.strip()!r}"
                             " (expected an integer or start:stop)")
        lo = None if start is None else int(start)
        hi = None if stop is None else int(stop)
        if not colon:
            if not -size <= lo < size:
                raise ValueError(f"config.{FROZEN_KEY} entry {entry!r}: index {lo} is outside a "
                                 f"dimension of size {size}")
            index.append(lo)
            continue
        for bound in (lo, hi):
            if bound is not None and not -size <= bound <= size:
                raise ValueError(f"config.{FROZEN_KEY} entry {entry!r}: bound {bound} is outside "
                                 f"a dimension of size {size}")
        index.append(slice(lo, hi))
    return tuple(index)
