"""SB3 PPO with parameter sharing over envmgr's multi-agent rows: a few hundred steps
through ``EnvmgrVecEnv(make_parallel(...))`` train the same weights, bit for bit, as the
same envs packed in this process by the serial reference behind SB3's ``VecEnv``
interface (``ReferenceVecEnv`` below, SB3's same-step semantics as ``EnvmgrVecEnv``
documents them).

The env keeps every agent alive until all are truncated together, so that every row is
an agent at every step: what SB3 does with padding rows is not this test's question.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

import torch  # noqa: E402
from gymnasium.vector import AutoresetMode  # noqa: E402
from stable_baselines3 import PPO  # noqa: E402
from stable_baselines3.common.utils import set_random_seed  # noqa: E402
from stable_baselines3.common.vec_env.base_vec_env import VecEnv  # noqa: E402
from support.agent_envs import SyntheticAgentsEnv  # noqa: E402
from support.agents_reference import ReferenceAgents  # noqa: E402

from envmgr import make_parallel  # noqa: E402
from envmgr.integrations.sb3 import EnvmgrVecEnv  # noqa: E402

pytestmark = pytest.mark.timeout(60)

NUM_ENVS = 2
#: Four agents, all there from the reset to the truncation at step 16.
ENV_FN = functools.partial(SyntheticAgentsEnv, late=0, max_steps=16, deaths=False)


class ReferenceVecEnv(VecEnv):
    """The reference's rows as SB3 envs, in SB3's same-step semantics."""

    def __init__(self) -> None:
        self.ref = ReferenceAgents([ENV_FN] * NUM_ENVS, autoreset_mode=AutoresetMode.SAME_STEP)
        super().__init__(
            self.ref.num_envs, self.ref.single_observation_space, self.ref.single_action_space
        )
        self._actions: Any = None

    def reset(self) -> Any:
        obs, _ = self.ref.reset()  # unseeded: the envs' default seed
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions)

    def step_wait(self) -> Any:
        obs, rewards, term, trunc, infos = self.ref.step(self._actions)
        assert infos["active"].all(), "a row without an agent: not what this test is about"
        dones = term | trunc
        out: list[dict[str, Any]] = []
        for r in range(self.num_envs):
            info: dict[str, Any] = {"TimeLimit.truncated": bool(trunc[r] and not term[r])}
            if dones[r]:
                info["terminal_observation"] = infos["final_obs"][r]
            out.append(info)
        return obs, rewards, dones, out

    def close(self) -> None:
        self.ref.close()

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        return [None] * self.num_envs

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        pass

    def env_method(self, method_name: str, *args: Any, indices: Any = None, **kw: Any) -> list:
        return [None] * self.num_envs

    def env_is_wrapped(self, wrapper_class: Any, indices: Any = None) -> list[bool]:
        return [False] * self.num_envs


def train(vec_env: VecEnv) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """PPO's weights before and after two rollouts of 16 steps over every row."""
    set_random_seed(0)
    model = PPO("MlpPolicy", vec_env, n_steps=16, batch_size=32, n_epochs=2, device="cpu")
    before = {k: v.detach().clone() for k, v in model.policy.state_dict().items()}
    model.learn(total_timesteps=2 * 16 * vec_env.num_envs)
    return before, {k: v.detach().clone() for k, v in model.policy.state_dict().items()}


def test_ppo_through_envmgr_trains_the_reference_weights() -> None:
    reference = ReferenceVecEnv()
    initial, want = train(reference)
    reference.close()
    envs = EnvmgrVecEnv(
        make_parallel(ENV_FN, NUM_ENVS, n_workers=1, autoreset_mode=AutoresetMode.SAME_STEP)
    )
    try:
        assert envs.num_envs == NUM_ENVS * 4
        _, got = train(envs)
    finally:
        envs.close()
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), f"{name} differs"
    assert any(not torch.equal(initial[k], want[k]) for k in want), "training moved nothing"
