"""The perf suite at its smallest sizes: every figure is a finite positive ratio, the exact
counts are exact, and the JSON and the table say so. No test asserts a timing: how much
batching pays is a figure ``python -m benchmarks perf`` reports, not a pass/fail line on a
shared machine."""

import json
import math

import pytest

from benchmarks.perf.cli import main
from benchmarks.perf.harness import figure, interleaved
from benchmarks.perf.scaling import FullBudgetTeam
from benchmarks.perf.settings import PerfSettings

SECTIONS = ("decode.", "env.", "collect.", "learner.", "teacher.", "retrieval.", "scaling.")


@pytest.mark.slow  # 37 s, and the whole suite stood at 10 minutes: run with -m slow
def test_perf_suite_smallest_sizes(tmp_path, capsys, world_retriever):
    # world_retriever: the suite's default retriever is the session's one encoding of the world
    out = tmp_path / "perf.json"
    assert main(["--tiny-for-tests", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    figures = result["figures"]
    for prefix in SECTIONS:
        assert any(name.startswith(prefix) for name in figures), f"no {prefix}* figure"
    for name, f in figures.items():
        assert math.isfinite(f["ratio"]) and f["ratio"] > 0, (name, f)
        assert f["low"] <= f["ratio"] <= f["high"], (name, f)
    # shares are fractions of one run
    assert 0 < figures["env.outside_policy_share"]["ratio"] < 1
    # token counts are exact: G doubles, so do the tokens; more waves and Searchers add some
    assert figures["scaling.group_size=2.input_tokens"]["ratio"] == 2.0
    assert figures["scaling.waves=2.output_tokens"]["ratio"] > 1
    assert figures["scaling.searchers=2.output_tokens"]["ratio"] > 1
    # the minimal loop generates exactly what the policy generated, greedy and sampled, and so
    # does the replaced decoding step and one copy at a time
    for mode in ("greedy", "sampled"):
        details = result["details"][f"decode.{mode}"]
        assert details["turns_differing_from_minimal_loop"] == 0
        assert details["output_tokens"] == details["output_tokens_before"] > 0
    greedy = result["details"]["decode.greedy"]
    assert greedy["output_tokens"] == greedy["output_tokens_sequential"]
    assert result["details"]["decode.sampled"]["temperature"] == 1.0
    # peak memory per trained token is measured, before and after, and recall is a fraction
    memory = result["details"]["learner"]["memory"]
    assert set(memory) == {"after", "before", "fwd_bwd"}
    for name in ("retrieval.recall_at_3.ivf.synthetic", "retrieval.recall_at_3.hnsw.synthetic"):
        assert 0 < figures[name]["ratio"] <= 1
    assert {"retrieval.ivf@1200.speedup", "retrieval.flat@300.search_vs_faiss",
            "scaling.corpus=1200.time"} <= set(figures)
    assert result["meta"]["torch_threads"] == 1 and result["meta"]["settings"]["reps"] == 2
    printed = capsys.readouterr().out
    assert "| collect.batched_speedup.model |" in printed and "torch on 1 thread" in printed


def test_interleaved_runs_in_turn_and_figure_takes_the_median_of_pairs():
    order = []
    t = interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b") or {"n": 2}},
                    reps=3, warmup=1)
    assert order == ["a", "b"] * 4
    assert len(t["a"]) == len(t["b"]) == 3 and t["b.n"] == [2.0, 2.0, 2.0]
    f = figure([2.0, 9.0, 3.0], [1.0, 1.0, 1.0], "x")
    assert (f.ratio, f.low, f.high) == (3.0, 2.0, 9.0)


def test_full_budget_leader_fills_every_slot_then_lets_the_scripted_leader_select(make_env):
    env = make_env(max_waves=2, max_searchers=3)
    team, leader_turns = FullBudgetTeam(), []
    for agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        turn = None
        if not (term or trunc):
            [turn] = team.act([env.unwrapped.turn_observation(agent)])
            if agent == "leader_0":
                leader_turns.append(turn)
        env.step(turn)
    # one full wave per wave allowed (3 Searchers each), then the scripted Leader selects
    assert [t.count("<subtask>") for t in leader_turns] == [3, 3, 0]
    assert leader_turns[-1].startswith("<select>") and env.unwrapped.episode.num_waves == 2


def test_settings_refuse_nonsense():
    with pytest.raises(ValueError, match="reps"):
        PerfSettings(reps=0)
    with pytest.raises(ValueError, match="corpus_sizes"):
        PerfSettings(corpus_sizes=(1000,))
    with pytest.raises(ValueError, match="model"):
        PerfSettings(model="gpt")
