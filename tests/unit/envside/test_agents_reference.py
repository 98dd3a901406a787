"""The serial multi-agent reference (``support.agents_reference``) against packing worked
out by hand on tiny scripted envs, and over real PettingZoo envs: what it packs is what
the envs said, by the spec's rules, and the same seeds give the same arrays.

No envmgr here: this is what lets the reference judge envmgr.

Facts about the real envs that matter for packing (asserted below where cheap):

* ``generated_agents_parallel_v0``: no ``possible_agents``; 5 agents at reset, arrivals
  named ``type<k>_<i>`` (new types too), deaths only once 10 agents live; its
  ``max_cycles`` never ends an episode (``num_steps`` is never counted up); spaces
  (``Box(0, 1, (10..49,))``, ``Discrete(3..9)``) are drawn per type and episode, so one
  agent name has different spaces in different episodes; rewards are Python ints; after
  an unseeded reset its spaces are seeded with ``None`` (observations not reproducible).
* MPE2 ``simple_spread_v3`` (N=3): agents ``agent_0..2``, ``Box(-inf, inf, (18,),
  float32)``, ``Discrete(5)``; everyone truncated together at step 25 (``max_cycles``).
  ``simple_tag_v3``: ``adversary_0..2`` (obs 16) and ``agent_0`` (obs 14): two groups.
* ``knights_archers_zombies_v11`` (``obs_method="vector"``): ``archer_0..1``,
  ``knight_0..1``, ``Box(-1, 1, (27, 5), float64)``, ``Discrete(6)``; a killed agent is in
  the step's dicts once with ``terminated=True``, then absent (no rewards after death);
  a zombie reaching the bottom terminates everyone left; rewards are ints.
* ``connect_four_v3`` through ``turn_based_aec_to_parallel``: ``player_0/1``, a ``Dict``
  observation (``action_mask`` (7,) int8, ``observation`` (6, 7, 2) int8), ``Discrete(7)``;
  both players stay in ``env.agents`` until the game ends, only
  ``aec_env.agent_selection``'s action is used; every step's infos carry a string
  ``"active_agent"``, and the info dicts are the AEC env's own, mutated later (the
  reference deep-copies them on receipt).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from pettingzoo import ParallelEnv
from support.agent_envs import (
    BAD_CASES,
    BadAgentsEnv,
    CheapAgentsEnv,
    SyntheticAgentsEnv,
    one_group_env,
    two_group_env,
    undeclared_env,
)
from support.agents_reference import AgentPackingError, ReferenceAgents
from support.envs import assert_same

pytestmark = pytest.mark.timeout(60)

BOX1 = spaces.Box(-10.0, 10.0, (1,), np.float32)

#: A scripted episode of agents a_0 and a_1 (obs = [step]): a_1 arrives at step 1, a_0
#: dies at step 2 (keeping a reward entry after), a_1 is truncated at step 3.
SCRIPT: list[dict[str, Any]] = [
    {"obs": {"a_0": 0.0}, "info": {"a_0": {"x": 1}}, "agents": ["a_0"]},
    {
        "obs": {"a_0": 1.0, "a_1": 1.5},
        "rew": {"a_0": 0.5},
        "info": {"a_0": {"x": 2}, "a_1": {"y": 0.25}},
        "agents": ["a_0", "a_1"],
    },
    {
        "obs": {"a_0": 2.0, "a_1": 2.5},
        "rew": {"a_0": 1.0, "a_1": 2.0},
        "term": {"a_0": True},
        "info": {"a_0": {"x": 3}, "a_1": {}},
        "agents": ["a_1"],
    },
    {
        "obs": {"a_1": 3.5},
        "rew": {"a_0": 9.0, "a_1": 3.0},
        "trunc": {"a_1": True},
        "info": {"a_1": {"y": 0.5}},
        "agents": [],
    },
]


class ScriptedEnv(ParallelEnv):  # type: ignore[type-arg]
    """Plays ``SCRIPT`` (observations shifted by 10 per episode); records the actions."""

    metadata: dict[str, Any] = {"name": "scripted_v0"}

    def __init__(self) -> None:
        self.possible_agents = ["a_0", "a_1"]
        self.agents: list[str] = []
        self.episodes = -1
        self.actions: list[dict[str, Any]] = []

    def observation_space(self, agent: str) -> spaces.Box:
        return BOX1

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(4)

    def _obs(self, page: dict[str, Any]) -> dict[str, np.ndarray]:
        shift = 10.0 * self.episodes
        return {a: np.array([v + shift], np.float32) for a, v in page["obs"].items()}

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.episodes += 1
        self.t = 0
        self.agents = list(SCRIPT[0]["agents"])
        return self._obs(SCRIPT[0]), {a: dict(i) for a, i in SCRIPT[0]["info"].items()}

    def step(self, actions: dict[str, Any]) -> Any:
        self.actions.append(dict(actions))
        self.t += 1
        page = SCRIPT[self.t]
        self.agents = list(page["agents"])
        info = {a: dict(i) for a, i in page["info"].items()}
        return self._obs(page), page["rew"], page.get("term", {}), page.get("trunc", {}), info


def column(obs: np.ndarray) -> list[float]:
    return obs[:, 0].tolist()


def test_a_scripted_episode_packs_as_worked_out_by_hand() -> None:
    ref = ReferenceAgents([ScriptedEnv, ScriptedEnv])
    assert ref.rows == [(0, "a_0"), (0, "a_1"), (1, "a_0"), (1, "a_1")]
    assert ref.num_envs == 4 and ref.single_observation_space == BOX1
    obs, infos = ref.reset(seed=0)
    assert column(obs) == [0.0, 0.0, 0.0, 0.0]
    assert infos["x"].tolist() == [1, 0, 1, 0] and infos["_x"].tolist() == [1, 0, 1, 0]
    assert infos["active"].tolist() == [True, False, True, False]
    assert infos["_active"].all()

    obs, rew, term, trunc, infos = ref.step(np.array([1, 2, 3, 0]))
    assert ref.envs[0].env.actions == [{"a_0": 1}]  # a_1 was not there yet: no action
    assert ref.envs[1].env.actions == [{"a_0": 3}]
    assert column(obs) == [1.0, 1.5, 1.0, 1.5]  # a_1 arrives with its first obs
    assert rew.tolist() == [0.5, 0.0, 0.5, 0.0] and rew.dtype == np.float64
    assert infos["x"].tolist() == [2, 0, 2, 0] and infos["y"].tolist() == [0, 0.25, 0, 0.25]
    assert infos["active"].all() and not term.any() and not trunc.any()

    obs, rew, term, trunc, infos = ref.step(np.array([1, 2, 3, 0]))
    assert ref.envs[0].env.actions[-1] == {"a_0": 1, "a_1": 2}
    assert column(obs) == [2.0, 2.5, 2.0, 2.5]  # a_0 dies: shown once, active
    assert term.tolist() == [True, False, True, False]
    assert rew.tolist() == [1.0, 2.0, 1.0, 2.0]
    assert "y" not in infos  # a_1's info is {}: no row has the key
    assert infos["active"].all()

    obs, rew, term, trunc, infos = ref.step(np.array([1, 2, 3, 0]))
    assert ref.envs[0].env.actions[-1] == {"a_1": 2}  # the dead get no action
    assert column(obs) == [0.0, 3.5, 0.0, 3.5]  # dead: zeros, and its reward entry is ignored
    assert rew.tolist() == [0.0, 3.0, 0.0, 3.0]
    assert trunc.tolist() == [False, True, False, True] and not term.any()
    assert infos["active"].tolist() == [False, True, False, True]
    assert "x" not in infos and infos["y"].tolist() == [0, 0.5, 0, 0.5]

    obs, rew, term, trunc, infos = ref.step(np.array([1, 2, 3, 0]))  # next-step autoreset
    assert len(ref.envs[0].env.actions) == 3  # reset, not stepped
    assert column(obs) == [10.0, 0.0, 10.0, 0.0]
    assert not rew.any() and not term.any() and not trunc.any()
    assert infos["active"].tolist() == [True, False, True, False]
    assert infos["x"].tolist() == [1, 0, 1, 0]


def test_same_step_resets_in_the_ending_step_with_final_obs_of_the_active_rows() -> None:
    ref = ReferenceAgents([ScriptedEnv], autoreset_mode=AutoresetMode.SAME_STEP)
    ref.reset(seed=0)
    for _ in range(2):
        ref.step(np.array([0, 0]))
    obs, rew, term, trunc, infos = ref.step(np.array([0, 0]))
    assert column(obs) == [10.0, 0.0]  # the reset's observations (a_1 has none yet)
    assert rew.tolist() == [0.0, 3.0] and trunc.tolist() == [False, True]
    assert infos["active"].tolist() == [True, True]  # a_0 by the reset, a_1 by the end
    assert infos["_final_obs"].tolist() == [False, True]
    np.testing.assert_array_equal(infos["final_obs"][1], [3.5])
    assert infos["final_obs"][0] is None
    assert infos["final_info"]["y"].tolist() == [0.0, 0.5]
    assert infos["final_info"]["_y"].tolist() == [False, True]
    assert infos["x"].tolist() == [1, 0]  # the reset's info
    assert "y" not in infos


def test_disabled_leaves_an_ended_env_alone_until_a_masked_reset() -> None:
    ref = ReferenceAgents([ScriptedEnv, ScriptedEnv], autoreset_mode="Disabled")
    ref.reset(seed=0)
    for _ in range(3):
        ref.step(np.zeros(4, np.int64))
    obs, rew, term, trunc, infos = ref.step(np.zeros(4, np.int64))
    assert not obs.any() and not infos["active"].any() and set(infos) == {"active", "_active"}
    assert len(ref.envs[0].env.actions) == 3
    obs, infos = ref.reset(options={"reset_mask": np.array([False, False, True, True])})
    assert column(obs)[2:] == [10.0, 0.0] and infos["x"].tolist() == [0, 0, 1, 0]
    assert ref.envs[0].env.episodes == 0 and ref.envs[1].env.episodes == 1
    with pytest.raises(ValueError, match="equal within each env"):
        ref.reset(options={"reset_mask": np.array([True, False, True, True])})


def test_done_on_any_ends_the_episode_at_the_first_death_and_truncates_the_rest() -> None:
    ref = ReferenceAgents([ScriptedEnv], done_on="any")
    ref.reset(seed=0)
    ref.step(np.array([0, 0]))
    _, _, term, trunc, _ = ref.step(np.array([0, 0]))
    assert term.tolist() == [True, False] and trunc.tolist() == [False, True]
    obs, *_ = ref.step(np.array([0, 0]))
    assert column(obs) == [10.0, 0.0]  # reset, not stepped
    assert len(ref.envs[0].env.actions) == 2


def test_slots_without_possible_agents_go_in_first_seen_order_and_start_afresh() -> None:
    env_fn = lambda: undeclared_env(late=2, max_steps=6)  # noqa: E731
    ref = ReferenceAgents([env_fn], max_agents=4, autoreset_mode="SameStep")
    obs, infos = ref.reset(seed=3)
    env = ref.envs[0].env
    seen = list(env.agents)
    assert obs[: len(seen), 1].tolist() == [env._index[a] for a in seen]  # column 1: agent
    for _ in range(6):
        before = set(env.agents)
        obs, _, term, trunc, infos = ref.step(np.zeros(4, np.int64))
        if not env.agents or set(env.agents) - before:
            break
    arrived = [a for a in env.agents if a not in before]
    seen += arrived
    for slot, agent in enumerate(seen):
        if agent in env.agents:
            assert obs[slot, 1] == env._index[agent]
    with pytest.raises(
        AgentPackingError, match=r"env 0: agent 'agent_\d' is agent 4 .*max_agents=3"
    ):
        small = ReferenceAgents([lambda: undeclared_env(late=0)], max_agents=3)
        small.reset(seed=0)


def test_groups_are_named_by_prefix_ordered_by_first_agent_and_rows_are_per_group() -> None:
    ref = ReferenceAgents([two_group_env, two_group_env])
    assert ref.group_names == ("scout", "tank")
    assert ref.rows["scout"] == [(0, "scout_0"), (0, "scout_1"), (1, "scout_0"), (1, "scout_1")]
    assert ref.rows["tank"][3] == (1, "tank_0")
    obs, infos = ref.reset(seed=0)
    assert obs["scout"].shape == (4, 3) and obs["tank"].shape == (6, 5)
    assert obs["tank"][3:, 1].tolist()[:2] == [2.0, 3.0]  # env 1's tank_0, tank_1
    actions = {name: space.sample() for name, space in ref.action_spaces().items()}
    out = ref.step(actions)
    assert all(set(part) == {"scout", "tank"} for part in out)
    mixed = lambda: SyntheticAgentsEnv(kinds=(("red", 1, 3), ("blue", 1, 3), ("green", 1, 4)))  # noqa: E731
    # red_0 and blue_0 share their spaces but no prefix.
    assert ReferenceAgents([mixed]).group_names == ("group0", "green")


@pytest.mark.parametrize("case", BAD_CASES)
def test_the_reference_refuses_what_the_spec_calls_an_error(case: str) -> None:
    ref = ReferenceAgents([lambda: one_group_env(), lambda: BadAgentsEnv(case)])
    ref.reset(seed=0)
    ref.step(np.zeros(8, np.int64))
    with pytest.raises(AgentPackingError, match=r"env 1: agent '(agent_1|intruder_0)'"):
        ref.step(np.zeros(8, np.int64))


def test_same_seeds_give_the_same_arrays_and_an_unseeded_reset_goes_on() -> None:
    runs = []
    for _ in range(2):
        ref = ReferenceAgents([CheapAgentsEnv] * 2, autoreset_mode="SameStep")
        out: list[Any] = [ref.reset(seed=7)]
        rng = np.random.default_rng(0)
        out += [ref.step(rng.integers(4, size=32)) for _ in range(30)]
        out.append(ref.reset())
        runs.append(out)
    assert_same(runs[0], runs[1])
    assert not np.array_equal(runs[0][0][0], runs[0][-1][0])  # a new episode, not a replay


# ---------------------------------------------------------------- real PettingZoo envs


def check_rows_against_dicts(ref: ReferenceAgents, got: tuple[Any, ...], raw: Any) -> None:
    """Every row of a one-group step against the env's own dicts (possible_agents)."""
    obs, rew, term, trunc, infos = got
    for r, (e, agent) in enumerate(ref.rows):
        o, rewards, terms, truncs, _ = raw[e]
        active = infos["active"][r]
        if active:
            np.testing.assert_array_equal(obs[r], o[agent])
            assert rew[r] == rewards.get(agent, 0.0)
            assert term[r] == terms.get(agent, False) and trunc[r] == truncs.get(agent, False)
        else:
            assert not np.any(obs[r]) and rew[r] == 0.0 and not term[r] and not trunc[r]


