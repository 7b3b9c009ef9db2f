"""Every advantage path against hand-computed values."""

import numpy as np
import pytest

from algos.advantages import critic_rewards, group_advantages, opd_advantages


def test_group_advantage_by_hand():
    # rewards 1, 0, 0, 1: mean 0.5, sample std sqrt(1/3) = 0.57735
    adv = group_advantages([1, 0, 0, 1])
    assert adv == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)
    assert group_advantages([0.95, 0.1]) == pytest.approx([0.707107, -0.707107], abs=1e-5)


@pytest.mark.parametrize("rewards", [[0.0, 0.0, 0.0], [1.0, 1.0], [0.3], []])
def test_zero_variance_and_single_groups_give_zero(rewards):
    assert np.all(group_advantages(rewards) == 0.0) and len(group_advantages(rewards)) == len(rewards)


def test_leader_group_is_over_workflows():
    # R_L of 3 workflows: 0.95, 0.05, 0.9 -> mean 0.633.., sample std 0.5058
    adv = group_advantages([0.95, 0.05, 0.9])
    mean, std = np.mean([0.95, 0.05, 0.9]), np.std([0.95, 0.05, 0.9], ddof=1)
    assert adv == pytest.approx([(0.95 - mean) / std, (0.05 - mean) / std, (0.9 - mean) / std], abs=1e-5)
    assert adv.sum() == pytest.approx(0.0, abs=1e-9)


def test_answerer_group_is_within_one_workflow():
    # candidates 1,1,0,0,1: mean 0.6, sample std sqrt(0.3) = 0.547723
    adv = group_advantages([1, 1, 0, 0, 1])
    assert adv == pytest.approx([0.730297, 0.730297, -1.095445, -1.095445, 0.730297], abs=1e-5)
    assert np.all(group_advantages([1, 1, 1, 1, 1]) == 0)


def test_opd_tokens_by_hand():
    teacher = np.array([-1.0, -0.5, -2.0, -0.1])
    old = np.array([-1.5, -0.5, -1.0, -9.0])
    mask = np.array([1, 1, 1, 0])
    adv = opd_advantages(teacher, old, mask, beta=0.01)
    assert adv == pytest.approx([0.005, 0.0, -0.01, 0.0])
    assert adv[3] == 0.0  # env-written token: no signal, whatever the log-probs say
    assert np.all(opd_advantages(old, old, np.ones(4)) == 0.0)  # teacher == policy
    with pytest.raises(ValueError, match="shapes differ"):
        opd_advantages(teacher, old[:2], mask)


def test_outcome_and_critic():
    assert group_advantages([1, 0]) == pytest.approx([0.707106, -0.707106], abs=1e-5)
    assert np.all(group_advantages([0, 0, 0, 0]) == 0)  # the collapse: no signal when all fail
    assert critic_rewards(1.0, [0.2, 1.4, -1]) == pytest.approx([0.6, 1.0, 0.5])
    assert critic_rewards(0.0, [0.5], em_weight=0.8) == pytest.approx([0.1])
