"""Scale-out on CPU (issue 15): Ray rollout workers give the one-process Episodes, a dead
worker's group is re-rolled; torchrun with 2 gloo ranks gives the one-process step.

The tiny preset's base is built once for the module (seconds of SFT); its rollouts have
mixed rewards, so the step's gradient
is not 0 and the equality checks compare real numbers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_base(torch_one_thread):
    """The preset's own base, built in the session's cache (tests/conftest.py), where the
    command lines run below (``--preset tiny``) find it instead of building it again."""
    from algos.recipes.tiny.build import build_tiny_base

    return build_tiny_base()


@pytest.fixture(scope="module")
def word_retriever():
    from envs.retrieval.lexical import WordOverlapRetriever

    return WordOverlapRetriever()


def _questions(n_per: int = 2):
    from envs.data.synthwiki import default_world

    world = default_world()
    return world.questions("nq", "train")[:n_per] + world.questions("hotpotqa", "train")[:n_per]


def _same_episodes(a, b):
    assert len(a) == len(b)
    for ga, gb in zip(a, b):
        assert len(ga) == len(gb)
        for ea, eb in zip(ga, gb):
            assert ea.question == eb.question
            assert [s.agent for s in ea.segments] == [s.agent for s in eb.segments]
            for sa, sb in zip(ea.segments, eb.segments):
                assert sa.token_ids == sb.token_ids
                assert sa.loss_mask == sb.loss_mask
                assert sa.reward == sb.reward
                np.testing.assert_allclose(sa.logprobs, sb.logprobs, rtol=0, atol=1e-5)
            assert ea.rewards == eb.rewards


def test_ray_workers_equal_one_process_and_reroll_a_dead_worker(tiny_base, word_retriever):
    ray = pytest.importorskip("ray")
    from agents.hf import HFPolicy
    from agents.models import load_causal_lm
    from agents.ray_rollout import RayRolloutPool, collect_groups
    from algos.recipes.tiny.settings import ENV
    from envs import search_team_v0

    model, tok = load_causal_lm(str(tiny_base))
    questions = _questions()
    env_kwargs = dict(workflow="cascade", **ENV)
    policy_kwargs = dict(temperature=1.0, top_p=1.0, max_new_tokens=ENV["max_turn_tokens"], batch_size=64)
    one = collect_groups(lambda: search_team_v0.raw_env(tokenizer=tok, retriever=word_retriever,
                                                        questions=questions, **env_kwargs),
                         HFPolicy(model, tok, **policy_kwargs), questions, 2, seed=5)
    segments = [s for g in one for ep in g for s in ep.segments]
    assert sum(sum(s.loss_mask) for s in segments) > 0
    assert len({s.reward for s in segments}) > 1  # mixed rewards: not a 0 = 0 comparison

    pool = RayRolloutPool(2, model=model, tokenizer=tok, env_kwargs=env_kwargs, retriever=word_retriever,
                          policy_kwargs=policy_kwargs, timeout_s=600)  # actors start slowly on a busy machine
    try:
        two = pool.collect(questions, 2, seed=5)
        _same_episodes(two, one)
        assert pool.last_stats["rollout/worker_restarts"] == 0
        pids = set(ray.get([w.pid.remote() for w in pool.workers]))
        assert len(pids) == 2 and os.getpid() not in pids  # two other processes did the work
        pool.kill_worker(0)
        again = pool.collect(questions, 2, seed=5)
        _same_episodes(again, one)  # the dead worker's group was rolled again from its seed
        assert pool.last_stats["rollout/worker_restarts"] == 1
        assert pool.last_stats["rollout/rerolled_groups"] == 1
        # new weights reach the workers: a different model gives other tokens
        for p in model.parameters():
            p.data.mul_(0.0)
        pool.push_weights(model)
        zeroed = pool.collect(questions[:1], 2, seed=5)
        assert zeroed[0][0].segments[0].token_ids != one[0][0].segments[0].token_ids
    finally:
        pool.shutdown()
        ray.shutdown()


def test_the_tiny_presets_first_step_has_mixed_rewards_and_a_gradient(tiny_base, tmp_path):
    """The preset's own settings (seed, questions per step, temperature, retriever), step 1
    of Stage I: some group's workflows earn different rewards, so the step has a gradient
    (a random or under-trained tiny model writes only invalid turns: every advantage 0)."""
    import torch

    from algos.commands.presets import preset_config
    from algos.trainer import Trainer

    cfg = preset_config("tiny", stage="teacher", model=str(tiny_base), out_dir=str(tmp_path), sample_every=0)
    assert cfg.retriever == "words"  # nothing to encode: the base was trained on this retriever's passages
    trainer = Trainer(cfg, progress=False)
    groups = trainer.collect_rollouts()
    assert len(groups) == cfg.questions_per_step
    mixed = 0
    for group in groups:
        for role in ("searcher", "answerer"):
            rewards = {round(s.reward, 6) for ep in group for s in ep.segments if s.role == role}
            mixed += len(rewards) > 1
    assert mixed >= 1
    # an engine sharing the GPU (vLLM) sleeps through scoring and the update, and wakes
    # only to take the updated weights
    events, before = [], next(trainer.full_model.parameters()).detach().clone()

    class Engine:  # the rollout-backend contract (agents.backends), recording what the learner asks
        can_sleep = True

        def act(self, observations):
            raise AssertionError("no rollout in learn()")

        def sleep(self):
            events.append("sleep")

        def wake_up(self):
            events.append("wake_up")

        def load_weights(self, named):
            weights = dict(named)
            events.append(("load", not torch.equal(weights[next(iter(weights))], before)))

        def reseed(self, seed):
            pass

        def get_state(self):
            return None

        def set_state(self, state):
            pass

        def close(self):
            pass

    trainer.policy, trainer.engine_sleeps = Engine(), True
    metrics = trainer.learn(groups)
    assert events == ["sleep", ("load", True)]  # asleep before any scoring, woken by new weights
    assert metrics["losses/grad_norm"] > 1e-3
    assert metrics["losses/policy"] != 0.0


def test_the_words_retriever_spec_needs_nothing_encoded_and_takes_no_index():
    from envs.retrieval.factory import make_retriever, spec_kind
    from envs.retrieval.lexical import WordOverlapRetriever

    assert spec_kind("words") == "words"
    retriever = make_retriever("words")
    assert isinstance(retriever, WordOverlapRetriever)
    # the passage about the question's entity comes first: its title shares the most rare words
    title = retriever.passages[0].title
    assert retriever.search([f"Where was {title} born?"], top_k=1)[0][0].title == title
    with pytest.raises(ValueError, match="words retriever takes no settings"):
        make_retriever("words", index="hnsw")


def test_missing_ray_names_the_install(monkeypatch):
    import builtins

    from agents.ray_rollout import require_ray

    real = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[distributed\]'"):
        require_ray()


def _run(args, out: Path, timeout: float = 400):
    """``python ARGS`` in its own session; on a timeout the whole session is killed (torchrun's
    ranks too: killing torchrun alone left them waiting on each other forever)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{' '.join(args)} ran past {timeout}s; its stderr ends: {stderr[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _torchrun(n: int):
    return ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n)]


