"""The perf suite at its smallest sizes: every figure is a finite positive ratio, the exact
counts are exact, and the JSON and the table say so. No test asserts a timing: how much
batching pays is a figure ``python -m benchmarks perf`` reports, not a pass/fail line on a
shared machine."""

import json
import math

import numpy as np
import pytest

from agents.base import Observation
from benchmarks.perf import FullBudgetTeam, PerfSettings, figure, interleaved, main

SECTIONS = ("env.", "collect.", "learner.", "teacher.", "retrieval.", "scaling.")


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
    # the greedy replay generates exactly what the batched collect generated
    details = result["details"]["model_rollouts"]
    assert details["output_tokens"] == details["output_tokens_sequential"] > 0
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


def _leader(text):
    return Observation(agent="leader_0", role="leader", token_ids=np.zeros(1, dtype=np.int64),
                       decode=lambda _: text)


def test_full_budget_leader_fills_every_slot_then_lets_the_scripted_leader_select():
    team = FullBudgetTeam()
    first = ("<|im_start|>system\nLeader ... one <subtask>...</subtask> per Searcher (at most 3); "
             "... at most 2 waves.<|im_end|>\n<|im_start|>user\nQuestion: Where was Velmora Quist "
             "born?<|im_end|>\n<|im_start|>assistant\n")
    [turn] = team.act([_leader(first)])
    assert turn.count("<subtask>") == 3
    again = first + turn + ("<|im_end|>\n<|im_start|>user\n[1] Sub-task: x\nReport: y\n\n"
                            "Waves left: 1. Dispatch another wave.<|im_end|>\n<|im_start|>assistant\n")
    assert team.act([_leader(again)])[0].count("<subtask>") == 3
    last = again + turn + ("<|im_end|>\n<|im_start|>user\n[4] Sub-task: x\nReport: y\n\n"
                           "No waves left: choose the reports.<|im_end|>\n<|im_start|>assistant\n")
    assert team.act([_leader(last)])[0].startswith("<select>")


def test_settings_refuse_nonsense():
    with pytest.raises(ValueError, match="reps"):
        PerfSettings(reps=0)
    with pytest.raises(ValueError, match="corpus_sizes"):
        PerfSettings(corpus_sizes=(1000,))
    with pytest.raises(ValueError, match="model"):
        PerfSettings(model="gpt")