class Recorder(ParallelEnv):  # type: ignore[type-arg]
    """A ParallelEnv passing everything through and keeping its last step's result."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.possible_agents = env.possible_agents
        self.metadata = env.metadata
        self.last: Any = None

    @property
    def agents(self) -> list[str]:  # type: ignore[override]
        return self.env.agents

    def observation_space(self, agent: str) -> Any:
        return self.env.observation_space(agent)

    def action_space(self, agent: str) -> Any:
        return self.env.action_space(agent)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: dict[str, Any]) -> Any:
        self.last = self.env.step(actions)
        return self.last


def test_simple_spread_rows_are_the_agents_and_truncate_together() -> None:
    simple_spread = pytest.importorskip("mpe2.simple_spread_v3")
    fn = lambda: Recorder(simple_spread.parallel_env(N=3))  # noqa: E731
    ref = ReferenceAgents([fn, fn])
    assert ref.group_names == ("agent",) and ref.single_observation_space.shape == (18,)
    ref.reset(seed=0)
    space = ref.action_space
    space.seed(0)
    for t in range(26):
        got = ref.step(space.sample())
        if t < 25:
            check_rows_against_dicts(ref, got, [s.env.last for s in ref.envs])
        if t == 24:
            assert got[3].all() and got[4]["active"].all()
    assert not got[3].any() and got[4]["active"].all()  # t = 25: the reset


def test_simple_tag_is_two_groups_adversary_and_agent() -> None:
    simple_tag = pytest.importorskip("mpe2.simple_tag_v3")
    fn = lambda: simple_tag.parallel_env()  # noqa: E731
    ref = ReferenceAgents([fn, fn])
    assert ref.group_names == ("adversary", "agent")
    obs, infos = ref.reset(seed=1)
    assert obs["adversary"].shape == (6, 16) and obs["agent"].shape == (2, 14)
    acts = {name: space.sample() for name, space in ref.action_spaces().items()}
    obs, rew, *_ = ref.step(acts)
    assert rew["agent"].shape == (2,) and rew["adversary"].shape == (6,)


def test_knights_archers_zombies_deaths_leave_zero_rows() -> None:
    pytest.importorskip("pymunk")
    from pettingzoo.butterfly import knights_archers_zombies_v11 as kaz

    fn = lambda: Recorder(  # noqa: E731
        kaz.parallel_env(obs_method="vector", spawn_delay=5, max_zombies=20)
    )
    ref = ReferenceAgents([fn])
    assert ref.single_observation_space.shape == (37, 5)  # a row per agent, zombie, arrow
    ref.reset(seed=2)
    rng = np.random.default_rng(0)
    dead: set[str] = set()
    for _ in range(300):
        env = ref.envs[0].env
        got = ref.step(rng.integers(6, size=4))
        raw = env.last
        assert not (dead & set(raw[0])), "a dead agent came back in the step dicts"
        check_rows_against_dicts(ref, got, [raw])
        if not env.agents:
            break
        dead |= {a for a, t in raw[2].items() if t}
    assert dead, "nobody died before the episode's end: pick another seed"
    for r, (_, agent) in enumerate(ref.rows):
        if agent in dead:
            assert not got[4]["active"][r]


def test_generated_agents_fit_padded_into_declared_spaces() -> None:
    from pettingzoo.test.example_envs import generated_agents_parallel_v0 as gen

    declared = (spaces.Box(0, 1, (50,), np.float32), spaces.Discrete(10))
    ref = ReferenceAgents(
        [gen.parallel_env] * 2,
        max_agents=40,
        pad=True,
        observation_space=declared[0],
        action_space=declared[1],
    )
    obs, infos = ref.reset(seed=0)
    assert infos["active"].reshape(2, 40).sum(axis=1).tolist() == [5, 5]
    for e, state in enumerate(ref.envs):
        for agent in state.env.agents:
            _, j = state.slot_of[agent]
            width = state.env.observation_space(agent).shape[0]
            assert obs[e * 40 + j, width:].sum() == 0  # padded with zeros
    rng = np.random.default_rng(0)
    for _ in range(40):
        obs, _, term, _, infos = ref.step(rng.integers(3, size=80))
        assert infos["active"].sum() == sum(len(s.env.agents) for s in ref.envs) + term.sum()
    with pytest.raises(AgentPackingError, match="env 0: agent 'type"):
        unpadded = ReferenceAgents([gen.parallel_env], max_agents=40)
        unpadded.reset(seed=0)  # five agents of (mostly) different spaces in one group


def test_connect_four_turns_make_one_row_active_and_masks_ride_in_the_obs() -> None:
    from pettingzoo.classic import connect_four_v3
    from pettingzoo.utils.conversions import turn_based_aec_to_parallel

    fn = lambda: turn_based_aec_to_parallel(connect_four_v3.env())  # noqa: E731
    ref = ReferenceAgents([fn, fn])
    assert ref.group_names == ("player",)
    obs, infos = ref.reset(seed=0)
    assert isinstance(obs, dict) and obs["action_mask"].shape == (4, 7)
    assert infos["active"].tolist() == [True, False, True, False]
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(60):
        mask = obs["action_mask"]
        actions = np.array([rng.choice(np.flatnonzero(m)) if m.any() else 0 for m in mask])
        obs, rew, term, _, infos = ref.step(actions)
        live = infos["active"].reshape(2, 2)
        for e in range(2):
            if term[2 * e]:  # the game's end: both players see it, the loser's -1 too
                assert live[e].all() and sorted(rew[2 * e : 2 * e + 2]) == [-1.0, 1.0]
                ended += 1
            else:
                assert live[e].sum() == 1
                assert not obs["action_mask"][2 * e : 2 * e + 2][~live[e]].any()
        if "active_agent" in infos:
            assert infos["active_agent"].dtype == object
    assert ended >= 1
