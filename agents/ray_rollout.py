"""Rollout workers on Ray: N actors that each hold env copies, a policy backend and a client of
one shared retriever, and return the same :class:`~envs.episode.Episode` records as
:func:`agents.collect.collect` (``pip install -e .[distributed]``).

A question group is the unit of work, sampled with its own seed (:func:`group_seed`), so the
pool equals :func:`collect_groups` in one process, token for token, whatever the number of
workers; a worker that dies (:func:`lost_worker_errors`) or hangs past ``timeout_s`` is
restarted and its group rolled again. How the weights, the retriever and a cluster's nodes
take part: docs/scaleout.md, "Rollout workers".

>>> pool = RayRolloutPool(2, model=model, tokenizer=tok, env_kwargs=kw, retriever=r)  # doctest: +SKIP
>>> pool.push_weights(model); groups = pool.collect(questions, 5, seed=0)             # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from agents.backends import make_backend, reseed
from agents.collect import collect
from agents.extras import require
from envs.episode import Episode, groups_from_dicts, groups_to_dicts
from envs.retrieval.passage import Passage
from envs.team import Question

__all__ = ["ActorRetriever", "RayRolloutPool", "RetrieverActor", "RolloutWorker", "check_retriever_url",
           "collect_groups", "group_seed", "lost_worker_errors", "require_ray", "reseed"]

DISTRIBUTED_EXTRA = "pip install -e '.[distributed]'  (or: pip install ray)"


def require_ray() -> Any:
    """The ``ray`` module, or ImportError in one line naming the install."""
    return require("ray", "rollout_workers", DISTRIBUTED_EXTRA)


LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0")
"""Host names that mean "this machine", wherever the URL is read."""


def lost_worker_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """What ``ray.get`` raises when a worker's process or node is gone rather than its code
    wrong (only the first is a ``RayActorError``; the others are plain ``RayError`` subclasses)."""
    names = ("RayActorError", "OutOfMemoryError", "NodeDiedError", "WorkerCrashedError", "ObjectLostError")
    return tuple(getattr(ray.exceptions, name) for name in names)


def check_retriever_url(url: str, nodes: int) -> None:
    """Refuse a ``localhost`` retriever URL on a cluster of ``nodes`` > 1 nodes: workers on
    the other nodes would reach their own machine, not the server."""
    from urllib.parse import urlparse

    host = urlparse(url).hostname or ""
    if nodes > 1 and host in LOCAL_HOSTS:
        raise ValueError(f"retriever={url}: the Ray cluster has {nodes} nodes, and a worker on another node "
                         f"would look for the retrieval server on its own machine ({host}); give the "
                         "head node's address that the other nodes reach")


def group_seed(seed: int, index: int) -> int:
    """The sampler seed of question group ``index`` of a batch collected with ``seed``."""
    return (int(seed) * 1_000_003 + 7_919 * (int(index) + 1)) % (2**63 - 1)


def collect_groups(env_fn: Callable[[], Any], policy: Any, questions: Sequence[Any], group_size: int,
                   *, seed: int = 0, first_index: int = 0) -> list[list[Episode]]:
    """What the pool computes, in one process: each question's group alone, its sampler
    reseeded with ``group_seed(seed, first_index + i)`` and its copies reset with the seeds
    ``collect(..., seed=seed)`` gives question ``first_index + i`` of a batch."""
    out: list[list[Episode]] = []
    for i, question in enumerate(questions):
        index = first_index + i
        reseed(policy, group_seed(seed, index))
        out += collect(env_fn, policy, [question], group_size, seed=seed + index * group_size)
    return out


class RetrieverActor:
    """Holds the one retriever every worker searches (run as a Ray actor). Queries (model
    text) and passages (corpus text) cross the process boundary as JSON text."""

    def __init__(self, retriever: Any, index: str | None = None):
        if isinstance(retriever, str):
            from envs.retrieval.factory import make_retriever

            retriever = make_retriever(retriever, index=index)
        self.retriever = retriever

    def search(self, queries_json: str, top_k: int = 3) -> str:
        results = self.retriever.search(list(json.loads(queries_json)), top_k)
        return json.dumps([[dataclasses.asdict(p) for p in hits] for hits in results])


class ActorRetriever:
    """A worker's client of a :class:`RetrieverActor`: the ``Retriever`` protocol over Ray."""

    def __init__(self, actor: Any, timeout_s: float = 300.0):
        self.actor, self.timeout_s = actor, timeout_s

    def search(self, queries: Sequence[str], top_k: int = 3) -> list[list[Passage]]:
        import ray

        answer = ray.get(self.actor.search.remote(json.dumps(list(queries)), top_k), timeout=self.timeout_s)
        return [[Passage(**p) for p in hits] for hits in json.loads(answer)]


