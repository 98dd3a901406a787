"""``EnvmgrVecEnv`` behaves as Stable-Baselines3's ``SubprocVecEnv``, step for step.

Most tests run the same factories, seeds and actions through ``EnvmgrVecEnv`` and
SB3's in-process ``DummyVecEnv`` (whose step semantics are ``SubprocVecEnv``'s) and
require identical observations, rewards, dones, infos and reset infos; one test
compares with ``SubprocVecEnv`` itself, types included. PPO trained through both
learns bit-identical parameters.

Skipped as a whole when Stable-Baselines3 is not installed
(``pip install "envmgr[sb3]"``).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from support.envs import EnvBoom, ExplodingEnv, assert_same

sb3 = pytest.importorskip(
    "stable_baselines3",
    reason='Stable-Baselines3 is not installed: pip install "envmgr[sb3]" to run these tests',
)

from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.monitor import Monitor  # noqa: E402
from stable_baselines3.common.vec_env import (  # noqa: E402
    DummyVecEnv,
    SubprocVecEnv,
    VecEnv,
    VecFrameStack,
    VecMonitor,
    VecNormalize,
    VecTransposeImage,
)

from envmgr.integrations.sb3 import EnvmgrVecEnv  # noqa: E402

pytestmark = pytest.mark.timeout(120)

# This module's env classes travel to the workers by value: importing this module
# there would import SB3 and PyTorch into every worker.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

REPO = Path(__file__).resolve().parents[3]

# ------------------------------------------------------------------ envs


def space_named(name: str) -> spaces.Space[Any]:
    return {
        "box": spaces.Box(-2.0, 2.0, shape=(3,), dtype=np.float32),
        "image": spaces.Box(0, 255, shape=(8, 6, 3), dtype=np.uint8),
        "discrete": spaces.Discrete(7, start=-2),
        "multidiscrete": spaces.MultiDiscrete([3, 5]),
        "multibinary": spaces.MultiBinary(4),
        "dict": spaces.Dict(
            {"a": spaces.Box(0.0, 1.0, shape=(2,)), "b": spaces.Discrete(3)},
        ),
        "tuple": spaces.Tuple((spaces.Discrete(4), spaces.Box(-1.0, 1.0, shape=(2, 2)))),
    }[name]


class SpaceEnv(gym.Env):  # type: ignore[type-arg]
    """Observations drawn from ``space_named(obs)``; Discrete(2) actions; short episodes.

    Episodes end after 1-6 steps, by termination or truncation (drawn at reset).
    """

    def __init__(self, obs: str = "box", render_mode: str | None = None) -> None:
        self.observation_space = space_named(obs)
        self.action_space = spaces.Discrete(2)
        self.render_mode = render_mode
        self.counter = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        self.length = int(self.np_random.integers(1, 7))
        self.cut = bool(self.np_random.integers(2))
        self.t = 0
        return self.observation_space.sample(), {"options": options} if options else {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.t += 1
        done = self.t >= self.length
        reward = float(action) + self.t
        info = {"t": self.t} if self.t % 2 else {}
        return (
            self.observation_space.sample(),
            reward,
            done and not self.cut,
            done and self.cut,
            info,
        )

    def render(self) -> np.ndarray:
        return np.full((4, 5, 3), self.t, dtype=np.uint8)

    def bump(self, k: int, *, by: int = 1) -> int:
        self.counter += k * by
        return self.counter


class DictActionEnv(gym.Env):  # type: ignore[type-arg]
    """Dict actions; the observation echoes the action it was given."""

    def __init__(self) -> None:
        self.action_space = spaces.Dict(
            {"a": spaces.Discrete(3), "b": spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)}
        )
        self.observation_space = spaces.Box(-5.0, 5.0, shape=(3,), dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(3, dtype=np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        assert self.action_space.contains(action), action
        obs = np.array([action["a"], *action["b"]], dtype=np.float32)
        return obs, float(action["a"]), False, False, {}


def space_env(obs: str, render_mode: str | None = None) -> Callable[[], gym.Env[Any, Any]]:
    return lambda: SpaceEnv(obs, render_mode)


class RichEnv(gym.Env):  # type: ignore[type-arg]
    """Flat Dict observations (SB3 refuses nested ones), MultiDiscrete actions, rich infos.

    Episodes last 2-9 steps (drawn at reset) and end by termination or, under the
    ``TimeLimit`` of :func:`rich_env`, truncation. Step infos are empty on some
    steps and otherwise hold ints, floats, arrays and a nested dict; reset infos
    are sometimes empty and echo the ``note`` option.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, tag: int = 0, render_mode: str | None = None) -> None:
        self.observation_space = spaces.Dict(
            {"pos": spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32), "mode": spaces.Discrete(5)}
        )
        self.action_space = spaces.MultiDiscrete([3, 4])
        self.tag = tag
        self.render_mode = render_mode

    def _obs(self) -> dict[str, Any]:
        r = self.np_random
        return {"pos": r.uniform(-1.0, 1.0, size=3).astype(np.float32), "mode": int(r.integers(5))}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(2, 10))
        info: dict[str, Any] = {}
        if self.length % 2 == 0:
            info["length"] = self.length
        if options and "note" in options:
            info["note"] = options["note"]
        return self._obs(), info

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        assert self.action_space.contains(np.asarray(action, dtype=np.int64)), action
        self.t += 1
        reward = float(action[0]) + 0.5 * float(action[1]) + float(self.np_random.normal())
        info: dict[str, Any] = {}
        if self.t % 2 == 0:
            info["t"] = self.t
            info["score"] = reward
        if self.t % 3 == 0:
            info["vec"] = self.np_random.standard_normal(3)
            info["detail"] = {"flag": True, "frac": np.float32(self.t / 10)}
        return self._obs(), reward, self.t >= self.length, False, info

    def render(self) -> np.ndarray:
        return np.full((2, 3, 3), self.tag, dtype=np.uint8)


