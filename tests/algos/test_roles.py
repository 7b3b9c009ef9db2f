"""The table of role rules: what each role gets, by stage and Searcher signal; a new
Searcher signal is one row plus one term, from a module of its own."""

import dataclasses
import sys
import textwrap

import numpy as np
import pytest
from conftest import GOOD, make_trainer, run_script

from algos import advantages as A
from algos import roles
from algos.roles import RULES, needs_critic, needs_teacher, rule_of, rules_for, searcher_signals


def test_the_table_by_hand():
    assert searcher_signals() == ("opd", "outcome", "none", "critic")
    assert [s for s in searcher_signals() if needs_teacher(rules_for("team", s))] == ["opd"]
    assert [s for s in searcher_signals() if needs_critic(rules_for("team", s))] == ["critic"]
    assert not needs_teacher(rules_for("teacher")) and not needs_critic(rules_for("teacher"))
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


SIGNAL_MODULE = '''
import numpy as np

from algos import advantages as A
from algos.roles import RoleRule, add_rule

CALLS = []


def opd_clipped_term(rows, ctx):
    """OPD, each token's advantage clipped to [-1, 1]."""
    out = [np.clip(v, -1.0, 1.0) for v in A.opd_term(rows, ctx)]
    CALLS.append((sorted({r.role for r in rows}), out))
    return out


def half_critic_term(rows, ctx):
    """The Prompted Critic's score alone, halved."""
    return [0.5 * s for s in ctx.critic.score_rows(list(rows))]


add_rule(RoleRule("team", "searcher", "opd_clipped", opd_clipped_term, kl=False, teacher_scores=True,
                  trained=True, needs_teacher=True))
add_rule(RoleRule("team", "searcher", "half_critic", half_critic_term, kl=False, teacher_scores=True,
                  trained=True, needs_critic=True))
'''


