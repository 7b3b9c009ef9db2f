"""The Trainer and the pipeline with one rollout backend (issue 28): a vLLM engine behind
the fake of tests/fake_vllm.py (its default engine a spawned process that refuses tensors;
generate refused while asleep; one sleep-mode engine per process) gets the run's engine
settings, is awake for the rollout after a skipped step, and is closed before the next
stage's is built; vLLM under torchrun is refused before anything builds."""

import os
import weakref
from pathlib import Path

import pytest
from conftest import make_trainer

from agents.backends import BACKENDS, HFBackend, PolicyBackend, RolloutBackend, as_backend
from agents.registry import ROLLOUT_BACKENDS
from agents.vllm_policy import VLLMPolicy
from algos.config import TrainConfig
from algos.trainer import NonFiniteLoss


def test_one_table_names_every_backend_and_each_keeps_the_contract(tmp_path, tiny_dirs):
    assert BACKENDS == {"hf": HFBackend, "vllm": VLLMPolicy} and ROLLOUT_BACKENDS == ("hf", "vllm")
    trainer = make_trainer(tmp_path, tiny_dirs)
    assert isinstance(trainer.backend, HFBackend) and isinstance(trainer.backend, RolloutBackend)
    assert trainer.policy is trainer.backend and not trainer.engine_sleeps
    # HF on the trainer's own model: the weights are already there, nothing is copied
    before = {n: p.data_ptr() for n, p in trainer.full_model.named_parameters()}
    trainer.backend.load_weights(trainer.full_model.named_parameters())
    assert {n: p.data_ptr() for n, p in trainer.full_model.named_parameters()} == before
    # a policy with act() alone (a test's, a recipe's) is wrapped: it takes no weights, never sleeps
    scripted = type("Scripted", (), {"act": lambda self, obs: ["x"] * len(obs)})()
    trainer.policy = scripted
    assert isinstance(trainer.backend, PolicyBackend) and trainer.backend.policy is scripted
    assert as_backend(trainer.backend) is trainer.backend


