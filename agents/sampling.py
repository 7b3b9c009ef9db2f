"""Sampling settings of the policies a spec builds: what a spec's query string
(``hf:smollm2?temperature=0.7&top_p=0.9``, per role too) and the command lines'
``--temperature``, ``--top-p`` and ``--max-new-tokens`` set, the default a model's own
generation config gives, and how result files record and compare them.

A spec's own settings win over the command line's, and those over the model's generation
config (greedy when it does not sample, as SmolLM2's; docs/benchmarks.md). The keys are
:data:`SAMPLING_KEYS`; an unknown key or a bad value is refused with one line naming the
spec, before anything loads. Kinds that do not sample (``scripted``, ``random``, ...) refuse
a query and ignore the command line's settings.

>>> parse_sampling("temperature=0.7&top_p=0.9", "hf:smollm2?temperature=0.7&top_p=0.9")
Sampling(temperature=0.7, top_p=0.9, max_new_tokens=None)
>>> describe_team({"leader": {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 256}})
'temperature 0 (greedy), max_new_tokens 256'
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

from envs.protocol import ROLES

SAMPLING_KEYS = ("temperature", "top_p", "max_new_tokens")
"""The settings a spec's query string and the command lines may give."""

DEFAULT_MAX_NEW_TOKENS = 256
"""An LM policy's cap on a turn when none is set (the env's own turn budget still applies)."""

LOGIT_BOUND = 1000.0
"""The largest next-token logit magnitude the temperature range allows for. Trained LMs' logits
stay far inside it (SmolLM2's within about 40; Gemma 2 caps them at 30)."""

FLOAT_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
             "float64": 1.7976931348623157e308}
"""``torch.finfo(dtype).max`` by dtype name (tests hold them equal; no torch import here)."""

SAMPLING_DTYPE = "float32"
"""The dtype the samplers here divide logits by the temperature in: ``agents.logprobs``'
``next_tokens`` and ``token_logprobs`` cast the logits to float32 first, whatever the
model's dtype, and vLLM samples in float32."""


def min_temperature(dtype: str = SAMPLING_DTYPE) -> float:
    """The smallest temperature above 0 for which ``logits / temperature`` stays finite in
    ``dtype`` for every logit within :data:`LOGIT_BOUND`: ``LOGIT_BOUND / finfo(dtype).max``
    (float32: 2.9e-36; float16: 0.0153). Below it a softmax over the scaled logits can hold
    inf and NaN, and sampling fails mid-episode."""
    if dtype not in FLOAT_MAX:
        raise ValueError(f"dtype must be one of {', '.join(FLOAT_MAX)}, got {dtype!r}")
    return LOGIT_BOUND / FLOAT_MAX[dtype]


def _value(key: str, text: str) -> float | int:
    """``text`` as the value of ``key``; ``ValueError`` saying what a good value is."""
    if key == "max_new_tokens":
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {text!r}")
        return value
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if key == "temperature" and not (math.isfinite(number) and number >= 0):
        raise ValueError(f"temperature must be a number >= 0 (0 is greedy), got {text!r}")
    if key == "temperature" and 0 < number < min_temperature():
        raise ValueError(
            f"temperature must be 0 (greedy) or at least {min_temperature():.3g}: logits up to "
            f"{LOGIT_BOUND:g} divided by it must stay finite in {SAMPLING_DTYPE} (at most "
            f"{FLOAT_MAX[SAMPLING_DTYPE]:.3g}), got {text!r}")
    if key == "top_p" and not (math.isfinite(number) and 0 < number <= 1):
        raise ValueError(f"top_p must be a number in (0, 1], got {text!r}")
    return number


