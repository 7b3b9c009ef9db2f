"""The table of role rules: what each role gets, by stage and Searcher signal."""

import pytest

from algos import advantages as A
from algos.roles import RULES, SEARCHER_SIGNALS, rule_of, rules_for


def test_the_table_by_hand():
    assert SEARCHER_SIGNALS == ("opd", "outcome", "none", "critic")
    stage1 = rules_for("teacher", "opd")
    assert sorted(stage1) == ["answerer", "searcher"]  # the cascade has no Leader
    assert not any(r.kl or r.teacher_scores for r in stage1.values())  # nor a Teacher
    assert stage1["searcher"].advantage is A.own_reward_grpo and stage1["answerer"].advantage is A.candidate_grpo
    terms = {"opd": A.opd_term, "outcome": A.team_outcome_grpo, "none": A.no_term, "critic": A.critic_grpo}
    for signal, term in terms.items():
        team = rules_for("team", signal)
        assert sorted(team) == ["answerer", "leader", "searcher"]
        assert team["leader"].advantage is A.own_reward_grpo and team["answerer"].advantage is A.candidate_grpo
        assert team["searcher"].advantage is term
        assert [r for r in team if team[r].kl] == ["leader", "answerer"]  # never the Searcher's tokens
        assert team["searcher"].trained == (signal != "none")
        assert team["searcher"].scored_by_teacher(0.0) and not team["leader"].scored_by_teacher(0.0)
        assert team["leader"].scored_by_teacher(1e-3) and team["answerer"].scored_by_teacher(1e-3)
    assert len({(r.stage, r.role, r.signal) for r in RULES}) == len(RULES)  # one rule per key


def test_unknown_stage_signal_and_role_say_what_is_known():
    with pytest.raises(ValueError, match="stage 'warmup' is not one of"):
        rules_for("warmup")
    with pytest.raises(ValueError, match="searcher_signal 'judge' is not one of"):
        rules_for("team", "judge")
    with pytest.raises(ValueError, match=r"no role rule for role 'leader' in stage 'teacher'.*algos/roles.py"):
        rule_of(rules_for("teacher"), "leader")


def test_rollout_metrics_average_per_workflow_and_read_roles_from_the_table():
    from algos.trainer import rollout_metrics
    from envs.episode import Episode, Segment

    def episode(searches, failures, em, turns, invalid):
        ep = Episode(question={"id": "q"}, workflow="hierarchical", num_searches=searches,
                     search_failures=failures, team_em=em, turns=turns, invalid_turns=invalid)
        ep.segments = [Segment(agent="leader_0", role="leader", wave=-1, reward=0.9 * em)]
        return ep

    groups = [[episode(2, 1, 1.0, 4, 1), episode(0, 0, 0.0, 6, 0)], [episode(4, 3, 1.0, 10, 3)]]
    m = rollout_metrics(groups, [])
    assert m["team/searches_per_workflow"] == pytest.approx(2.0)
    assert m["team/search_failures"] == pytest.approx(4 / 3)  # failed searches per workflow
    assert m["team/invalid_rate"] == pytest.approx(4 / 20)  # invalid turns over all turns
    assert m["team/em"] == pytest.approx(2 / 3)
    assert m["reward/leader"] == pytest.approx(0.6) and "reward/searcher" not in m
