"""The one contract of a learner's rollout generator, :class:`RolloutBackend` (act, take the
trainer's weights, sleep and wake, keep the sampler's state, close), and the one table that
names them, :data:`BACKENDS`; docs/scaleout.md, "The rollout backend", compares them. The Ray
pool is not a row: each of its workers builds its own backend from the table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from agents.base import Action, Observation
from agents.vllm_policy import VLLMPolicy

__all__ = ["BACKENDS", "HFBackend", "PolicyBackend", "RolloutBackend", "as_backend", "make_backend",
           "reseed"]


@runtime_checkable
class RolloutBackend(Protocol):
    """What generates a learner's rollouts."""

    can_sleep: bool
    """Whether :meth:`sleep` releases device memory (an engine with its own copy of the
    weights); False: sleep and wake_up do nothing."""

    def act(self, observations: Sequence[Observation]) -> list[Action]:
        """One action per observation, in order (wakes a sleeping engine first)."""

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Take the trainer's ``(name, tensor)`` pairs (Hugging Face names); wakes a
        sleeping engine."""

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...

    def reseed(self, seed: int) -> None:
        """Restart the sampler at ``seed``."""

    def get_state(self) -> Any:
        """The sampler's state (a checkpoint keeps it); :meth:`set_state` restores it."""

    def set_state(self, state: Any) -> None: ...

    def close(self) -> None:
        """Free the engine and what it holds; the backend cannot act after it."""


def reseed(policy: Any, seed: int) -> None:
    """Restart ``policy``'s sampler at ``seed``: its ``reseed(seed)`` method, or the
    ``torch.Generator`` an :class:`~agents.hf.HFPolicy` samples with."""
    if hasattr(policy, "reseed"):
        policy.reseed(seed)
    elif hasattr(policy, "generator"):
        policy.generator.manual_seed(seed)
    else:
        raise TypeError(f"{type(policy).__name__} has neither reseed(seed) nor a generator: its "
                        "samples cannot be made independent of which process draws them")


class PolicyBackend:
    """Any object with ``act`` (a scripted team, a policy a test injects) as a backend: it
    generates with what it holds, takes no weights, never sleeps; its ``reseed``,
    ``get_state`` and ``set_state`` are used where it has them."""

    can_sleep = False

    def __init__(self, policy: Any):
        self.policy = policy

    acting_policy = property(lambda self: self.policy, doc="What acts (episodes record its sampling).")

    def act(self, observations: Sequence[Observation]) -> list[Action]:
        return self.policy.act(observations)

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Nothing to load: the policy holds its own weights (or none)."""

    def sleep(self) -> None:
        """Nothing to release: the model is the policy's (the trainer's, a worker's) own."""

    def wake_up(self) -> None:
        """Nothing to retake."""

    def reseed(self, seed: int) -> None:
        reseed(self.policy, seed)

    def get_state(self) -> Any:
        get = getattr(self.policy, "get_state", None)
        return get() if get is not None else None

    def set_state(self, state: Any) -> None:
        set_ = getattr(self.policy, "set_state", None)
        if set_ is not None and state is not None:
            set_(state)

    def close(self) -> None:
        self.policy = None


class HFBackend(PolicyBackend):
    """:class:`agents.hf.HFPolicy` on the model object it is given: the trainer's own model
    (its weights are the trained ones: :meth:`load_weights` finds nothing to copy) or a Ray
    worker's copy (the weights are copied in). ``sampling`` goes to HFPolicy; its sampler is
    the policy's ``torch.Generator``."""

    def __init__(self, model: Any, tokenizer: Any, **sampling: Any):
        from agents.hf import HFPolicy

        super().__init__(HFPolicy(model, tokenizer, **sampling))

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        import torch

        own = self.policy.model.state_dict()  # views of the model's own tensors
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in own:
                    raise KeyError(f"{name!r} is not a weight of the {type(self.policy.model).__name__} "
                                   "this backend generates with")
                if own[name].data_ptr() != tensor.data_ptr():  # the same storage: already these weights
                    own[name].copy_(tensor)

    def get_state(self) -> Any:
        return self.policy.generator.get_state()

    def set_state(self, state: Any) -> None:
        self.policy.generator.set_state(state)


BACKENDS: dict[str, type] = {"hf": HFBackend, "vllm": VLLMPolicy}
"""``rollout_backend`` -> the class that generates. Each takes
``(model, tokenizer, **settings)``: ``model`` a model object for ``hf``, a directory for
``vllm`` (the engine reads the files itself)."""


def make_backend(name: str, model: Any, tokenizer: Any, **settings: Any) -> RolloutBackend:
    """The :data:`BACKENDS` row ``name`` built with ``settings`` (sampling: ``temperature``,
    ``top_p``, ``max_new_tokens``, ``seed``, ``batch_size``; vLLM's engine settings too)."""
    if name not in BACKENDS:
        raise ValueError(f"rollout backend {name!r} is not one of {tuple(BACKENDS)}")
    return BACKENDS[name](model, tokenizer, **settings)


def as_backend(policy: Any) -> RolloutBackend:
    """``policy`` itself when it keeps the whole contract, else wrapped in
    :class:`PolicyBackend` (an object with ``act`` only)."""
    return policy if isinstance(policy, RolloutBackend) else PolicyBackend(policy)