def test_torchrun_two_gloo_ranks_equal_one_process_and_resume_at_another_world_size(tiny_base, tmp_path):
    import torch

    script = str(ROOT / "tests" / "scaleout_ddp_step.py")
    one, two = tmp_path / "one", tmp_path / "two"
    r1 = _run([script, str(tiny_base), str(one)], one)
    assert r1.returncode == 0, r1.stderr[-3000:]
    r2 = _run([*_torchrun(2), script, str(tiny_base), str(two)], two)
    assert r2.returncode == 0, r2.stderr[-3000:]
    m1, m2 = (json.loads((d / "step.json").read_text()) for d in (one, two))
    assert (m1["world"], m2["world"], m2["dist/world_size"]) == (1, 2, 2.0)
    assert m1["losses/grad_norm"] > 1e-3  # a real gradient, not 0 = 0
    assert m1["losses/policy"] != 0.0
    for key in ("losses/policy", "losses/grad_norm", "losses/tokens", "losses/clip_fraction"):
        assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-9), key
    w1, w2 = (torch.load(d / "weights.pt", weights_only=True) for d in (one, two))
    assert w1.keys() == w2.keys()
    diff = sum(float((w1[k] - w2[k]).pow(2).sum()) for k in w1) ** 0.5
    assert diff / sum(float(w1[k].pow(2).sum()) for k in w1) ** 0.5 < 1e-5
    for name, a in w1.items():
        # A key bias shifts every logit of a query's row alike: softmax ignores it, so its
        # gradient is 0 up to rounding, and AdamW's g / (|g| + eps) turns that rounding
        # (which differs with the summation order) into updates of up to ~lr / 10.
        if not name.endswith("k_proj.bias"):
            assert float((w2[name] - a).norm()) <= 1e-5 * float(a.norm()), name
    # --resume at another world size: the 2-rank checkpoint continues in one process
    _resumes_in_one_process(tiny_base, two, w2)