@dataclass(frozen=True)
class Sampling:
    """Settings of an LM policy; None leaves one to the next source (the command line, then
    the model's generation config)."""

    temperature: float | None = None
    """0 is greedy."""
    top_p: float | None = None
    """The nucleus kept (1: all of it); ignored when greedy."""
    max_new_tokens: int | None = None
    """A cap on every turn, on top of the env's own turn budget."""

    def __post_init__(self) -> None:
        for key in SAMPLING_KEYS:
            value = getattr(self, key)
            if value is not None:  # checked, and kept as a float (an int for max_new_tokens)
                object.__setattr__(self, key, _value(key, str(value)))

    def over(self, fallback: Sampling | None) -> Sampling:
        """These settings, each unset one taken from ``fallback``."""
        if fallback is None:
            return self
        return Sampling(**{k: getattr(fallback, k) if getattr(self, k) is None else getattr(self, k)
                           for k in SAMPLING_KEYS})

    def record(self) -> dict[str, Any]:
        """``{"temperature", "top_p", "max_new_tokens"}``: what episodes and ``summary.json`` keep."""
        return {k: getattr(self, k) for k in SAMPLING_KEYS}


POLICY_DEFAULT = Sampling(temperature=1.0, top_p=1.0, max_new_tokens=DEFAULT_MAX_NEW_TOKENS)
"""What an LM policy samples with where nothing else is set."""


class SampledPolicy:
    """An LM policy's sampling settings, held as one :class:`Sampling` with every field set
    (``policy.sampling``); ``temperature``, ``top_p`` and ``max_new_tokens`` read it."""

    sampling: Sampling = POLICY_DEFAULT

    def _set_sampling(self, sampling: Sampling | None, **settings: Any) -> None:
        """Keywords set (not None) win over ``sampling``, which wins over :data:`POLICY_DEFAULT`;
        ``ValueError`` for a bad value (:class:`Sampling`'s checks)."""
        self.sampling = Sampling(**settings).over(sampling).over(POLICY_DEFAULT)

    temperature = property(lambda self: self.sampling.temperature, doc="0 is greedy.")
    top_p = property(lambda self: self.sampling.top_p, doc="The nucleus kept; ignored when greedy.")
    max_new_tokens = property(lambda self: self.sampling.max_new_tokens, doc="A cap on every turn.")


def split_query(sub: str) -> tuple[str, str | None]:
    """``("kind:arg", query or None)`` of one policy spec ``kind:arg?query``."""
    head, sep, query = sub.partition("?")
    return head, (query if sep else None)


def parse_sampling(query: str | None, spec: str) -> Sampling:
    """The :class:`Sampling` of a spec's query string ``key=value&key=value``;
    ``ValueError`` naming ``spec`` on an unknown or repeated key or a bad value."""
    if query is None:
        return Sampling()
    found: dict[str, float | int] = {}
    for pair in query.split("&"):
        key, sep, text = pair.partition("=")
        if key not in SAMPLING_KEYS:
            raise ValueError(f"{spec}: unknown sampling setting {key!r} (use {', '.join(SAMPLING_KEYS)}, "
                             "e.g. hf:smollm2?temperature=0.7&top_p=0.9)")
        if not sep:
            raise ValueError(f"{spec}: {key} needs a value, {key}=VALUE")
        if key in found:
            raise ValueError(f"{spec}: {key} is given twice")
        try:
            found[key] = _value(key, text)
        except ValueError as err:
            raise ValueError(f"{spec}: {err}") from None
    return Sampling(**found)


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """``--temperature``, ``--top-p`` and ``--max-new-tokens``, for every LM policy of the
    spec(s) whose own query does not set them."""
    def typed(key: str):
        def convert(text: str) -> float | int:
            try:
                return _value(key, text)
            except ValueError as err:
                raise argparse.ArgumentTypeError(str(err)) from None
        convert.__name__ = key  # argparse names the type in some messages
        return convert

    parser.add_argument("--temperature", type=typed("temperature"), default=None,
                        help="LM policies' temperature, 0 greedy (default: the model's generation config, "
                             "greedy when it does not sample; a spec's ?temperature= wins)")
    parser.add_argument("--top-p", type=typed("top_p"), default=None,
                        help="LM policies' nucleus top-p (default: the model's generation config, else 1)")
    parser.add_argument("--max-new-tokens", type=typed("max_new_tokens"), default=None,
                        help=f"LM policies' cap on a turn (default {DEFAULT_MAX_NEW_TOKENS}; the env's turn "
                             "budget still applies)")