def test_an_hf_backend_copies_weights_into_a_model_of_its_own(tiny_dirs, tokenizer):
    """A Ray worker's HF backend holds its own model: the trainer's weights are copied in."""
    import torch

    from agents.models import load_causal_lm

    mine, _ = load_causal_lm(tiny_dirs["policy"])
    other, _ = load_causal_lm(tiny_dirs["teacher"])
    backend = HFBackend(mine, tokenizer)
    backend.load_weights(other.state_dict().items())
    for (name, a), b in zip(mine.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(KeyError, match="not a weight"):
        backend.load_weights([("no.such.weight", torch.zeros(1))])


def test_the_engine_gets_the_runs_length_dtype_and_memory_share(tmp_path, tiny_dirs, fake_vllm):  # noqa: F811
    """B5 + W2: ``max_model_len`` is the env's longest context plus a turn (not the model's
    own, 262,144 tokens for the paper's model), the dtype is the learner's, the memory share
    and further settings come from the config."""
    trainer = make_trainer(tmp_path, tiny_dirs, rollout_backend="vllm", vllm_gpu_memory_utilization=0.45,
                       vllm_kwargs={"enforce_eager": True})
    cfg = trainer.config
    [built] = fake_vllm.BUILT
    assert built["max_model_len"] == cfg.max_context_tokens + cfg.max_turn_tokens == 520
    assert built["dtype"] == cfg.dtype == "float32"
    assert built["gpu_memory_utilization"] == 0.45 and built["enforce_eager"] is True
    assert built["model"] == tiny_dirs["policy"] and built["seed"] == cfg.seed and built["enable_sleep_mode"]
    trainer.close()
    longer = make_trainer(tmp_path / "longer", tiny_dirs, rollout_backend="vllm", vllm_kwargs={"max_model_len": 4096})
    assert fake_vllm.BUILT[-1]["max_model_len"] == 4096
    longer.close()


VLLM_RUN = dict(stage="teacher", rollout_backend="vllm")


def test_vllm_settings_that_cannot_reach_the_engine_are_refused():
    with pytest.raises(ValueError, match="vllm_gpu_memory_utilization=1.5"):
        TrainConfig(**VLLM_RUN, vllm_gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match=r"\['dtype'\] are set by the run itself"):
        TrainConfig(**VLLM_RUN, vllm_kwargs={"dtype": "float16"})
    with pytest.raises(ValueError, match="'enforce_eager' must be a plain JSON value"):
        TrainConfig(**VLLM_RUN, vllm_kwargs={"enforce_eager": object()})


def test_vllm_under_torchrun_is_refused_before_anything_builds(monkeypatch):
    """B4: every rank's in-process engine would take GPU 0."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"rollout_backend='vllm'.*torchrun \(WORLD_SIZE=2\)"):
        TrainConfig(**VLLM_RUN)
    assert TrainConfig(stage="teacher", rollout_backend="hf").rollout_backend == "hf"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert TrainConfig(**VLLM_RUN).rollout_backend == "vllm"


def test_a_skipped_step_leaves_the_engine_awake_with_the_unchanged_weights(tmp_path, tiny_dirs, fake_vllm,  # noqa: F811
                                                                           monkeypatch):
    """B2: the engine sleeps through scoring and the update; when the update is skipped
    (NonFiniteLoss) the unchanged weights wake it, so the next rollout generates (the fake
    refuses generate while asleep, and after a level-2 sleep until weights are loaded)."""
    trainer = make_trainer(tmp_path, tiny_dirs, rollout_backend="vllm")
    trainer.engine_sleeps = True  # as on a GPU

    def skipped(rows):
        raise NonFiniteLoss("injected: the step is skipped, nothing of it applied")

    monkeypatch.setattr(trainer, "update", skipped)
    with pytest.raises(NonFiniteLoss, match="injected"):
        trainer.train_step()
    monkeypatch.delattr(trainer, "update")
    groups = trainer.collect_rollouts()
    assert len(groups) == trainer.config.questions_per_step and not trainer.backend.sleeping
    engine = trainer.backend.engine
    events = engine.engine_state()["events"]
    sleep = events.index(("sleep", 2))
    assert events[sleep + 1:sleep + 5] == [("wake_up", ["weights"]), "load", ("wake_up", ["kv_cache"]),
                                           "reset_prefix_cache"]
    assert events[-1][0] == "generate"
    loaded = engine.collective_rpc(fake_vllm.loaded_weights)[0]
    for name, p in trainer.full_model.named_parameters():
        assert loaded[name] == p.detach().reshape(-1).tolist(), name
    trainer.close()


def test_close_frees_the_engine_and_the_models_so_another_trainer_can_build(tmp_path, tiny_dirs,
                                                                            fake_vllm):  # noqa: F811
    """B3: one sleep-mode engine per process (the fake asserts as vLLM does)."""
    first = make_trainer(tmp_path / "a", tiny_dirs, rollout_backend="vllm")
    with pytest.raises(AssertionError, match="one instance per process"):
        make_trainer(tmp_path / "b", tiny_dirs, rollout_backend="vllm")
    model = weakref.ref(first.model)
    first.close()
    assert first.backend is None and first.optimizer is None and model() is None
    second = make_trainer(tmp_path / "c", tiny_dirs, rollout_backend="vllm")
    assert second.backend.engine.engine_state()["pid"] == os.getpid()
    second.close()


def test_the_pipeline_closes_each_stages_trainer_before_building_the_next(tmp_path, monkeypatch):
    """B3: Stage I's Trainer (its engine, models, optimizer) is closed before Stage II's is built."""
    import algos.commands.train as P

    events, live = [], []

    class Stage:
        def __init__(self, cfg, resume=False, progress=True, retriever=None):
            assert not live, f"the {cfg.stage} Trainer is built while the {live[0]} one is alive"
            live.append(cfg.stage)
            events.append(("build", cfg.stage))
            self.config, self.step, self.val_questions, self.progress, self.retriever = cfg, 0, [], False, None
            Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)

        def validate(self):
            return 0.0

        def log_metrics(self, metrics, step=None):
            pass

        def train(self, validate_first=True):
            self.step = 1
            return {"history": [{"val/avg@1": 0.0}]}

        def close(self):
            live.remove(self.config.stage)
            events.append(("close", self.config.stage))

    monkeypatch.setattr(P, "Trainer", Stage)
    monkeypatch.setattr(P, "prepare_model", lambda model, **kw: model)
    monkeypatch.setattr(P, "describe_base", lambda model: {})
    monkeypatch.setattr(P, "read_metrics", lambda path: [])
    monkeypatch.setattr(P, "paired_sign_test", lambda a, b: {"better": 0, "worse": 0, "p_value": 1.0})
    P.run_pipeline("tiny", tmp_path, ("teacher", "team"), {"model": "unused"}, progress=False, log=lambda line: None)
    assert events == [("build", "teacher"), ("close", "teacher"), ("build", "team"), ("close", "team")]