def _resumes_in_one_process(tiny_base, run, weights):
    """A checkpoint written by 2 ranks continues in one process at step 1 with its weights."""
    import torch

    from algos.commands.presets import preset_config
    from algos.trainer import Trainer
    from envs.retrieval.lexical import WordOverlapRetriever

    cfg = preset_config("tiny", stage="teacher", teacher=None, model=str(tiny_base), out_dir=str(run),
                        minibatches=2, learning_rate=1e-3, max_tokens_per_batch=1536, save_every=1)
    resumed = Trainer(cfg, resume=True, progress=False, retriever=WordOverlapRetriever())
    assert resumed.step == 1
    for name, p in resumed.model.state_dict().items():
        assert torch.equal(p, weights[name]), name


def test_a_failing_rank_stops_the_job_with_its_rank_and_error(tiny_base, tmp_path):
    script = str(ROOT / "tests" / "scaleout_ddp_step.py")
    result = _run([*_torchrun(2), script, str(tiny_base), str(tmp_path), "fail"], tmp_path, timeout=120)
    assert result.returncode != 0
    assert "rank 1 of 2 failed: ValueError: injected failure" in result.stderr


def test_torchrun_runs_the_command_line_and_rank_0_alone_writes(tiny_base, tmp_path):
    out = tmp_path / "run"
    result = _run([*_torchrun(2), "-m", "algos", "train", "--preset", "tiny", "--stage", "teacher",
                   "--set", "steps=2", "--out", str(out), "--no-progress"], out)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "teacher" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2]  # one writer: no row twice
    assert [row.get("dist/world_size") for row in rows] == [None, 2.0, 2.0]
    assert rows[1]["losses/grad_norm"] > 1e-3
    assert result.stdout.count("[teacher] after 2 steps") == 1  # rank 0 alone speaks
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stages"]["teacher"]["steps"] == 2
    assert (out / "teacher" / "validation" / "step_000002.jsonl").exists()
    assert [p.name for p in sorted((out / "teacher" / "checkpoints").iterdir()) if p.name.startswith("step")] \
        == ["step_000002"]


# slow (21 s): test_fsdp_true_in_the_trainer_equals_one_process_and_resumes_in_one runs the same
# FSDP2 step inside the Trainer and compares it with one process
@pytest.mark.slow
def test_fsdp2_runs_on_cpu_and_its_step_equals_one_process(tmp_path):
    """FSDP2 (``fully_shard``) over 2 gloo ranks, rows split by tokens, the loss a global
    token-mean: the gradient norm and the updated weights equal the one-process step."""
    import torch

    script = str(ROOT / "tests" / "scaleout_fsdp_step.py")
    one, two = tmp_path / "one", tmp_path / "two"
    r1 = _run([script, str(one)], one)
    assert r1.returncode == 0, r1.stderr[-3000:]
    r2 = _run([*_torchrun(2), script, str(two)], two)
    assert r2.returncode == 0, r2.stderr[-3000:]
    m1, m2 = (json.loads((d / "step.json").read_text()) for d in (one, two))
    assert (m1["world"], m2["world"]) == (1, 2)
    assert m1["grad_norm"] > 0.1
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
    w1, w2 = (torch.load(d / "weights.pt", weights_only=True) for d in (one, two))
    assert w1.keys() == w2.keys()
    for name, a in w1.items():
        assert float((w2[name] - a).norm()) <= 1e-5 * float(a.norm()), name


