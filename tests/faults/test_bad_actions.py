"""Bad actions: a ValueError naming the env and worker before anything is sent, under
``check_actions`` ("safe" by default, "strict", "off"); the manager stays usable.

(envmgr.frontend.action_checks)
"""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv
from support.envs import BoxActionEnv, DictObsEnv, assert_same
from support.helpers import cartpole

from envmgr import SubprocessEnvManager

pytestmark = pytest.mark.timeout(60)


def test_bad_discrete_actions_raise_value_error_and_the_manager_stays_usable() -> None:
    with SubprocessEnvManager(cartpole, 2, 2, check_actions="strict") as envs:
        envs.reset(seed=0)
        good = np.array([0, 1, 0, 1])
        with pytest.raises(ValueError, match=r"shape \(3,\).*\(4,\)"):
            envs.step(np.array([0, 1, 0]))
        envs.step(good)
        with pytest.raises(ValueError, match=r"env 2 \(worker 1\)"):
            envs.step(np.array([0, 1, 2, 0]))
        envs.step(good)
        with pytest.raises(ValueError, match=r"env 0 \(worker 0\)"):
            envs.step(np.array([-1, 1, 0, 0]))
        envs.step(good)


def test_float_action_for_discrete_names_the_env() -> None:
    with SubprocessEnvManager(cartpole, 2, 2) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError) as ei:
            envs.step(np.array([0.0, 1.0, 0.5, 1.0]))
        message = str(ei.value)
        assert "float" in message
        assert "env 2" in message and "worker 1" in message, message
        obs, *_ = envs.step(np.array([0, 1, 0, 1]))
        assert obs.shape == (4, 4)


def test_nan_box_action_raises_value_error_naming_the_env() -> None:
    with SubprocessEnvManager(BoxActionEnv, 2, 2, check_actions="strict") as envs:
        envs.reset(seed=0)
        actions = np.zeros((4, 2), dtype=np.float32)
        actions[3, 1] = np.nan
        with pytest.raises(ValueError, match=r"env 3 \(worker 1\).*not finite"):
            envs.step(actions)
        actions[3, 1] = 1.5
        with pytest.raises(ValueError, match=r"env 3 \(worker 1\).*outside"):
            envs.step(actions)
        actions[3, 1] = 0.0
        obs, *_ = envs.step(actions)
        assert obs.shape == (4, 2)


def test_bad_multidiscrete_action_in_dict_env() -> None:
    with SubprocessEnvManager(DictObsEnv, 2, 2, check_actions="strict") as envs:
        envs.reset(seed=0)
        actions = np.zeros((4, 2), dtype=np.int64)
        actions[1, 1] = 4  # nvec is [3, 4]
        with pytest.raises(ValueError, match=r"env 1 \(worker 0\).*\[0, 4\]"):
            envs.step(actions)
        actions[1, 1] = 3
        envs.step(actions)


def test_out_of_bounds_actions_reach_the_env_unless_strict() -> None:
    """By default (and with ``check_actions="off"``) an out-of-bounds action reaches the env
    unchanged, as in SyncVectorEnv; ``"strict"`` refuses it."""
    outside = np.full((2, 2), 5.0, dtype=np.float32)
    sync = SyncVectorEnv([BoxActionEnv] * 2)
    sync.reset(seed=0)
    want = sync.step(outside)
    sync.close()
    for mode in ("safe", "off"):
        with SubprocessEnvManager(BoxActionEnv, 1, 2, check_actions=mode) as envs:
            envs.reset(seed=0)
            got = envs.step(outside)
        assert_same(got, want)
    with SubprocessEnvManager(BoxActionEnv, 1, 2, check_actions="strict") as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match=r"env 0 \(worker 0\).*outside"):
            envs.step(outside)