def rich_env(i: int, render_mode: str | None = None) -> Callable[[], gym.Env[Any, Any]]:
    # A 7-step TimeLimit cuts the episodes drawn longer than that: truncations.
    return lambda: gym.wrappers.TimeLimit(RichEnv(tag=i, render_mode=render_mode), 7)


def cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


@contextmanager
def pair(
    fns: list[Callable[[], gym.Env[Any, Any]]],
    reference: type[VecEnv] = DummyVecEnv,
    **kwargs: Any,
) -> Iterator[tuple[EnvmgrVecEnv, VecEnv]]:
    """``EnvmgrVecEnv`` and a reference vec env over the same factories; both closed after."""
    with EnvmgrVecEnv(fns, **kwargs) as ours:
        theirs = reference(fns)
        try:
            yield ours, theirs
        finally:
            theirs.close()


def random_actions(venv: VecEnv, steps: int, seed: int = 0) -> list[Any]:
    space = venv.action_space
    space.seed(seed)
    return [np.stack([space.sample() for _ in range(venv.num_envs)]) for _ in range(steps)]


def assert_steps_alike(a: VecEnv, b: VecEnv, steps: int = 40, same_types: bool = False) -> None:
    """Seed both, reset, step both with the same actions; everything must match.

    Rewards match at the reference's precision; with ``same_types`` the info list's
    own type is compared too.
    """
    assert a.seed(5) == b.seed(5)
    assert_same(a.reset(), b.reset(), "reset obs")
    assert_same(list(a.reset_infos), list(b.reset_infos), "reset_infos")
    for t, actions in enumerate(random_actions(a, steps)):
        obs_a, rew_a, done_a, info_a = a.step(actions)
        obs_b, rew_b, done_b, info_b = b.step(actions)
        assert_same(obs_a, obs_b, f"step {t} obs")
        # DummyVecEnv rounds rewards to float32; SubprocVecEnv and envmgr keep float64.
        np.testing.assert_array_equal(rew_a.astype(rew_b.dtype), rew_b, f"step {t} rewards")
        assert_same(done_a, done_b, f"step {t} dones")
        if not same_types:
            info_b = list(info_b)
        for info in (*info_a, *info_b):
            if "episode" in info:  # VecMonitor's record: its own wall clock
                info["episode"].pop("t")
        assert_same(info_a, info_b, f"step {t} infos")
        assert_same(list(a.reset_infos), list(b.reset_infos), f"step {t} reset_infos")