def questions_to_json(questions: Sequence[Any]) -> str:
    """``questions`` (``QAItem``, :class:`envs.team.Question` or plain text) as JSON text:
    the form in which dataset-written text reaches a worker (Ray would pickle objects)."""
    return json.dumps([dataclasses.asdict(Question.of(q)) for q in questions])


def questions_from_json(text: str) -> list[Question]:
    """The inverse of :func:`questions_to_json`."""
    return [Question(d["id"], d["question"], tuple(d["golden_answers"]), d["dataset"]) for d in json.loads(text)]


class RolloutWorker:
    """One rollout worker (run as a Ray actor; plain Python, so tests can call it directly).

    ``model_config``: the ``transformers`` config of the trained model (a model of that
    architecture is built here, and :meth:`rollout` loads the weights it is sent);
    ``env_kwargs``: SearchTeam keyword arguments (workflow, env shape) without the tokenizer
    and retriever; ``retriever``: an object with ``search``, or a retriever spec
    (``envs.retrieval.make_retriever``: a URL reaches the retrieval server)."""

    def __init__(self, model_config: Any, tokenizer: Any, env_kwargs: dict[str, Any], retriever: Any,
                 backend: str = "hf", policy_kwargs: dict[str, Any] | None = None, threads: int = 1):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)  # one thread per process: workers share the cores
        self.model = AutoModelForCausalLM.from_config(model_config)
        self.model.eval()
        self.tokenizer = tokenizer
        self.env_kwargs = dict(env_kwargs)
        if isinstance(retriever, str):
            from envs.retrieval.factory import make_retriever

            retriever = make_retriever(retriever)
        self.retriever = retriever
        self.policy = make_backend(backend, self.model, tokenizer, **(policy_kwargs or {}))
        self.version = -1

    def pid(self) -> int:
        return os.getpid()

    def load_weights(self, version: int, state: dict[str, Any]) -> None:
        """Take the trainer's weights ``state`` (a state dict) as version ``version``: into
        the backend (HF: this worker's model; an engine: its own copy)."""
        self.policy.load_weights(state.items())
        self.version = version

    def rollout(self, version: int, weights: list[Any], questions_json: str, first_index: int,
                group_size: int, seed: int) -> str:
        """The groups of the questions in ``questions_json`` (batch indices from
        ``first_index``) under weights ``version``, as JSON text (``groups_to_dicts``: text
        crosses processes as JSON, never pickled). ``weights``: ``[ObjectRef]`` of that
        version's state dict, fetched only when this worker holds another version."""
        if version != self.version:
            import ray

            self.load_weights(version, ray.get(weights[0]))
        from envs import env_fn

        questions = questions_from_json(questions_json)
        make_env = env_fn(tokenizer=self.tokenizer, retriever=self.retriever, questions=questions,
                          **self.env_kwargs)
        groups = collect_groups(make_env, self.policy, questions, group_size, seed=seed,
                                first_index=first_index)
        return json.dumps(groups_to_dicts(groups))


