import pytest

from envs.rewards import RewardConfig, exact_match, majority_answer, normalize_answer


def test_squad_normalisation():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple, a pear") == "apple pear"
    assert exact_match("the Ostria.", ["Kesh", "ostria"]) == 1.0
    assert exact_match("Ostrian", ["Ostria"]) == 0.0
    assert exact_match("Kesh", "Kesh") == 1.0
    assert exact_match("", ["Kesh"]) == 0.0


@pytest.mark.parametrize("cands, expected", [
    (["a x", "b", "B", "a x"], "a x"),        # 2 vs 2: the first class wins
    (["b", "x", "B.", "x", "x"], "x"),         # clear majority
    (["", "", "Kesh", ""], "Kesh"),            # empty candidates do not vote
    (["", ""], ""),
    (["Port Velm", "the port velm"], "Port Velm"),  # normalised together; first spelling kept
])
def test_majority_vote(cands, expected):
    assert majority_answer(cands) == expected


def test_assign_reward_caps_at_six():
    rc = RewardConfig()
    assert [rc.assign_reward(n) for n in (0, 3, 6, 9)] == [0.0, 0.5, 1.0, 1.0]
    assert rc.leader_reward(1.0, 3) == pytest.approx(0.9 + 0.1 * 0.5)
    assert rc.leader_reward(0.0, 12) == pytest.approx(0.1)


@pytest.mark.parametrize("searches, valid, bonus", [
    (0, True, 0.0), (1, True, 0.5), (2, True, 1.0), (5, True, 1.0), (3, False, -1.0), (0, False, -1.0),
])
def test_behaviour_bonus_every_case(searches, valid, bonus):
    rc = RewardConfig()
    assert rc.behaviour_bonus(searches, valid) == bonus
    assert rc.searcher_reward(1.0, searches, valid) == pytest.approx(0.9 + 0.1 * bonus)
    assert rc.searcher_reward(0.0, searches, valid) == pytest.approx(0.1 * bonus)


def test_config_refuses_nonsense():
    with pytest.raises(ValueError, match="assign_cap"):
        RewardConfig(assign_cap=0)
    with pytest.raises(ValueError, match="format_penalty"):
        RewardConfig(format_penalty=float("nan"))
    assert RewardConfig(format_penalty=-0.5).behaviour_bonus(2, False) == -0.5
