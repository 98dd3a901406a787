"""envmgr.make as a drop-in for gymnasium.make_vec: uneven splits, the vector modes, and
Gymnasium's action semantics end to end.

These need the manager's ``num_envs=`` / ``vector_fn=`` arguments and its
``check_actions="safe"`` default (the refactor branch); before that merge they fail with
``TypeError: ... unexpected keyword argument 'num_envs'`` or a strict-mode ``ValueError``.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from envmgr.managers.make import make

pytestmark = pytest.mark.timeout(120)

FORK = {"context": "fork"}


class PidEnv(gym.Env):  # type: ignore[type-arg]
    """Reports the process it runs in, to see which worker hosts which env."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # type: ignore[no-untyped-def]
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {"pid": os.getpid()}

    def step(self, action: Any):  # type: ignore[no-untyped-def]
        return np.zeros(1, np.float32), 0.0, False, False, {"pid": os.getpid()}


@pytest.fixture
def pid_env() -> Iterator[str]:
    gym.register("EnvmgrPidEnv-v0", entry_point=PidEnv)
    try:
        yield "EnvmgrPidEnv-v0"
    finally:
        del gym.registry["EnvmgrPidEnv-v0"]


def run(envs: Any, actions: list[np.ndarray], seed: int = 3) -> list[Any]:
    out = [envs.reset(seed=seed)[0]]
    for a in actions:
        out.extend(envs.step(a)[:4])
    return out


def assert_same_run(got: list[Any], want: list[Any]) -> None:
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"item {i}")


# ------------------------------------------------------------------ uneven splits


@pytest.mark.parametrize(("num_envs", "n_workers", "sizes"), [(5, 2, [3, 2]), (5, 3, [2, 2, 1])])
def test_uneven_split_gives_the_first_workers_one_more(
    pid_env: str, num_envs: int, n_workers: int, sizes: list[int]
) -> None:
    with make(pid_env, num_envs, n_workers=n_workers, vector_kwargs=FORK) as envs:
        assert (envs.num_envs, envs.n_workers) == (num_envs, n_workers)
        _, infos = envs.reset(seed=0)
    pids = infos["pid"].tolist()
    runs = [len(list(group)) for _, group in itertools.groupby(pids)]
    assert runs == sizes, pids  # consecutive envs share a worker, first workers first
    assert len(Counter(pids)) == n_workers


def test_uneven_split_equals_sync_vector_env() -> None:
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 2, 5) for _ in range(40)]
    with make("CartPole-v1", 5, n_workers=2, vector_kwargs=FORK) as envs:
        got = run(envs, actions)
    ref = gym.make_vec("CartPole-v1", 5, vectorization_mode="sync")
    try:
        assert_same_run(got, run(ref, actions))
    finally:
        ref.close()


def test_default_n_workers_is_one_per_core_up_to_num_envs() -> None:
    cores = os.cpu_count() or 1
    with make("CartPole-v1", 3, vector_kwargs=FORK) as envs:
        assert envs.n_workers == min(3, cores)


# ------------------------------------------------------------------ Gymnasium's action semantics


def test_out_of_bounds_box_actions_reach_the_env_as_with_make_vec() -> None:
    # Pendulum clips its torque to [-2, 2]; a Gaussian policy's 5.0 must not be refused.
    actions = [np.array([[5.0], [-7.5]], np.float32), np.array([[np.inf], [0.5]], np.float32)]
    with make("Pendulum-v1", 2, n_workers=2, vector_kwargs=FORK) as envs:
        got = run(envs, actions)
    ref = gym.make_vec("Pendulum-v1", 2, vectorization_mode="sync")
    try:
        assert_same_run(got, run(ref, actions))
    finally:
        ref.close()


def test_out_of_space_discrete_action_reaches_the_env() -> None:
    # CartPole asserts on an action outside Discrete(2), in the worker, as under AsyncVectorEnv.
    with make("CartPole-v1", 2, n_workers=1, vector_kwargs=FORK) as envs:
        envs.reset(seed=0)
        with pytest.raises(AssertionError, match="invalid"):
            envs.step(np.array([0, 2]))


def test_strict_checking_is_a_vector_kwarg() -> None:
    options = {**FORK, "check_actions": "strict"}
    with make("Pendulum-v1", 2, n_workers=1, vector_kwargs=options) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match=r"env 1 \(worker 0\) is \[5\.0\], outside Box"):
            envs.step(np.array([[0.0], [5.0]], np.float32))


# ------------------------------------------------------------------ vectorization modes


def test_sync_mode_equals_make_vec_sync_with_wrappers() -> None:
    wrappers = [lambda env: gym.wrappers.TransformReward(env, lambda r: 10.0 * r)]
    rng = np.random.default_rng(1)
    actions = [rng.integers(0, 2, 4) for _ in range(30)]
    with make(
        "CartPole-v1", 4, n_workers=2, vectorization_mode="sync", wrappers=wrappers,
        vector_kwargs=FORK,
    ) as envs:  # fmt: skip
        got = run(envs, actions)
    ref = gym.make_vec("CartPole-v1", 4, vectorization_mode="sync", wrappers=wrappers)
    try:
        assert_same_run(got, run(ref, actions))
    finally:
        ref.close()
    # The rewards went through the wrapper (autoreset steps give 0, as in make_vec).
    assert set(np.concatenate(got[2::4]).tolist()) == {0.0, 10.0}


def test_vector_entry_point_mode_hosts_the_batched_env() -> None:
    with make(
        "CartPole-v1", 5, n_workers=2, vectorization_mode="vector_entry_point",
        vector_kwargs=FORK, max_episode_steps=7,
    ) as envs:  # fmt: skip
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (5, 4)
        truncated = [envs.step(np.ones(5, dtype=np.int64))[3] for _ in range(7)]
    # max_episode_steps reached the vector entry point: every env truncates at step 7.
    assert not any(t.any() for t in truncated[:-1]) and truncated[-1].all()


@pytest.mark.parametrize("mode", ["async", "sync", "vector_entry_point"])
def test_a_spec_round_trips_between_make_vec_and_make(mode: str) -> None:
    """make_vec records its arguments in the vector env's spec: make() took them for
    env arguments (TypeError: unexpected keyword 'num_envs'), and its own spec gave one
    worker's share, so make(envs.spec) built a smaller manager."""
    theirs = gym.make_vec("CartPole-v1", 4, vectorization_mode=mode)
    with make(theirs.spec, n_workers=2) as ours:
        assert ours.num_envs == 4
        assert ours.spec.kwargs["vectorization_mode"] == mode
        again = gym.make_vec(ours.spec)
        assert again.num_envs == 4
        again.close()
        with make(ours.spec, n_workers=2) as twice:
            assert twice.num_envs == 4 and twice.spec.kwargs == ours.spec.kwargs
    theirs.close()