class RayRolloutPool:
    """``num_workers`` :class:`RolloutWorker` actors and the shared retriever.

    ``model``, ``tokenizer``: the trained model (its config builds the workers' copies;
    :meth:`push_weights` sends its weights); ``env_kwargs``: SearchTeam keyword arguments
    without tokenizer and retriever; ``retriever``: an http(s) URL (each worker is a client
    of that server), a retriever spec or object (held once, by a :class:`RetrieverActor`);
    ``backend``, ``policy_kwargs``: the workers' backend (``agents.backends.make_backend``); ``address``:
    ``ray.init``'s (None: a local Ray; ``auto``: the cluster of ``ray start``);
    ``timeout_s``: how long a group may take before its worker counts as hung;
    ``max_restarts``: restarts allowed in one :meth:`collect` before it raises;
    ``retriever_index``: the index kind of a spec's local corpus (``make_retriever``), so
    the workers search the index the trainer's own validation searches."""

    def __init__(self, num_workers: int, *, model: Any, tokenizer: Any, env_kwargs: dict[str, Any],
                 retriever: Any, backend: str = "hf", policy_kwargs: dict[str, Any] | None = None,
                 address: str | None = None, threads: int = 1, timeout_s: float = 900.0,
                 max_restarts: int | None = None, num_gpus: float = 0.0, retriever_index: str | None = None):
        ray = require_ray()
        if num_workers < 1:
            raise ValueError(f"rollout_workers must be >= 1 for a pool, got {num_workers}")
        if not ray.is_initialized():
            if address is None:  # a local Ray with room for every worker even on a small machine
                ray.init(num_cpus=max(os.cpu_count() or 1, num_workers), include_dashboard=False)
            else:  # (workers' logs reach the driver: a worker's traceback is not hidden)
                ray.init(address=address)
        self.ray = ray
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.max_restarts = 2 * num_workers if max_restarts is None else max_restarts
        if isinstance(retriever, str) and retriever.startswith(("http://", "https://")):
            check_retriever_url(retriever, sum(1 for node in ray.nodes() if node.get("Alive")))
            self.retriever_actor, shared = None, retriever
        else:  # on the driver's node: the spec's corpus (or model cache) is a path on this machine
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
            self.retriever_actor = ray.remote(num_cpus=0, scheduling_strategy=here)(RetrieverActor).remote(
                retriever, retriever_index)
            shared = ActorRetriever(self.retriever_actor)
        self._args = (model.config, tokenizer, dict(env_kwargs), shared, backend, dict(policy_kwargs or {}),
                      threads)
        self._actor_class = ray.remote(num_cpus=1, num_gpus=num_gpus, max_restarts=0)(RolloutWorker)
        self.workers = [self._actor_class.remote(*self._args) for _ in range(num_workers)]
        self.version = -1
        self._weights: Any = None
        self.last_stats: dict[str, float] = {}
        self.push_weights(model)

    def push_weights(self, model: Any) -> int:
        """Put ``model``'s weights in the object store as the next version (workers fetch it
        on their next group); returns that version."""
        state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        self._weights = self.ray.put(state)
        self.version += 1
        return self.version

    def collect(self, questions: Sequence[Any], group_size: int, *, seed: int = 0) -> list[list[Episode]]:
        """The Episodes of ``group_size`` workflows per question, grouped by question: equal
        to ``collect_groups(env_fn, policy, questions, group_size, seed=seed)`` in one process
        with the pushed weights. Groups go to idle workers one at a time (the slow ones hold
        up no one)."""
        ray = self.ray
        lost_worker = lost_worker_errors(ray)
        results: list[list[Episode] | None] = [None] * len(questions)
        queue = list(range(len(questions)))
        idle = list(range(self.num_workers))
        pending: dict[Any, tuple[int, int]] = {}  # ObjectRef -> (worker, question index)
        restarts = 0  # each restart re-rolls the group its worker held
        started = time.perf_counter()
        while queue or pending:
            while queue and idle:
                w, i = idle.pop(0), queue.pop(0)
                ref = self.workers[w].rollout.remote(self.version, [self._weights],
                                                     questions_to_json([questions[i]]), i, group_size, seed)
                pending[ref] = (w, i)
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=self.timeout_s)
            if not ready:  # nobody answered in time: every busy worker counts as hung
                lost = list(pending.items())
                pending.clear()
                for _, (w, _i) in lost:
                    ray.kill(self.workers[w], no_restart=True)
            else:
                lost = []
                for ref in ready:
                    w, i = pending.pop(ref)
                    try:
                        results[i] = groups_from_dicts(json.loads(ray.get(ref)))[0]
                        idle.append(w)
                    except lost_worker:  # its process or node is gone, not its code wrong
                        lost.append((ref, (w, i)))
                    except ray.exceptions.RayTaskError as err:  # a bug, not a lost process: stop
                        raise RuntimeError(f"rollout worker {w} failed on question {i} "
                                           f"({getattr(questions[i], 'id', '?')}): {err.cause!r}") from None
            for _, (w, i) in lost:
                restarts += 1
                if restarts > self.max_restarts:
                    raise RuntimeError(f"rollout workers died {restarts} times in one batch (the last: worker "
                                       f"{w} on question {i}); giving up instead of retrying forever")
                self.workers[w] = self._actor_class.remote(*self._args)
                idle.append(w)
                queue.insert(0, i)
        self.last_stats = {"rollout/worker_restarts": float(restarts),
                           "rollout/rerolled_groups": float(restarts),
                           "rollout/workers": float(self.num_workers),
                           "perf/ray_collect_s": time.perf_counter() - started}
        return results  # type: ignore[return-value]

    def kill_worker(self, w: int) -> None:
        """Kill worker ``w``'s process (tests and fault drills: the next group it holds is
        re-rolled elsewhere)."""
        self.ray.kill(self.workers[w], no_restart=True)

    def shutdown(self) -> None:
        """Stop the workers and the retriever actor (Ray itself stays up)."""
        for w in self.workers:
            self.ray.kill(w, no_restart=True)
        if self.retriever_actor is not None:
            self.ray.kill(self.retriever_actor, no_restart=True)
        self.workers = []