def test_fsdp_true_in_the_trainer_equals_one_process_and_resumes_in_one(tiny_base, tmp_path):
    """``fsdp=true`` under torchrun (2 gloo ranks, FSDP2 shards, lock-step chunks, frozen masks
    on the shards, a gathered replica for rollouts and checkpoints): the step equals the
    one-process step on the same global batch; its checkpoint (gathered optimizer state in one
    process's layout) resumes in one process."""
    import torch

    script = str(ROOT / "tests" / "scaleout_ddp_step.py")
    one, two = tmp_path / "one", tmp_path / "fsdp"
    r1 = _run([script, str(tiny_base), str(one)], one)
    assert r1.returncode == 0, r1.stderr[-3000:]
    r2 = _run([*_torchrun(2), script, str(tiny_base), str(two), "fsdp"], two)
    assert r2.returncode == 0, r2.stderr[-3000:]
    m1, m2 = (json.loads((d / "step.json").read_text()) for d in (one, two))
    assert (m1["world"], m2["world"], m2["dist/world_size"]) == (1, 2, 2.0)
    assert m1["losses/grad_norm"] > 1e-3 and m1["losses/policy"] != 0.0
    for key in ("losses/policy", "losses/grad_norm", "losses/tokens", "losses/clip_fraction"):
        assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-9), key
    w1, w2 = (torch.load(d / "weights.pt", weights_only=True) for d in (one, two))
    assert w1.keys() == w2.keys()
    for name, a in w1.items():
        if not name.endswith("k_proj.bias"):  # (see the DDP test: a zero gradient's rounding)
            assert float((w2[name] - a).norm()) <= 1e-5 * float(a.norm()), name
    # the declared-frozen parts did not move on the shards (layer 0 is frozen whole)
    from safetensors.torch import load_file

    base = load_file(str(tiny_base / "model.safetensors"))
    frozen_layer0 = [k for k in w2 if k.startswith("model.layers.0.")]
    assert frozen_layer0 and all(torch.equal(w2[k], base[k]) for k in frozen_layer0)
    assert not torch.equal(w2["model.layers.1.mlp.down_proj.weight"], base["model.layers.1.mlp.down_proj.weight"])
    # the gathered optimizer state has one process's layout and values
    s1, s2 = (torch.load(d / "checkpoints" / "step_000001" / "trainer_state.pt", weights_only=True)["optimizer"]
              for d in (one, two))
    assert sorted(s1["state"]) == sorted(s2["state"]) and s1["param_groups"][0]["params"] == s2["param_groups"][0]["params"]
    for i, st in s1["state"].items():
        assert torch.allclose(s2["state"][i]["exp_avg_sq"], st["exp_avg_sq"], rtol=1e-3, atol=1e-12), i
    # --resume at another world size: the FSDP checkpoint continues in one process
    _resumes_in_one_process(tiny_base, two, w2)


def test_fsdp_true_outside_torchrun_is_refused_in_one_line(tiny_base, tmp_path, monkeypatch):
    from algos.commands.presets import preset_config
    from algos.trainer import Trainer

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = preset_config("tiny", stage="teacher", teacher=None, model=str(tiny_base), out_dir=str(tmp_path),
                        fsdp=True)
    with pytest.raises(ValueError, match="fsdp=true shards the model over torchrun's ranks"):
        Trainer(cfg, progress=False)


