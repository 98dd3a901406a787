"""``pad=True`` over 1-d Box actions of different sizes: one padded batch, each agent
acting with the first entries of its row."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo import ParallelEnv

from envmgr import make_parallel

SIZES = {"small_0": 2, "big_0": 4}


class EchoActionsEnv(ParallelEnv):  # type: ignore[type-arg]
    """Two agents with Box actions of sizes 2 and 4; each observes the action it got
    (zero-padded to 4) and refuses one of another size."""

    metadata: dict[str, Any] = {"name": "echo_actions_v0"}
    render_mode = None

    def __init__(self) -> None:
        self.possible_agents = list(SIZES)
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-1, 1, (4,), np.float32)

    def action_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-1, 1, (SIZES[agent],), np.float32)

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
        self.agents = list(SIZES)
        return {a: np.zeros(4, np.float32) for a in self.agents}, {}

    def step(self, actions: dict[str, Any]) -> tuple[dict, ...]:
        obs = {}
        for agent, action in actions.items():
            if np.shape(action) != (SIZES[agent],):
                raise ValueError(f"{agent} got an action of shape {np.shape(action)}")
            obs[agent] = np.zeros(4, np.float32)
            obs[agent][: SIZES[agent]] = action
        zeros = dict.fromkeys(self.agents, False)
        return obs, dict.fromkeys(self.agents, 0.0), zeros, zeros, {}


@pytest.mark.parametrize("caller", [False, True], ids=["workers", "caller_envs"])
def test_each_agent_acts_with_the_first_entries_of_its_padded_row(caller: bool) -> None:
    options: dict[str, Any] = {"caller_envs": 1, "n_workers": 1} if caller else {"n_workers": 2}
    with make_parallel(EchoActionsEnv, 2, pad=True, context="fork", **options) as envs:
        assert envs.single_action_space == spaces.Box(-1, 1, (4,), np.float32)
        envs.reset(seed=0)
        actions = np.linspace(-1, 1, envs.num_envs * 4, dtype=np.float32).reshape(-1, 4)
        obs, *_ = envs.step(actions)
    for row, (_, agent) in enumerate(envs.rows):
        size = SIZES[agent]
        np.testing.assert_array_equal(obs[row, :size], actions[row, :size])
        np.testing.assert_array_equal(obs[row, size:], 0)


def test_pad_refuses_actions_it_cannot_join_and_names_the_agents() -> None:
    class MixedActions(EchoActionsEnv):
        def action_space(self, agent: str) -> Any:
            return spaces.Discrete(3) if agent == "small_0" else super().action_space(agent)

    with pytest.raises(ValueError, match="small_0.*Discrete.*big_0.*Box"):
        make_parallel(MixedActions, 1, pad=True, n_workers=1, context="fork")