@pytest.fixture
def new_signals(tmp_path, monkeypatch):
    """Two new Searcher signals, each one row plus one term in a module of their own (the
    table is restored afterwards)."""
    monkeypatch.setattr(roles, "RULES", roles.RULES)
    (tmp_path / "new_signals.py").write_text(textwrap.dedent(SIGNAL_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "new_signals", raising=False)
    import new_signals

    yield new_signals
    sys.modules.pop("new_signals", None)


def test_a_new_searcher_signal_needs_nothing_but_its_row_and_term(new_signals, make_env, capsys):
    from algos.__main__ import main as algos_main
    from algos.config import TrainConfig
    from algos.teacher import rows_to_score

    assert searcher_signals()[-2:] == ("opd_clipped", "half_critic")
    with pytest.raises(ValueError, match="the table already has a rule"):
        roles.add_rule(roles.RULES[-1])
    # the config reads what it needs from the row: a Teacher for the OPD-like signal
    with pytest.raises(ValueError, match="TrainConfig.teacher=None: the opd_clipped Searcher signal needs a Teacher"):
        TrainConfig(stage="team", searcher_signal="opd_clipped", kl_coef=0.0)
    assert TrainConfig(stage="team", searcher_signal="half_critic", kl_coef=0.0).teacher is None
    # the command line offers it (argparse would raise SystemExit on an unknown choice); the
    # preflight then looks for the preset's Teacher, and says so in one line
    assert algos_main(["train", "--stage", "team", "--signal", "opd_clipped", "--out", "/nonexistent/x"]) == 2
    assert capsys.readouterr().err.startswith("python -m algos: error: teacher='/nonexistent/x/teacher'")
    clipped = rules_for("team", "opd_clipped")
    assert needs_teacher(clipped) and not needs_critic(clipped)
    assert needs_critic(rules_for("team", "half_critic")) and not needs_teacher(rules_for("team", "half_critic"))
    assert [r for r in clipped if clipped[r].kl] == ["leader", "answerer"]

    from algos.batch import rows_from_episodes

    groups = [[run_script(make_env(), GOOD) for _ in range(2)]]
    rows = rows_from_episodes(groups, 4096)
    assert {r.role for r in rows_to_score(rows, 0.0, clipped)} == {"searcher"}  # the Teacher scores them
    for r in rows:
        r.old_logp = np.full(int(r.mask.sum()), -4.0)
        r.teacher_logp = np.full(int(r.mask.sum()), -1.0)
    ctx = A.AdvantageContext(groups=groups, beta=1.0)
    roles.assign_advantages(rows, clipped, ctx)
    searchers = [r for r in rows if r.role == "searcher"]
    assert searchers and all(np.all(r.advantages == 1.0) for r in searchers)  # opd alone: 3.0
    roles.assign_advantages(rows, rules_for("team", "opd"), ctx)
    assert all(np.all(r.advantages == 3.0) for r in searchers)


def test_the_trainer_runs_a_new_signal_and_loads_what_its_row_asks_for(new_signals, tmp_path, tiny_dirs):
    from conftest import QUESTION

    from agents.scripted import ScriptedPolicy

    trainer = make_trainer(tmp_path / "clipped", tiny_dirs, steps=1, searcher_signal="opd_clipped", beta=5.0,
                       max_turn_tokens=64, max_context_tokens=1024, max_row_tokens=1024)
    assert trainer.critic is None and trainer.teacher is not None
    trainer.train_questions = [QUESTION]
    trainer.policy = ScriptedPolicy(seed=0)  # a team whose Searchers search: rows for the new term
    new_signals.CALLS.clear()  # (the probe of its declared needs ran it on a probe row)
    metrics = trainer.train_step()
    assert np.isfinite(metrics["losses/policy"]) and metrics["losses/tokens"] > 0
    (role_names, values), = new_signals.CALLS
    assert role_names == ["searcher"] and values and all(np.all(np.abs(v) <= 1.0) for v in values)
    critic_run = make_trainer(tmp_path / "critic", tiny_dirs, steps=1, searcher_signal="half_critic")
    assert critic_run.critic is not None  # loaded because the row says so


def test_a_signal_that_reads_what_it_does_not_declare_is_refused_before_any_model_loads(monkeypatch, tmp_path,
                                                                                         capsys):
    """A term that reads Teacher log-probs (or the Prompted Critic) without its rule's
    ``needs_teacher`` (``needs_critic``) is refused when added, and when a config names it:
    the probe runs the term, no model."""
    import algos.engine.checkpoint
    from algos.__main__ import main as algos_main
    from algos.config import TrainConfig

    monkeypatch.setattr(algos.engine.checkpoint, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
    monkeypatch.setattr(roles, "RULES", roles.RULES)

    def peeks_at_the_teacher(rows, ctx):
        return [float(np.mean(r.teacher_logp - r.old_logp)) for r in rows]

    def asks_the_critic(rows, ctx):
        return list(ctx.critic.score_rows(list(rows)))

    peek = roles.RoleRule("team", "searcher", "peek", peeks_at_the_teacher, kl=False, teacher_scores=True,
                          trained=True)
    with pytest.raises(ValueError, match="peeks_at_the_teacher reads Teacher log-probs but its rule does not "
                                         "declare needs_teacher=True"):
        roles.add_rule(peek)
    with pytest.raises(ValueError, match="asks_the_critic reads the Prompted Critic but its rule does not "
                                         "declare needs_critic=True"):
        roles.add_rule(dataclasses.replace(peek, signal="ask", advantage=asks_the_critic))
    assert "peek" not in searcher_signals()
    monkeypatch.setattr(roles, "RULES", (*roles.RULES, peek))  # the row written into the table by hand
    with pytest.raises(ValueError, match="TrainConfig.searcher_signal='peek'.*needs_teacher=True"):
        TrainConfig(stage="team", searcher_signal="peek", kl_coef=0.0, teacher="base")
    assert algos_main(["train", "--stage", "team", "--signal", "peek", "--out", str(tmp_path / "run")]) == 2
    assert "needs_teacher=True" in capsys.readouterr().err and not (tmp_path / "run").exists()
    # declared, the same term passes the probe (and the config asks for its Teacher)
    monkeypatch.setattr(roles, "RULES", (*roles.RULES[:-1], dataclasses.replace(peek, needs_teacher=True)))
    assert TrainConfig(stage="team", searcher_signal="peek", kl_coef=0.0, teacher="base").teacher == "base"
    for rule in roles.RULES:  # the table's own rows declare what they read
        roles.check_declared_needs(rule)
