"""The figures that predict whether outcome RL keeps search (``algos.mechanism``),
checked against hand-computed values on hand-made episodes."""

from __future__ import annotations

import pytest

from algos.mechanism import (
    NothingFound,
    greedy_figures,
    outcome_signal,
    search_covariance,
    two_choice,
)
from envs.episode import Episode


def episode(searches: int, em: float, dataset: str = "nq", qid: str = "q", final: float | None = None) -> Episode:
    return Episode(question={"id": qid, "dataset": dataset}, workflow="hierarchical",
                   num_searches=searches, team_em=em, final_em=em if final is None else final,
                   turns=4, invalid_turns=1 if searches == 0 else 0)


def test_within_group_covariance_matches_the_hand_computed_value():
    paying = [episode(0, 0), episode(1, 1), episode(2, 1), episode(1, 0)]
    flat = [episode(1, 0), episode(1, 0), episode(0, 0), episode(0, 0)]
    figures = search_covariance([paying, flat], n_resamples=200)
    # paying: searches mean 1, R_EM mean 0.5: ((-1)(-.5) + 0 + (1)(.5) + 0) / 4 = 0.25; flat: 0
    assert figures["cov_searches_em"] == pytest.approx(0.125)
    # searched at all: (.375 + .125 + .125 - .125) / 4 = 0.125 for paying, 0 for flat
    assert figures["cov_searched_em"] == pytest.approx(0.0625)
    assert figures["cov_searches_em_mixed_groups"] == pytest.approx(0.25)
    assert figures["mixed_group_share"] == 0.5
    assert figures["searches_per_workflow"] == pytest.approx(6 / 8)
    assert figures["searched_share"] == pytest.approx(5 / 8)
    assert figures["team_em"] == pytest.approx(2 / 8)
    low, high = figures["cov_searches_em_ci95"]
    assert 0.0 <= low <= 0.125 <= high <= 0.25  # the mean of 0.25 and 0 resampled


def test_searches_that_do_not_pay_give_a_negative_covariance():
    memory_wins = [episode(0, 1), episode(0, 1), episode(2, 0), episode(1, 0)]
    assert search_covariance([memory_wins], n_resamples=10)["cov_searches_em"] == pytest.approx(-0.375)


def test_an_empty_group_is_refused():
    with pytest.raises(ValueError, match="non-empty group"):
        search_covariance([[episode(1, 1)], []])


def test_greedy_figures_report_the_two_choice_questions_apart():
    episodes = [episode(1, 1, "hotpotqa", "a"), episode(1, 0, "hotpotqa", "b"),
                episode(0, 1, "nq", "c"), episode(0, 0, "nq", "d")]
    figures = greedy_figures(episodes, {("hotpotqa", "a")})
    assert figures["macro_avg@1"] == pytest.approx(0.5)
    # without hotpotqa/a: hotpotqa 0 of 1, nq 1 of 2 -> macro 0.25
    assert figures["macro_avg@1_not_two_choice"] == pytest.approx(0.25)
    assert figures["two_choice_questions"] == 1 and figures["right"] == 2
    assert figures["searches_per_workflow"] == 0.5 and figures["invalid_turns_per_workflow"] == 0.5


def test_nothing_found_answers_every_query_with_no_passages():
    assert NothingFound().search(["a", "b"], top_k=3) == [[], []]


def test_the_learner_logs_the_outcome_signal_of_every_step():
    from algos.trainer import rollout_metrics

    paying = [episode(0, 0), episode(1, 1), episode(2, 1), episode(1, 0)]
    flat = [episode(1, 0), episode(1, 0), episode(0, 0), episode(0, 0)]
    assert outcome_signal([paying, flat]) == {"mixed_em_groups": 0.5, "cov_searches_em": 0.125}
    metrics = rollout_metrics([paying, flat], [])
    assert metrics["team/mixed_em_groups"] == 0.5 and metrics["team/cov_searches_em"] == pytest.approx(0.125)