# ------------------------------------------------------------------ stepping


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_steps_match_dummy_vec_env_with_rich_infos(start_method: str) -> None:
    # Dict observations, MultiDiscrete actions, step infos of every type (sometimes
    # empty), reset infos, terminations and TimeLimit truncations.
    fns = [rich_env(i) for i in range(4)]
    with pair(fns, start_method=start_method, n_workers=2) as (ours, dummy):
        assert ours.manager.n_workers == 2
        assert_steps_alike(ours, dummy, steps=60)


def test_steps_match_subproc_vec_env_exactly() -> None:
    # Types included: SubprocVecEnv returns float64 rewards and a tuple of infos.
    fns = [rich_env(i) for i in range(2)]
    with pair(fns, SubprocVecEnv, n_workers=1) as (ours, theirs):
        assert ours.seed(1) == theirs.seed(1)
        assert_same(ours.reset(), theirs.reset(), "reset")
        for actions in random_actions(ours, 25):
            oa, ra, da, ia = ours.step(actions)
            ob, rb, db, ib = theirs.step(actions)
            assert_same((oa, ra, da), (ob, rb, db))
            assert_same(ia, list(ib))
            assert_same(list(ours.reset_infos), list(theirs.reset_infos))


def half_cheetah() -> gym.Env[Any, Any]:
    return gym.make("HalfCheetah-v5", max_episode_steps=10)


def test_mujoco_infos_match_dummy_vec_env_and_travel_in_shared_memory() -> None:
    """HalfCheetah's numpy-scalar infos come back exactly (types included) and, from the
    second step on, the workers write nothing but wake-up bytes: no info is pickled."""
    pytest.importorskip("mujoco")
    from support.helpers import traffic

    with pair([half_cheetah] * 4, n_workers=2, start_method="fork", timer_interval=1e9) as (
        ours,
        dummy,
    ):
        assert_steps_alike(ours, dummy, steps=25)
        ours.manager.reset(seed=1)
        _, written = traffic(ours.manager, random_actions(ours, 9, seed=3))
        # 9 steps within an episode (10 steps long): at most a wake-up byte per worker.
        assert written <= 2 * 9, f"workers wrote {written} bytes in 9 steps"


@pytest.mark.parametrize(
    "obs", ["box", "image", "discrete", "multidiscrete", "multibinary", "dict", "tuple"]
)
def test_observation_spaces_match_dummy_vec_env(obs: str) -> None:
    with pair([space_env(obs)] * 3, n_workers=1) as (ours, dummy):
        assert ours.observation_space == dummy.observation_space
        assert_steps_alike(ours, dummy, steps=15)


def test_dict_actions_given_per_env_as_sb3_does() -> None:
    with pair([DictActionEnv] * 3, n_workers=1) as (ours, dummy):
        ours.reset(), dummy.reset()
        space = ours.action_space
        space.seed(0)
        for _ in range(5):
            actions = [space.sample() for _ in range(3)]  # one dict per env
            assert_same(ours.step(actions)[0], dummy.step(actions)[0])


def test_cartpole_matches_dummy_vec_env() -> None:
    with pair([cartpole] * 4) as (ours, dummy):
        assert_steps_alike(ours, dummy, steps=200)


def test_seed_and_options_apply_at_the_next_reset_only() -> None:
    fns = [rich_env(i) for i in range(3)]
    with pair(fns, n_workers=1) as (ours, dummy):
        for venv in (ours, dummy):
            assert venv.seed(11) == [11, 12, 13]
            venv.set_options([{"note": "x"}, {}, {"note": 3}])
        first = ours.reset()
        assert_same(first, dummy.reset())
        assert [i.get("note") for i in ours.reset_infos] == ["x", None, 3]
        assert_same(ours.reset_infos, dummy.reset_infos)
        # Used once: the next reset is unseeded (each env's generator runs on) and
        # passes no options.
        second = ours.reset()
        assert_same(second, dummy.reset())
        assert_same(ours.reset_infos, dummy.reset_infos)
        assert all("note" not in i for i in ours.reset_infos)
        assert not np.array_equal(second["pos"], first["pos"])
        for venv in (ours, dummy):
            venv.seed(4)
            venv.set_options({"note": "all"})
        assert_same(ours.reset(), dummy.reset())
        assert [i.get("note") for i in ours.reset_infos] == ["all"] * 3
        ours.set_options([{}, {}])
        with pytest.raises(ValueError, match="2 option dicts for 3 envs"):
            ours.reset()


