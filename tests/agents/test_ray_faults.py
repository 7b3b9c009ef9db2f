"""The Ray rollout pool's fault paths without starting Ray (issue 28): a worker lost to any
of Ray's process- or node-loss errors is restarted and its group re-rolled (B10); the
retriever actor is pinned to the driver's node and a localhost retriever URL is refused on a
cluster of several nodes (B11); workers' logs reach the driver (C5)."""

import json
from types import SimpleNamespace

import pytest

ray = pytest.importorskip("ray")

from agents.ray_rollout import RayRolloutPool, check_retriever_url, lost_worker_errors  # noqa: E402

LOST = [ray.exceptions.OutOfMemoryError("Task was killed due to the node running low on memory."),
        ray.exceptions.NodeDiedError("the node of this worker died"),
        ray.exceptions.WorkerCrashedError(),
        ray.exceptions.ObjectLostError("ab" * 14, None, ""),
        ray.exceptions.ActorDiedError()]


HEAD = "1f" * 28
"""A node id (28 bytes in hex, as Ray checks)."""


def test_every_lost_worker_error_exists_in_ray_and_only_one_is_an_actor_error():
    errors = lost_worker_errors(ray)
    assert [e.__name__ for e in errors] == ["RayActorError", "OutOfMemoryError", "NodeDiedError",
                                            "WorkerCrashedError", "ObjectLostError"]
    assert [issubclass(e, ray.exceptions.RayActorError) for e in errors] == [True, False, False, False, False]
    assert not any(issubclass(ray.exceptions.RayTaskError, e) for e in errors)  # a bug stays a bug


class _FakeRay:
    """What ``RayRolloutPool.collect`` asks of Ray: each group answers an empty group, except
    that question ``fail_on``'s first attempt raises ``error`` from ``ray.get``."""

    exceptions = ray.exceptions

    def __init__(self, error, fail_on):
        self.error, self.fail_on, self.killed = error, fail_on, []

    def wait(self, refs, num_returns=1, timeout=None):
        return refs[:1], refs[1:]

    def get(self, ref):
        if ref.question == self.fail_on and self.error is not None:
            error, self.error = self.error, None
            raise error
        return json.dumps([[]])

    def kill(self, actor, no_restart=True):
        self.killed.append(actor)


class _Ref:  # an ObjectRef: hashable, knows which group it answers
    def __init__(self, worker, question):
        self.worker, self.question = worker, question


def _pool(fake_ray, workers=2):
    started = []

    def start(*args):
        actor = SimpleNamespace(n=len(started))
        actor.rollout = SimpleNamespace(remote=lambda version, weights, q, i, g, seed: _Ref(actor.n, i))
        started.append(actor)
        return actor

    pool = object.__new__(RayRolloutPool)  # its state without ray.init or actors
    pool.ray, pool.num_workers, pool.timeout_s, pool.max_restarts = fake_ray, workers, 60.0, 2 * workers
    pool._actor_class, pool._args = SimpleNamespace(remote=start), ()
    pool.workers = [start() for _ in range(workers)]
    pool.version, pool._weights, pool.restarts_total, pool.last_stats = 0, None, 0, {}
    return pool, started


@pytest.mark.parametrize("error", LOST, ids=lambda e: type(e).__name__)
def test_a_worker_lost_to_any_of_rays_loss_errors_is_restarted_and_its_group_rerolled(error):
    """B10: Ray's memory monitor killing a worker raises OutOfMemoryError, not a
    RayActorError; it (and a dead node, a crashed worker, a lost result) restarts the worker."""
    fake = _FakeRay(error, fail_on=1)
    pool, started = _pool(fake)
    groups = pool.collect(["q0", "q1", "q2"], 2, seed=0)
    assert groups == [[], [], []]
    assert pool.last_stats["rollout/worker_restarts"] == 1 and pool.last_stats["rollout/rerolled_groups"] == 1
    assert len(started) == 3 and pool.workers[1] is started[2]  # worker 1 (it held question 1) was replaced


def test_a_bug_in_a_worker_still_stops_the_batch():
    cause = ValueError("a bug")
    error = ray.exceptions.RayTaskError("rollout", "Traceback ...", cause)
    pool, _ = _pool(_FakeRay(error, fail_on=0))
    with pytest.raises(RuntimeError, match="rollout worker 0 failed on question 0"):
        pool.collect(["q0"], 2, seed=0)


def test_a_localhost_retriever_url_is_refused_on_a_cluster_of_several_nodes():
    for url in ("http://localhost:8000", "http://127.0.0.1:8000/retrieve", "https://[::1]:9000"):
        with pytest.raises(ValueError, match="the Ray cluster has 2 nodes"):
            check_retriever_url(url, nodes=2)
        check_retriever_url(url, nodes=1)  # one machine: localhost is the server's machine
    check_retriever_url("http://10.0.0.5:8000", nodes=3)


def test_the_retriever_actor_lives_on_the_drivers_node_and_workers_logs_are_shown(monkeypatch):
    """B11 + C5: the RetrieverActor is pinned (not soft) to the driver's node, where the
    retriever spec's files are; ray.init keeps log_to_driver (a worker's traceback shows)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    made, inits = [], []

    def remote(**options):
        def wrap(cls):
            made.append((cls.__name__, options))
            return SimpleNamespace(remote=lambda *args, **kwargs: SimpleNamespace(of=cls.__name__))
        return wrap

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: inits.append(kwargs))
    monkeypatch.setattr(ray, "remote", remote)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: HEAD))
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True}, {"Alive": True}, {"Alive": False}])
    monkeypatch.setattr(ray, "put", lambda value: "ref")
    model = SimpleNamespace(config=None, state_dict=dict)
    RayRolloutPool(1, model=model, tokenizer=None, env_kwargs={}, retriever="/data/corpus.jsonl",
                   address="auto")
    assert inits == [{"address": "auto"}]
    name, options = made[0]
    strategy = options["scheduling_strategy"]
    assert name == "RetrieverActor" and options["num_cpus"] == 0
    assert isinstance(strategy, NodeAffinitySchedulingStrategy)
    assert (strategy.node_id, strategy.soft) == (HEAD, False)
    with pytest.raises(ValueError, match="cluster has 2 nodes"):
        RayRolloutPool(1, model=model, tokenizer=None, env_kwargs={}, retriever="http://localhost:8000")