def test_search_first_opens_every_searcher_turn_without_a_search_with_the_search_token():
    import numpy as np

    from agents.base import Action
    from algos.mechanism import SearchFirst
    from envs.observation import Observation

    class Echo:
        """Answers each observation with its context's last token and the budget it got."""

        def __init__(self):
            self.seen = []

        def act(self, observations):
            self.seen = list(observations)
            return [Action(token_ids=[int(o.token_ids[-1]), o.max_new_tokens], logprobs=[-0.5, -0.25])
                    for o in observations]

    def obs(role, queries, budget=10):
        return Observation(agent=f"{role}_0", role=role, token_ids=np.array([3, 4]), max_new_tokens=budget,
                           info={"queries": queries} if role == "searcher" else {})

    inner = Echo()
    actions = SearchFirst(inner, search_token=7).act(
        [obs("searcher", []), obs("searcher", ["who"]), obs("leader", []), obs("searcher", [], budget=1)])
    # the first Searcher's context ends with the search token and it has one token less to write
    assert list(inner.seen[0].token_ids) == [3, 4, 7] and inner.seen[0].max_new_tokens == 9
    assert list(actions[0].token_ids) == [7, 7, 9] and list(actions[0].logprobs) == [0.0, -0.5, -0.25]
    # a Searcher that has searched, a Leader, and a turn with no room for more are the policy's own
    assert [list(a.token_ids) for a in actions[1:]] == [[4, 10], [4, 10], [4, 1]]
    assert [list(o.token_ids) for o in inner.seen[1:]] == [[3, 4]] * 3


def test_the_micro_mechanism_refuses_unknown_parts_before_loading_anything(capsys):
    from algos.recipes.micro.mechanism import main, measure

    with pytest.raises(ValueError, match=r"unknown part\(s\) \['greedy_sampled'\]"):
        measure("/no/such/model", parts=["greedy", "greedy_sampled"])
    with pytest.raises(SystemExit):
        main(["--model", "/no/such/model", "--parts", "greedy,bogus"])
    assert "--parts 'greedy,bogus': choose among greedy,greedy_nothing_found" in capsys.readouterr().err


def test_from_memory_marks_the_questions_the_geography_answers_and_not_the_guesses():
    """A city's river is answerable from memory; a two-choice question the scripted team
    guesses right without memory is not; a person's birth year is not."""
    from algos.recipes.micro.episodes import questions
    from algos.recipes.micro.mechanism import from_memory
    from algos.recipes.micro.tokenizer import micro_tokenizer, synthetic_world

    dev = questions("dev", 50)
    river = next(q for q in dev if q.question.startswith("what river runs through"))
    year = next(q for q in dev if q.question.lower().startswith("in what year was") or " born" in q.question)
    memory = synthetic_world(0).geography()
    assert any(river.golden_answers[0] in fact for fact in memory.values())
    assert from_memory([river, year], micro_tokenizer(4096)) == [True, False]
    # over the 350 dev questions: the 54 the memory team gets right less the 22 it guesses
    # right without memory (all two-choice), as docs/table2.md counts them
    known = from_memory(dev, micro_tokenizer(4096))
    assert sum(known) == 32 and not any(k for k, q in zip(known, dev) if q.id in two_choice(dev))


def test_an_ablation_s_validation_questions_answerable_from_memory_are_marked_for_the_table(tmp_path):
    import json

    from algos.mechanism import QUESTION_SUBSETS_FILE
    from algos.recipes.micro.mechanism import mark_from_memory
    from algos.recipes.micro.tokenizer import micro_tokenizer
    from envs.data.qa import DATASETS

    with pytest.raises(ValueError, match="no finished run"):
        mark_from_memory(tmp_path)
    config = {"val_split": "dev", "val_per_dataset": 50, "val_datasets": list(DATASETS), "data": "synthetic",
              "model": str(tmp_path / "base")}
    (tmp_path / "seed0" / "opd").mkdir(parents=True)
    (tmp_path / "seed0" / "opd" / "run.json").write_text(json.dumps({"config": config}))
    with pytest.raises(ValueError, match=f"run.json: cannot load the tokenizer of its model {tmp_path / 'base'}"):
        mark_from_memory(tmp_path)
    micro_tokenizer(4096).save_pretrained(tmp_path / "base")
    (tmp_path / QUESTION_SUBSETS_FILE).write_text(json.dumps({"other": {"questions": []}}))
    marked = mark_from_memory(tmp_path)
    assert len(marked) == 32 and ["nq", "dev_3"] in marked  # the 32 of the test above
    saved = json.loads((tmp_path / QUESTION_SUBSETS_FILE).read_text())
    assert saved["from_memory"]["questions"] == marked and saved["other"] == {"questions": []}
    (tmp_path / QUESTION_SUBSETS_FILE).write_text("{cut off")
    with pytest.raises(ValueError, match=f"{QUESTION_SUBSETS_FILE}: not JSON"):
        mark_from_memory(tmp_path)
    (tmp_path / QUESTION_SUBSETS_FILE).unlink()
    config["val_datasets"] = ["nq"]  # a validation of one dataset marks its questions only
    (tmp_path / "seed0" / "opd" / "run.json").write_text(json.dumps({"config": config}))
    assert {d for d, _ in mark_from_memory(tmp_path)} == {"nq"}