def sampling_of_args(args: argparse.Namespace) -> Sampling:
    """The command line's :class:`Sampling` (:func:`add_sampling_arguments`)."""
    return Sampling(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens)


def generation_defaults(model: Any) -> tuple[float, float, str]:
    """``(temperature, top_p, source)`` of a transformers model's own generation config:
    its temperature and top-p when it samples (``do_sample``), else greedy (0, 1). Other
    fields (``top_k``, repetition penalties) are not applied by the policies here."""
    config = getattr(model, "generation_config", None)
    if config is not None and getattr(config, "do_sample", False):
        temperature, top_p = (getattr(config, k, None) for k in ("temperature", "top_p"))
        return (1.0 if temperature is None else float(temperature),
                1.0 if top_p is None else float(top_p), "generation_config")
    return 0.0, 1.0, "greedy (the generation config does not sample)"


def policy_settings(policy: Any) -> dict[str, Any] | None:
    """What one policy samples with: ``{"temperature", "top_p", "max_new_tokens"}`` (and
    ``"from"`` where known), or None for a policy that does not sample (scripted, ...)."""
    if isinstance(getattr(policy, "sampling", None), Sampling):
        record = policy.sampling.record()
    elif policy is None or not (hasattr(policy, "temperature") and hasattr(policy, "top_p")):
        return None
    else:  # a policy that keeps its settings as attributes (OpenAIPolicy: max_tokens)
        cap = getattr(policy, "max_new_tokens", getattr(policy, "max_tokens", None))
        record = {"temperature": float(policy.temperature), "top_p": float(policy.top_p),
                  "max_new_tokens": None if cap is None else int(cap)}
    source = getattr(policy, "sampling_source", None)
    if source:
        record["from"] = source
    return record


def team_settings(policy: Any) -> dict[str, dict[str, Any] | None]:
    """:func:`policy_settings` of the policy each role plays with (a
    :class:`agents.router.RoleRouter` routes roles to different ones): what
    ``summary.json`` and every episode record."""
    policy = getattr(policy, "acting_policy", policy)  # a rollout backend records what it wraps
    routed = getattr(policy, "policy_for", None)
    out: dict[str, dict[str, Any] | None] = {}
    for role in ROLES:
        try:
            out[role] = policy_settings(routed(role) if routed is not None else policy)
        except KeyError:  # a router without this role
            out[role] = None
    return out


def _key(record: dict[str, Any] | None) -> tuple | None:
    """What decides the tokens drawn: top-p means nothing when greedy."""
    if record is None:
        return None
    temperature = float(record.get("temperature", 1.0))
    return (temperature, 1.0 if temperature == 0 else float(record.get("top_p", 1.0)), record.get("max_new_tokens"))


def same_settings(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """True when two :func:`team_settings` records sample alike, or either is unknown (None:
    a result written before runs recorded them)."""
    if a is None or b is None:
        return True
    return all(_key(a.get(role)) == _key(b.get(role)) for role in set(a) | set(b))


def _describe_one(record: dict[str, Any] | None) -> str:
    if record is None:
        return "not sampled"
    temperature = float(record.get("temperature", 1.0))
    parts = ["temperature 0 (greedy)" if temperature == 0 else
             f"temperature {temperature:g}, top_p {float(record.get('top_p', 1.0)):g}"]
    if record.get("max_new_tokens") is not None:
        parts.append(f"max_new_tokens {record['max_new_tokens']}")
    return ", ".join(parts)


def describe_team(team: dict[str, Any] | None) -> str:
    """One line for a :func:`team_settings` record: the settings once when every role
    that samples shares them, else per role."""
    if team is None:
        return "settings not recorded"
    sampled = {role: r for role, r in team.items() if r is not None}
    if not sampled:
        return "no role samples"
    keys = {_key(r) for r in sampled.values()}
    if len(keys) == 1:
        return _describe_one(next(iter(sampled.values())))
    return "; ".join(f"{role} {_describe_one(r)}" for role, r in team.items())