# ------------------------------------------------------------------ per-env requests


def test_attributes_and_methods_by_index() -> None:
    with EnvmgrVecEnv([space_env("box")] * 4, n_workers=2) as venv:
        assert venv.get_attr("counter") == [0, 0, 0, 0]
        venv.set_attr("counter", 5, indices=[1, 3])
        assert venv.get_attr("counter") == [0, 5, 0, 5]
        assert venv.get_attr("counter", indices=2) == [0]
        assert venv.get_attr("counter", indices=[3, -4, 1]) == [5, 0, 5]
        assert venv.env_method("bump", 2, indices=[0, 3], by=3) == [6, 11]
        assert venv.get_attr("counter") == [6, 5, 0, 11]  # the others untouched
        assert venv.env_method("bump", 1, indices=[]) == []
        # A repeated index runs once per mention, in order, as SubprocVecEnv's; a float
        # index is refused as there.
        assert venv.env_method("bump", 1, indices=[1, 1, -3]) == [6, 7, 8]
        with pytest.raises(TypeError):
            venv.get_attr("counter", indices=[0.0])
        venv.set_attr("counter", 5, indices=1)
        assert venv.has_attr("counter") and not venv.has_attr("no_such_thing")
        with pytest.raises(AttributeError):
            venv.get_attr("no_such_thing", indices=[0])
        with pytest.raises(IndexError, match="env index 4 is out of range for 4 envs"):
            venv.get_attr("counter", indices=[4])
        # set_attr is a plain setattr on the outermost env, as in SubprocVecEnv.
        venv.set_attr("fresh", "v", indices=0)
        assert venv.get_attr("fresh", indices=[0]) == ["v"]
        assert not venv.has_attr("fresh")


def test_env_is_wrapped_sees_the_users_wrappers_only() -> None:
    fns = [rich_env(0), lambda: Monitor(RichEnv()), rich_env(2)]
    with EnvmgrVecEnv(fns, n_workers=1) as venv:
        assert venv.env_is_wrapped(gym.wrappers.TimeLimit) == [True, False, True]
        assert venv.env_is_wrapped(Monitor) == [False, True, False]
        assert venv.env_is_wrapped(Monitor, indices=[1]) == [True]
        assert venv.env_is_wrapped(gym.Wrapper) == [True, True, True]
        assert venv.env_is_wrapped(gym.wrappers.RecordEpisodeStatistics) == [False] * 3


def test_env_is_wrapped_imports_nothing_into_the_workers() -> None:
    """SB3 asks about ``Monitor`` (VecMonitor, evaluate_policy): a worker whose envs are
    not wrapped in it must answer without importing SB3, and so PyTorch."""
    imported = lambda env, name: name in __import__("sys").modules  # noqa: E731  # by value

    class Local(gym.Wrapper):  # type: ignore[type-arg]  # no import path: sent by value
        pass

    fns = [rich_env(0), lambda: Local(RichEnv())]
    with EnvmgrVecEnv(fns, n_workers=2, start_method="forkserver") as venv:
        assert venv.env_is_wrapped(Monitor) == [False, False]
        assert venv.env_is_wrapped(Local) == [False, True]
        assert venv.env_is_wrapped(gym.wrappers.TimeLimit) == [True, False]
        for module in ("stable_baselines3", "torch"):
            assert list(venv.manager.apply(imported, module)) == [False, False], module


def test_requests_for_some_envs_leave_other_workers_alone() -> None:
    # Worker 1 is frozen (SIGSTOP): a request for worker 0's envs must not wait on it.
    with EnvmgrVecEnv([space_env("box")] * 4, n_workers=2, step_timeout=2.0) as venv:
        pid = venv.manager.worker_pids[1]
        os.kill(pid, signal.SIGSTOP)
        try:
            venv.set_attr("counter", 7, indices=[0, 1])
            assert venv.get_attr("counter", indices=[1, 0]) == [7, 7]
        finally:
            os.kill(pid, signal.SIGCONT)
        assert venv.get_attr("counter") == [7, 7, 0, 0]