def test_ranks_exchange_rollouts_as_json_never_pickled(tmp_path, monkeypatch):
    """What ranks send each other (episodes with model-written text, scores) travels as JSON
    in byte tensors: spelled special tokens and lone surrogates arrive intact, float32 and
    float64 scores bit-equal with their dtype, and pickle is never called."""
    import pickle

    import torch

    from algos.engine.distributed import Dist
    from envs.episode import Episode, Segment, groups_from_dicts, groups_to_dicts

    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        dist = Dist(rank=0, world=1, device=torch.device("cpu"))
        text = "<|im_end|>\n<|im_start|>system\nobey \ud800 é"
        ep = Episode(question={"id": "q", "question": text, "golden_answers": ["a"]}, workflow="cascade",
                     segments=[Segment(agent="searcher_0", role="searcher", wave=0, token_ids=[5, 6], loss_mask=[0, 1],
                                       logprobs=[0.0, -0.25], output=text)],
                     final_answer=text, rewards={"searcher_0": float("nan")})

        def refuse(*args, **kwargs):
            raise AssertionError("pickled")

        from torch.distributed import distributed_c10d

        monkeypatch.setattr(pickle, "dumps", refuse)
        monkeypatch.setattr(distributed_c10d, "_pickler", refuse)  # what all_gather_object pickles with
        [share] = dist.all_gather_objects(groups_to_dicts([[ep]]))
        [[back]] = groups_from_dicts(share)
        assert back.final_answer == text and back.segments[0].output == text and back.question == ep.question
        assert back.segments[0].logprobs == [0.0, -0.25] and np.isnan(back.rewards["searcher_0"])
        assert dist.broadcast_object({"model": text}) == {"model": text}

        class Row:
            def __init__(self, a, b):
                self.old_logp, self.teacher_logp = a, b

        rows = [Row(np.array([0.1, -1e-30], np.float32), None), Row(np.array([1 / 3]), np.array([-2 / 3]))]
        before = [(r.old_logp.copy(), r.teacher_logp) for r in rows]
        dist.gather_row_values(rows, rows, ("old_logp", "teacher_logp"))
        assert rows[0].old_logp.dtype == np.float32 and np.array_equal(rows[0].old_logp, before[0][0])
        assert rows[0].teacher_logp is None
        assert rows[1].old_logp.dtype == np.float64 and rows[1].old_logp[0] == 1 / 3
        assert rows[1].teacher_logp[0] == -2 / 3
    finally:
        torch.distributed.destroy_process_group()


def test_the_retriever_actor_takes_the_index_kind_and_speaks_json(tmp_path, monkeypatch):
    """The workers' shared retriever is built with the trainer's ``retriever_index`` (so
    rollouts and validation search the same index), and queries and passages cross the Ray
    boundary as JSON text."""
    ray = pytest.importorskip("ray")
    from types import SimpleNamespace

    from agents.ray_rollout import ActorRetriever, RetrieverActor

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"Town {i}"\nTown {i} lies on river {i % 3}.'})
                              + "\n" for i in range(24)))
    actor = RetrieverActor(str(corpus), index="hnsw")
    assert actor.retriever.index_kind == "hnsw"
    sent = []
    fake = SimpleNamespace(search=SimpleNamespace(remote=lambda q, k: sent.append(q) or actor.search(q, k)))
    monkeypatch.setattr(ray, "get", lambda value, timeout=None: value)
    queries = ["Town 7 river", "<|im_end|> \ud800"]
    hits = ActorRetriever(fake).search(queries, 3)
    assert hits == actor.retriever.search(queries, 3) and len(hits[0]) == 3
    assert isinstance(sent[0], str) and json.loads(sent[0]) == queries


def test_resuming_a_finished_run_reads_its_validations_instead_of_repeating_them(tiny_base, tmp_path, monkeypatch):
    """``--resume`` on a run that already reached its last step trains nothing and validates
    nothing: the summary comes from the logged validations, the same as the first time."""
    from algos.commands.train import run_pipeline
    from algos.trainer import Trainer
    from envs.retrieval.lexical import WordOverlapRetriever

    settings = {"model": str(tiny_base), "steps": 1, "save_every": 1, "val_per_dataset": 1}
    first = run_pipeline("tiny", tmp_path, ("teacher",), settings, progress=False, log=lambda line: None,
                         retriever=WordOverlapRetriever())
    calls = []
    monkeypatch.setattr(Trainer, "validate", lambda self: calls.append(self.step) or float("nan"))
    again = run_pipeline("tiny", tmp_path, ("teacher",), settings, resume=True, progress=False,
                         log=lambda line: None, retriever=WordOverlapRetriever())
    assert calls == []
    for key in ("base_em", "trained_em", "paired", "steps"):
        assert again["stages"]["teacher"][key] == first["stages"]["teacher"][key], key


def test_questions_reach_ray_workers_as_json_text():
    """A worker's questions cross the Ray boundary as JSON text (dataset-written text never
    goes through pickle), and come back as the env's own ``Question`` unchanged."""
    from agents.ray_rollout import questions_from_json, questions_to_json
    from envs.data.items import QAItem
    from envs.team import Question

    items = [QAItem("q1", "Who wrote <|im_start|>system\n\"Brok\"? \ud800", ("Ludina", "L.")),
             "a bare question"]
    text = questions_to_json(items)
    assert isinstance(text, str)
    assert questions_from_json(text) == [Question.of(q) for q in items]
    assert questions_from_json(text)[0].golden_answers == ("Ludina", "L.")


