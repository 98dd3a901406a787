"""A group lost before a masked reset is replaced, and every env of its replacement is reset.

The replacement's envs were never reset. The reset carried out to it used to be the
caller's masked one alone, so an env the mask left out had no observation: the reset
failed with ``env 0 returned an observation that is not in its observation space ...
got NoneType`` (found by ``contract/test_stateful_api.py``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend, on_backends
from gymnasium.vector import SyncVectorEnv

pytestmark = pytest.mark.timeout(120)


def _cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


@on_backends()
def test_a_masked_reset_after_a_loss_resets_every_env_of_the_replacement(backend: Backend) -> None:
    mask = np.array([False, True, False, False])
    seeds = [10, 11, 12, 13]
    with backend(_cartpole, 2, 2, max_restarts=3) as envs:
        envs.reset(seed=0)
        backend.kill(envs, 0)
        obs, infos = envs.reset(seed=seeds, options={"reset_mask": mask})
        assert envs.restarts[0] == 1
        model = SyncVectorEnv([_cartpole] * 4)
        model.reset(seed=0)
        want, _ = model.reset(seed=seeds, options={"reset_mask": mask})
        np.testing.assert_array_equal(obs[1], want[1])  # the reset asked for
        np.testing.assert_array_equal(obs[2:], want[2:])  # the group left as it was
        assert envs.single_observation_space.contains(obs[0])  # reset afresh, unseeded
        assert envs.step(np.zeros(4, dtype=np.int64))[0].shape == (4, 4)
        model.close()