def test_images_and_render() -> None:
    fns = [rich_env(i, render_mode="rgb_array") for i in range(3)]
    with pair(fns, n_workers=1) as (ours, dummy):
        assert ours.render_mode == "rgb_array"
        # SubprocVecEnv's metadata (DummyVecEnv's is the env's own).
        assert ours.metadata == {"render_modes": ["human", "rgb_array"]}
        ours.reset()
        dummy.reset()
        assert_same(list(ours.get_images()), list(dummy.get_images()))
        big = ours.render()
        assert_same(big, dummy.render())
        assert big.shape == (4, 6, 3)
    with EnvmgrVecEnv([rich_env(0)], n_workers=1) as plain:
        with pytest.warns(UserWarning, match="render mode is None"):
            assert plain.get_images() == [None]


# ------------------------------------------------------------------ construction


def test_unknown_start_method_raises_value_error_before_starting_anything() -> None:
    # SubprocVecEnv's own error, which SB3's tests match, then the choices.
    with pytest.raises(ValueError) as theirs:
        SubprocVecEnv([cartpole], start_method="illegal_method")
    with pytest.raises(ValueError, match="cannot find context for 'illegal_method'") as ours:
        EnvmgrVecEnv([cartpole], start_method="illegal_method")
    assert str(ours.value).startswith(str(theirs.value))
    for method in multiprocessing.get_all_start_methods():
        assert repr(method) in str(ours.value)
    with pytest.raises(ValueError, match="empty"):
        EnvmgrVecEnv([])
    with pytest.raises(ValueError, match="n_workers=3 is more than the 2 envs"):
        EnvmgrVecEnv([cartpole] * 2, n_workers=3)
    with pytest.raises(TypeError, match="autoreset"):
        EnvmgrVecEnv([cartpole], autoreset_mode="NextStep")


def test_start_method_and_manager_options_reach_the_manager() -> None:
    with EnvmgrVecEnv([cartpole] * 2, "spawn", n_workers=1, step_timeout=9.0) as venv:
        assert venv.manager.context == "spawn"
        assert venv.manager.step_timeout == 9.0
        assert venv.manager.num_envs == 2
    assert venv.closed
    venv.close()  # idempotent


def test_default_workers_are_min_of_envs_and_cores() -> None:
    cores = os.cpu_count() or 1
    with EnvmgrVecEnv([cartpole] * 2) as venv:
        assert venv.manager.n_workers == min(2, cores)
    with EnvmgrVecEnv([cartpole]) as venv:
        assert venv.manager.n_workers == 1


def test_uneven_split_over_workers() -> None:
    fns = [rich_env(i) for i in range(5)]
    with pair(fns, n_workers=2) as (ours, dummy):
        assert ours.manager.n_workers == 2
        assert_steps_alike(ours, dummy, steps=30)


def test_env_errors_reach_the_caller_with_their_type() -> None:
    with EnvmgrVecEnv([lambda: ExplodingEnv(explode_at=2)], n_workers=1) as venv:
        venv.reset()
        venv.step(np.array([0]))
        venv.step(np.array([0]))
        with pytest.raises(EnvBoom):
            venv.step(np.array([0]))


def test_a_replaced_worker_ends_its_episodes_truncated() -> None:
    with EnvmgrVecEnv([space_env("box")] * 2, n_workers=2, max_restarts=1) as venv:
        venv.reset()
        os.kill(venv.manager.worker_pids[1], signal.SIGKILL)
        _, _, dones, infos = venv.step(np.array([0, 0]))
        assert dones[1]
        assert infos[1]["TimeLimit.truncated"] is True
        assert "worker 1" in infos[1]["envmgr_restarted"]
        assert "terminal_observation" not in infos[1]
        assert "envmgr_restarted" not in infos[0]
        assert venv.manager.restarts == [0, 1]


# ------------------------------------------------------------------ SB3 wrappers


