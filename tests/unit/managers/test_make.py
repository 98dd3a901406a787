"""envmgr.make: registered env ids -> SubprocessEnvManager, with gymnasium.make_vec's arguments.

Uneven splits and the vector modes need the manager's num_envs= / vector_fn= arguments;
their tests are in test_make_vec.py.

The user-registered envs here are registered at run time, inside the test, so a worker
started with spawn or forkserver cannot find them in its own registry: they work only
because make() ships the EnvSpec from this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from envmgr import SubprocessEnvManager
from envmgr.managers.make import make

pytestmark = pytest.mark.timeout(120)

SPAWNING = [
    m for m in ("spawn", "forkserver") if m in __import__("multiprocessing").get_all_start_methods()
]


class ConstEnv(gym.Env):  # type: ignore[type-arg]
    """Observations of length ``size`` filled with the step number; reward ``reward``."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, size: int = 2, reward: float = 1.0, episode_len: int = 3) -> None:
        self.size, self.reward, self.episode_len = size, reward, episode_len
        self.observation_space = spaces.Box(0.0, 100.0, shape=(size,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # type: ignore[no-untyped-def]
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(self.size, np.float32), {}

    def step(self, action: Any):  # type: ignore[no-untyped-def]
        self.t += 1
        obs = np.full(self.size, self.t, np.float32)
        return obs, self.reward, self.t >= self.episode_len, False, {"pid": os.getpid()}


@pytest.fixture(params=["class", "string"])
def user_env_id(request: pytest.FixtureRequest) -> Iterator[str]:
    """An env registered just now, with a class or a "module:Class" string entry point."""
    env_id = f"EnvmgrMakeTest{request.param.title()}-v0"
    entry = ConstEnv if request.param == "class" else f"{__name__}:ConstEnv"
    gym.register(env_id, entry_point=entry, kwargs={"size": 2})
    try:
        yield env_id
    finally:
        del gym.registry[env_id]


def test_cartpole_under_each_start_method(start_method: str) -> None:
    with make("CartPole-v1", 4, n_workers=2, vector_kwargs={"context": start_method}) as envs:
        assert isinstance(envs, SubprocessEnvManager)
        assert (envs.num_envs, envs.n_workers, envs.envs_per_worker) == (4, 2, 2)
        assert envs.context == start_method
        assert envs.spec is not None and envs.spec.id == "CartPole-v1"
        obs, _ = envs.reset(seed=7)
        actions = np.array([0, 1, 1, 0])
        got = [envs.step(actions) for _ in range(3)]
    # The same as Gymnasium's own vector env for the same seed and actions.
    ref = gym.make_vec("CartPole-v1", 4, vectorization_mode="sync")
    try:
        ref_obs, _ = ref.reset(seed=7)
        np.testing.assert_array_equal(obs, ref_obs)
        for step in got:
            want = ref.step(actions)
            for a, b in zip(step[:4], want[:4], strict=True):
                np.testing.assert_array_equal(a, b)
    finally:
        ref.close()


@pytest.mark.parametrize("context", SPAWNING)
def test_user_registered_env_without_the_workers_registry(user_env_id: str, context: str) -> None:
    with make(
        user_env_id, 4, n_workers=2, size=3, reward=2.5, vector_kwargs={"context": context}
    ) as envs:
        assert envs.single_observation_space.shape == (3,)  # kwargs override the spec's size=2
        obs, _ = envs.reset(seed=0)
        np.testing.assert_array_equal(obs, np.zeros((4, 3)))
        obs, rewards, term, trunc, infos = envs.step(np.zeros(4, dtype=np.int64))
        np.testing.assert_array_equal(obs, np.ones((4, 3)))
        np.testing.assert_array_equal(rewards, np.full(4, 2.5))
        assert len(set(infos["pid"].tolist()) - {os.getpid()}) == 2  # two worker processes
        assert envs.spec is not None and envs.spec.id == user_env_id
        # The env kwargs, then make_vec's own arguments, as make_vec records them.
        recorded = {"num_envs": 4, "vectorization_mode": "async", "wrappers": ()}
        recorded["vector_kwargs"] = {"context": context}
        assert envs.spec.kwargs == {"size": 3, "reward": 2.5, **recorded}


def test_env_kwargs_given_to_make_go_to_the_env() -> None:
    # make("Pendulum-v1", num_envs=4, n_workers=2, g=9.0) used to fail with
    # "SubprocessEnvManager.__init__() got an unexpected keyword argument 'g'".
    with make("Pendulum-v1", num_envs=4, n_workers=2, g=9.0) as envs:
        assert (envs.num_envs, envs.n_workers) == (4, 2)
        assert envs.get_attr("g") == (9.0,) * 4
        assert envs.spec is not None and envs.spec.kwargs["g"] == 9.0


def test_env_kwargs_include_make_arguments() -> None:
    with make("CartPole-v1", 2, n_workers=1, max_episode_steps=4) as envs:
        envs.reset(seed=0)
        truncated = [envs.step(np.array([0, 1]))[3] for _ in range(4)]
    assert not truncated[2].any() and truncated[3].all()


def test_wrappers_apply_in_order_and_may_be_lambdas() -> None:
    wrappers = [
        lambda env: gym.wrappers.TransformReward(env, lambda r: r * 10.0),
        lambda env: gym.wrappers.TransformReward(env, lambda r: r + 1.0),
    ]
    with make(
        "CartPole-v1", 2, n_workers=2, wrappers=wrappers, vector_kwargs={"context": "forkserver"}
    ) as envs:
        envs.reset(seed=0)
        _, rewards, *_ = envs.step(np.array([0, 1]))
    np.testing.assert_array_equal(rewards, [11.0, 11.0])  # (1 * 10) + 1, not (1 + 1) * 10


def test_defaults_one_env_and_one_worker_per_core() -> None:
    cores = os.cpu_count() or 1
    with make("CartPole-v1") as envs:  # num_envs=1, as in make_vec
        assert (envs.num_envs, envs.n_workers) == (1, 1)
    with make("CartPole-v1", 2) as envs:  # an even split on any machine
        assert (envs.num_envs, envs.n_workers) == (2, min(2, cores))


def test_manager_options_go_in_vector_kwargs() -> None:
    options = {"context": "fork", "copy": False, "autoreset_mode": "SameStep"}
    with make("CartPole-v1", 2, n_workers=1, vector_kwargs=options) as envs:
        assert envs.context == "fork"
        assert str(envs.metadata["autoreset_mode"].value) == "SameStep"
        obs, _ = envs.reset(seed=0)
        after, *_ = envs.step(np.zeros(2, dtype=np.int64))
        assert np.shares_memory(obs, after)  # copy=False: views of the same shared memory


def test_env_registered_in_main_script(tmp_path: Path) -> None:
    """A script registering a class from its own __main__ (class and "__main__:Class" string
    entry points) runs under spawn and forkserver, without an ``if __name__`` guard."""
    script = tmp_path / "user_script.py"
    script.write_text(
        textwrap.dedent(
            """
        import multiprocessing as mp
        import gymnasium as gym
        import numpy as np
        from gymnasium import spaces
        from envmgr.managers.make import make

        class MainEnv(gym.Env):
            def __init__(self, fill=1.0):
                self.fill = fill
                self.observation_space = spaces.Box(-10, 10, (2,), np.float32)
                self.action_space = spaces.Discrete(2)
            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                return np.zeros(2, np.float32), {}
            def step(self, action):
                return np.full(2, self.fill, np.float32), float(action), False, False, {}

        gym.register("MainClass-v0", entry_point=MainEnv)
        gym.register("MainString-v0", entry_point="__main__:MainEnv")
        for context in ("spawn", "forkserver"):
            if context not in mp.get_all_start_methods():
                continue
            for env_id in ("MainClass-v0", "MainString-v0"):
                options = {"context": context}
                with make(env_id, 4, n_workers=2, fill=3.0, vector_kwargs=options) as envs:
                    envs.reset(seed=0)
                    obs, rew, *_ = envs.step(np.array([0, 1, 1, 0]))
                    print(context, env_id, obs[:, 0].tolist(), rew.tolist(), envs.spec.entry_point)
        """
        )
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=100, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 * len(SPAWNING)
    for line in lines:
        assert "[3.0, 3.0, 3.0, 3.0] [0.0, 1.0, 1.0, 0.0] __main__:MainEnv" in line


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_envs": 2, "n_workers": 3}, "n_workers=3 is more than num_envs=2"),
        ({"num_envs": 0}, "num_envs must be a positive int"),
        ({"num_envs": 2, "n_workers": 0}, "n_workers must be a positive int"),
        ({"num_envs": True}, "num_envs must be a positive int"),
        ({"num_envs": 2, "vector_kwargs": [("a", 1)]}, "vector_kwargs must be a dict"),
        ({"num_envs": 2, "wrappers": [42]}, r"wrappers\[0\] is 42"),
        ({"num_envs": 2, "wrappers": gym.wrappers.TimeLimit}, "wrappers must be a list"),
        ({"vectorization_mode": "threads"}, r"vectorization_mode must be one of 'async', 'sync'"),
        (
            {"vectorization_mode": "vector_entry_point", "wrappers": [lambda e: e]},
            "wrappers cannot be used with vectorization_mode='vector_entry_point'",
        ),
    ],
)
def test_bad_arguments_raise_value_error(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make("CartPole-v1", **kwargs)


def test_unknown_env_id() -> None:
    with pytest.raises(gym.error.Error, match="NoSuchEnv"):
        make("NoSuchEnv-v0", 2)
    with pytest.raises(TypeError, match="env_id"):
        make(42, 2)  # type: ignore[arg-type]


def test_bad_string_entry_point_fails_in_the_caller() -> None:
    gym.register("EnvmgrBrokenEntry-v0", entry_point="no_such_module_for_envmgr:Env")
    try:
        with pytest.raises(ModuleNotFoundError, match="no_such_module_for_envmgr"):
            make("EnvmgrBrokenEntry-v0", 2)
    finally:
        del gym.registry["EnvmgrBrokenEntry-v0"]


def test_vector_entry_point_mode_needs_one() -> None:
    with pytest.raises(
        ValueError, match="'Pendulum-v1' is registered without a vector_entry_point"
    ):
        make("Pendulum-v1", 2, vectorization_mode="vector_entry_point")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"env_kwargs": {"g": 9.0}}, r"make\(id, num_envs, g=9\.0\) instead of env_kwargs="),
        ({"context": "spawn"}, r"context is a manager option, not an argument of 'Pendulum-v1': "
                               r"pass vector_kwargs=\{'context': 'spawn'\}"),
        ({"copy": False, "step_timeout": 1.0}, r"copy, step_timeout are manager options.*"
                                               r"vector_kwargs=\{'copy': False, 'step_timeout'"),
        ({"envs_per_worker": 2}, "make\\(\\) sets it itself: give the number of worker "
                                 "processes as n_workers=N"),
        ({"env_fns": lambda: None}, "env_fns is not an argument of 'Pendulum-v1'"),
        ({"vector_kwargs": {"n_workers": 2}}, "vector_kwargs may not contain 'n_workers'"),
        ({"vector_kwargs": {"env_fns": [print]}}, "vector_kwargs may not contain 'env_fns'"),
    ],
)  # fmt: skip
def test_misplaced_arguments_say_where_they_belong(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        make("Pendulum-v1", 2, **kwargs)


def test_env_kwargs_named_like_manager_options_reach_an_env_that_takes_them() -> None:
    # The check above only fires when the env's signature cannot take the name.
    class CopyEnv(ConstEnv):
        def __init__(self, copy: int = 0) -> None:
            super().__init__(size=1, reward=float(copy))

    gym.register("EnvmgrCopyKwarg-v0", entry_point=CopyEnv)
    try:
        with make("EnvmgrCopyKwarg-v0", 1, copy=7, vector_kwargs={"context": "fork"}) as envs:
            envs.reset(seed=0)
            assert envs.step(np.zeros(1, dtype=np.int64))[1].tolist() == [7.0]
    finally:
        del gym.registry["EnvmgrCopyKwarg-v0"]
