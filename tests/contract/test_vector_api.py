"""The gymnasium VectorEnv API on SubprocessEnvManager: step/reset in two halves, calls
to every env (``call``, ``get_attr``, ``set_attr``, ``render``), reset arguments, and
the per-env step clock.

(envmgr.frontend.vector_env, envmgr.frontend.calls)
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
from conftest import Backend, on_backends
from support.envs import DictObsEnv
from support.helpers import batch_actions, full_text

from envmgr import AlreadyPendingCallError, NoAsyncCallError, SubprocessEnvManager

pytestmark = pytest.mark.timeout(60)


def test_step_async_and_step_wait() -> None:
    with SubprocessEnvManager(DictObsEnv, 2, 2) as envs:
        envs.reset_async(seed=5)
        obs, infos = envs.reset_wait()
        assert envs.observation_space.contains(obs)
        for action in batch_actions(envs, 5):
            envs.step_async(action)
            obs, rew, term, trunc, infos = envs.step_wait()
            assert rew.shape == (4,)


def test_call_get_attr_set_attr_render() -> None:
    fns = [functools.partial(DictObsEnv, tag=k, render_mode="rgb_array") for k in range(4)]
    with SubprocessEnvManager(fns, n_workers=2) as envs:
        envs.reset(seed=0)
        assert envs.render_mode == "rgb_array"
        assert envs.get_attr("tag") == (0, 1, 2, 3)
        assert envs.call("scaled", 2, offset=1) == (1, 3, 5, 7)
        assert envs.call("max_len") == (9, 9, 9, 9)  # a non-callable attribute is read
        frames = envs.render()
        assert len(frames) == 4
        for k, frame in enumerate(frames):
            assert frame.shape == (2, 3, 3) and np.all(frame == k)
        envs.set_attr("tag", 7)
        assert envs.get_attr("tag") == (7, 7, 7, 7)
        envs.set_attr("tag", [4, 5, 6, 8])
        assert envs.get_attr("tag") == (4, 5, 6, 8)
        with pytest.raises(ValueError, match="Got `3` values for 4 environments"):
            envs.set_attr("tag", [1, 2, 3])
        with pytest.raises(AttributeError) as ei:
            envs.get_attr("no_such_attribute")
        # Every env raises; whichever worker answered first is named.
        assert re.search(r"worker [01] \(envs \d-\d\), env \d, during call", full_text(ei.value))
        # Still usable after an error raised by every env.
        assert envs.get_attr("tag") == (4, 5, 6, 8)
        envs.step(envs.action_space.sample())


def test_reset_arguments_are_checked() -> None:
    with SubprocessEnvManager(DictObsEnv, 2, 2) as envs:
        with pytest.raises(ValueError, match="got length=3"):
            envs.reset(seed=[1, 2, 3])
        with pytest.raises(TypeError, match="reset_mask"):  # AsyncVectorEnv's types
            envs.reset(options={"reset_mask": np.array([1, 0, 1, 0])})
        with pytest.raises(ValueError, match="reset_mask"):
            envs.reset(options={"reset_mask": np.zeros(4, dtype=bool)})
        obs, _ = envs.reset(seed=0)  # still usable
        assert envs.observation_space.contains(obs)


def test_call_async_and_call_wait() -> None:
    fns = [functools.partial(DictObsEnv, tag=k) for k in range(4)]
    with SubprocessEnvManager(fns, n_workers=2) as envs:
        envs.call_async("scaled", 3)
        with pytest.raises(AlreadyPendingCallError):
            envs.step_async(envs.action_space.sample())
        assert envs.call_wait() == (0, 3, 6, 9)
        with pytest.raises(NoAsyncCallError):
            envs.call_wait()


@on_backends()
def test_env_step_seconds_counts_every_env_step(backend: Backend) -> None:
    """Up to date whenever asked, not only when a step happened to ship the timers."""
    with backend([DictObsEnv] * 4, 2, 2) as envs:
        envs.reset(seed=0)
        expected = np.zeros(4, dtype=np.int64)
        pending_reset = np.zeros(4, dtype=bool)
        for k, a in enumerate(batch_actions(envs, 25), 1):
            _, _, term, trunc, _ = envs.step(a)
            expected += ~pending_reset  # an autoreset step is not an env.step
            pending_reset = term | trunc
            if k in (5, 6, 25):
                seconds, steps = envs.env_step_seconds()
                assert steps.tolist() == expected.tolist(), f"after step {k}"
                assert seconds.shape == (4,) and (seconds > 0).all()


def test_np_random_seed_and_np_random_are_the_envs_as_in_sync_vector_env() -> None:
    """Both Sync- and AsyncVectorEnv give each env's; the base VectorEnv's own generator,
    which envmgr gave before, had a random seed that reset(seed=...) never touched."""
    import gymnasium as gym

    sync = gym.vector.SyncVectorEnv([DictObsEnv] * 4)
    with SubprocessEnvManager(DictObsEnv, 2, 2) as envs:
        envs.reset(seed=42)
        sync.reset(seed=42)
        assert envs.np_random_seed == sync.np_random_seed == (42, 43, 44, 45)
        ours, theirs = envs.np_random, sync.np_random
        assert isinstance(ours, tuple) and len(ours) == 4
        assert [g.random() for g in ours] == [g.random() for g in theirs]
    sync.close()