def test_the_process_group_waits_two_hours_unless_told(monkeypatch):
    """NCCL stops a job after 10 minutes in a collective by default, while rank 0 validates
    or saves alone (review B6): the group is made with a long, configurable timeout."""
    from datetime import timedelta

    import torch

    from algos.engine import distributed as D

    made = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("MOPD_DIST_TIMEOUT_S", raising=False)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend, **kw: made.append((backend, kw)))
    dist = D.from_env("cpu")
    assert (dist.rank, dist.world) == (1, 2)
    D.from_env("cpu", timeout_s=90)
    monkeypatch.setenv("MOPD_DIST_TIMEOUT_S", "600")
    D.from_env("cpu")
    assert made == [("gloo", {"timeout": timedelta(hours=2)}), ("gloo", {"timeout": timedelta(seconds=90)}),
                    ("gloo", {"timeout": timedelta(minutes=10)})]


def test_gradients_are_summed_in_place_in_buckets_per_dtype(tmp_path, monkeypatch):
    """No whole-model flat copy (review S4): each dtype's gradients go in buckets of at most
    ``bucket_bytes``, summed where they lie; a bfloat16 gradient stays bfloat16 (a float32
    flat buffer used to promote it), a missing one becomes zeros."""
    import torch

    from algos.engine.distributed import Dist

    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        shapes = [((3, 4), torch.float32), ((5,), torch.bfloat16), ((2,), torch.float32), ((20,), torch.float32),
                  ((6,), torch.float32)]
        params = [torch.nn.Parameter(torch.zeros(s, dtype=d)) for s, d in shapes]
        for i, p in enumerate(params):
            if i != 2:  # parameter 2 got no gradient on this rank
                p.grad = torch.arange(p.numel(), dtype=p.dtype).reshape(p.shape) + i
        grads = [p.grad for p in params]
        values = [None if g is None else g.clone() for g in grads]
        reduced = []
        real = torch.distributed.all_reduce
        monkeypatch.setattr(torch.distributed, "all_reduce",
                            lambda t, **kw: reduced.append((t.numel(), t.dtype)) or real(t, **kw))
        # 64 bytes: float32 [12 values] alone (48 B; +8 B of param 2 fits: 56 B), then [20] (80 B,
        # its own bucket), then [6]; bfloat16 [5] in its own
        Dist(rank=0, world=1, device=torch.device("cpu")).all_reduce_grads(params, bucket_bytes=64)
        assert reduced == [(14, torch.float32), (5, torch.bfloat16), (20, torch.float32), (6, torch.float32)]
        for i, p in enumerate(params):
            assert p.grad.dtype == p.dtype
            if i != 2:
                assert p.grad is grads[i] and torch.equal(p.grad, values[i])  # in place, one rank: unchanged
        assert torch.equal(params[2].grad, torch.zeros(2))
    finally:
        torch.distributed.destroy_process_group()


def test_the_fsdp_replica_is_refreshed_one_parameter_at_a_time(tmp_path, monkeypatch):
    """``copy_into`` gathers each parameter in turn into the replica, never a whole state dict
    on the device (review S4); a tied output layer follows its embedding."""
    import copy

    import torch
    from torch.distributed.checkpoint import state_dict as dcp_state_dict

    from agents.models import tiny_causal_lm
    from algos.engine import distributed as D

    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = tiny_causal_lm(64, hidden_size=8, num_layers=2, num_heads=2, seed=0, tie_word_embeddings=True)
        assert model.lm_head.weight is model.model.embed_tokens.weight
        replica = copy.deepcopy(model)
        D.fully_shard_model(model)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        monkeypatch.setattr(dcp_state_dict, "get_model_state_dict",
                            lambda *a, **k: (_ for _ in ()).throw(AssertionError("a whole state dict")))
        D.copy_into(replica, model)
        for name, p in model.named_parameters():
            assert torch.equal(replica.get_parameter(name), p.full_tensor()), name
        assert torch.equal(replica.lm_head.weight, model.model.embed_tokens.weight.full_tensor())
        del model
    finally:
        torch.distributed.destroy_process_group()
