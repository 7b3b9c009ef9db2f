"""PettingZoo's own checks on env() with its offline defaults (SmolLM2 tokenizer, synthetic
world, MiniLM retriever), in both workflows and both step modes."""

import pytest
from pettingzoo.test import api_test, render_test, seed_test

from envs import search_team_v0

COMBOS = [(w, m) for w in ("hierarchical", "cascade") for m in ("turn", "token")]


def _small(workflow, mode, **kw):
    # a short turn budget keeps token-mode episodes (random tokens) a few hundred steps long
    return search_team_v0.env(workflow=workflow, step_mode=mode, max_turn_tokens=24,
                              max_context_tokens=1024, **kw)


@pytest.mark.parametrize("workflow, mode", COMBOS)
def test_api(workflow, mode):
    api_test(_small(workflow, mode), num_cycles=200)


@pytest.mark.parametrize("workflow, mode", COMBOS)
def test_seed(workflow, mode):
    seed_test(lambda **kw: _small(workflow, mode, **kw), num_cycles=50)


@pytest.mark.parametrize("workflow, mode", COMBOS)
def test_render(workflow, mode):
    render_test(lambda render_mode=None: _small(workflow, mode, render_mode=render_mode))


def test_default_env_is_offline_and_complete():
    env = search_team_v0.env()
    env.reset(seed=0)
    raw = env.unwrapped
    assert raw.possible_agents == ["leader_0", "searcher_0", "searcher_1", "searcher_2",
                                   *[f"answerer_{j}" for j in range(5)]]
    assert raw.vocab_size == 49152 and raw.config.top_k == 3 and raw.config.num_candidates == 5
    assert len(raw.questions) >= 7 * 100
    obs = env.observe("leader_0")
    n = int(obs["length"][0])
    assert "Question:" in raw.tokenizer.decode(obs["observation"][:n].tolist())
    assert raw.observation_space("leader_0").contains(obs)


def test_env_copies_share_the_chat_frames_and_each_builds_its_own_spaces_on_demand():
    """Rollouts make many env copies: they share one ChatFormat per tokenizer (its cache of
    encoded frames), and an env builds its gymnasium spaces only when asked, its own ones."""
    import gymnasium

    a, b = (search_team_v0.raw_env(max_turn_tokens=24, max_context_tokens=1024) for _ in range(2))
    assert a.chat is b.chat
    assert "_spaces" not in vars(a)  # not built by the constructor (a cached property)
    space = a.action_space("searcher_0")
    assert isinstance(space, gymnasium.spaces.Sequence) and space.feature_space.n == a.vocab_size
    assert a.action_space("searcher_0") is space  # built once
    assert a.observation_space("leader_0").spaces["observation"].shape == (1024,)
    assert b.action_space("searcher_0") is not space  # one env's seeding never moves another's
    assert sorted(a.observation_spaces) == sorted(a.possible_agents)


def test_every_team_setting_is_a_keyword_of_each_env_factory(tokenizer, retriever):
    """TeamConfig declares the team's settings once: raw_env, env() and env_fn() take each of
    its fields by name, and refuse a misspelt one by name."""
    from conftest import QUESTION

    from envs import env_fn, make_env
    from envs.rewards import RewardConfig
    from envs.team import TeamConfig

    assert TeamConfig.keywords() == (
        "workflow", "max_waves", "max_searchers", "max_searcher_turns", "max_leader_turns",
        "max_answerer_turns", "num_candidates", "top_k", "max_turn_tokens", "max_context_tokens",
        "rewards", "prompts")
    team = dict(workflow="cascade", max_waves=2, max_searchers=2, max_searcher_turns=3, max_leader_turns=5,
                max_answerer_turns=1, num_candidates=3, top_k=4, max_turn_tokens=32, max_context_tokens=1024,
                rewards={"em_weight": 0.5}, prompts="short")
    common = dict(tokenizer=tokenizer, retriever=retriever, questions=[QUESTION])
    for make in (search_team_v0.raw_env, lambda **kw: search_team_v0.env(**kw).unwrapped,
                 lambda **kw: env_fn(**kw)()):
        raw = make(**team, **common)
        assert raw.config == TeamConfig(**{**team, "rewards": RewardConfig(em_weight=0.5)})
    assert make_env(rewards=None, **common).config == TeamConfig()  # the defaults, rewards=None too
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'max_wave'; did you mean 'max_waves'\?"):
        search_team_v0.raw_env(max_wave=2, **common)
    with pytest.raises(TypeError, match="'colour'; the team's settings are workflow, max_waves"):
        make_env(colour="red", **common)