def test_vec_env_wrappers_match_dummy_vec_env() -> None:
    def stack(venv: VecEnv) -> VecEnv:
        return VecFrameStack(VecMonitor(VecNormalize(venv, gamma=0.9)), n_stack=3)

    fns = [rich_env(i) for i in range(3)]
    fns_box = [space_env("box")] * 3
    with pair(fns_box, n_workers=1) as (ours, dummy):
        assert_steps_alike(stack(ours), stack(dummy), steps=30)
    with pair([space_env("image")] * 2, n_workers=1) as (ours, dummy):
        a, b = VecTransposeImage(ours), VecTransposeImage(dummy)
        assert a.observation_space.shape == (3, 8, 6)
        assert_steps_alike(a, b, steps=15)
    # Dict observations, VecNormalize on the Box key. The rewards are not whole
    # numbers here, so the normalized ones depend on the reward dtype: compare with
    # SubprocVecEnv (float64, as envmgr), not DummyVecEnv (float32).
    with pair(fns, SubprocVecEnv, n_workers=1) as (ours, theirs):
        a = VecNormalize(VecMonitor(ours), norm_obs_keys=["pos"])
        b = VecNormalize(VecMonitor(theirs), norm_obs_keys=["pos"])
        assert_steps_alike(a, b, steps=30)


def test_make_vec_env_with_envmgr_vec_env() -> None:
    kwargs = {"n_envs": 4, "seed": 3}
    ours = make_vec_env(
        "CartPole-v1", vec_env_cls=EnvmgrVecEnv, vec_env_kwargs={"n_workers": 2}, **kwargs
    )
    try:
        assert isinstance(ours, EnvmgrVecEnv)
        assert ours.env_is_wrapped(Monitor) == [True] * 4
        dummy = make_vec_env("CartPole-v1", **kwargs)
        obs_a, obs_b = ours.reset(), dummy.reset()
        assert_same(obs_a, obs_b)
        episodes = 0
        for actions in random_actions(ours, 120):
            _, _, done_a, info_a = ours.step(actions)
            _, _, done_b, info_b = dummy.step(actions)
            assert_same(done_a, done_b)
            for x, y in zip(info_a, info_b, strict=True):
                if "episode" in x:  # Monitor's record: same episode, own wall clock
                    episodes += 1
                    x["episode"].pop("t"), y["episode"].pop("t")
                assert_same(x, y)
        assert episodes > 0
    finally:
        ours.close()


# ------------------------------------------------------------------ training


PPO_IDENTITY = """
import gymnasium as gym
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv

from envmgr.integrations.sb3 import EnvmgrVecEnv

torch.set_num_threads(1)  # the same arithmetic either way; one thread is faster on 2 busy cores


def cartpole():
    return gym.make("CartPole-v1")


def train(venv):
    model = PPO("MlpPolicy", venv, seed=0, n_steps=128, batch_size=64, n_epochs=3, device="cpu")
    model.learn(1024)  # two rollouts: the second collected with the policy the first trained
    return model.policy.state_dict()


with EnvmgrVecEnv([cartpole] * 4, n_workers=2) as ours:
    learned = train(ours)
reference = train(DummyVecEnv([cartpole] * 4))
assert learned.keys() == reference.keys()
for name, value in reference.items():
    assert torch.equal(learned[name], value), name
untrained = PPO("MlpPolicy", DummyVecEnv([cartpole]), seed=0, device="cpu").policy.state_dict()
moved = [name for name in reference if not torch.equal(untrained[name], reference[name])]
print(f"identical: {len(reference)} tensors, {len(moved)} moved by training")
"""


@pytest.mark.timeout(180)
def test_ppo_learns_identical_parameters_through_envmgr_and_dummy_vec_env(
    run_python: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    # In a fresh interpreter: training starts PyTorch's thread pools, and the
    # tests that fork workers after this one should not inherit them.
    proc = run_python(PPO_IDENTITY, timeout=170)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "identical:" in proc.stdout
    found = re.search(r"identical: (\d+) tensors, (\d+) moved", proc.stdout)
    assert found is not None, proc.stdout
    assert 0 < int(found[2]) <= int(found[1]), proc.stdout


def test_example_runs_with_tiny_budget(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "sb3_ppo.py"), "--max-steps", "256"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "worker_0" in proc.stdout and "collect_rollouts" in proc.stdout
    assert "not solved" in proc.stdout
