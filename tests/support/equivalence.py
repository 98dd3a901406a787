"""What the equivalence tests share: rollouts of one manager beside SyncVectorEnv's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_space

from support.envs import assert_same


def local_only(backend: Backend, why: str) -> None:
    if backend.name != "local":
        pytest.skip(why)


def cartpole() -> gym.Env:  # type: ignore[type-arg]
    return gym.make("CartPole-v1")


def sample_actions(single_space: gym.Space, n: int, steps: int, seed: int = 123) -> list[Any]:
    space = batch_space(single_space, n)
    space.seed(seed)
    return [space.sample() for _ in range(steps)]


def rollout(
    venv: gym.vector.VectorEnv,
    actions: Sequence[Any],
    *,
    seed: int | list[int],
    partial_resets: dict[int, tuple[np.ndarray, Any]] | None = None,
    reset_done_envs: bool = False,
) -> list[tuple[Any, ...]]:
    """Reset, then step through ``actions``; return every result in order.

    ``partial_resets[t] = (mask, seed)`` resets the masked envs before step ``t``.
    ``reset_done_envs`` resets finished envs after each step (for the Disabled mode).
    """
    # Results are deep-copied as they come: with copy=False they are views that the
    # next step overwrites (and that must not outlive the manager).
    results: list[tuple[Any, ...]] = [("reset", *deepcopy(venv.reset(seed=seed)))]
    for t, action in enumerate(actions):
        if partial_resets and t in partial_resets:
            mask, s = partial_resets[t]
            # Fresh dicts each time: SyncVectorEnv pops "reset_mask" from the caller's dict.
            opts = {"reset_mask": mask.copy(), "note": t}
            results.append(("partial_reset", *deepcopy(venv.reset(seed=s, options=opts))))
        step = deepcopy(venv.step(action))
        results.append(("step", *step))
        if reset_done_envs:
            done = step[2] | step[3]
            if done.any():
                results.append(("reset_done", *deepcopy(venv.reset(options={"reset_mask": done}))))
    return results


def compare(
    backend: Backend,
    env_fns: Callable[[], gym.Env] | list[Callable[[], gym.Env]],  # type: ignore[type-arg]
    n_workers: int,
    envs_per_worker: int | None,
    steps: int,
    *,
    seed: int | list[int] = 7,
    autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP,
    partial_resets: dict[int, tuple[np.ndarray, Any]] | None = None,
    reset_done_envs: bool = False,
    min_episodes: int = 3,
    **manager_kwargs: Any,
) -> list[tuple[Any, ...]]:
    n = len(env_fns) if isinstance(env_fns, list) else n_workers * (envs_per_worker or 1)
    fns = list(env_fns) if isinstance(env_fns, list) else [env_fns] * n
    sync = SyncVectorEnv(fns, autoreset_mode=autoreset_mode)
    try:
        actions = sample_actions(sync.single_action_space, n, steps)
        expected = rollout(
            sync, actions, seed=seed, partial_resets=partial_resets, reset_done_envs=reset_done_envs
        )
    finally:
        sync.close()
    with backend(
        env_fns, n_workers, envs_per_worker, autoreset_mode=autoreset_mode, **manager_kwargs
    ) as envs:
        got = rollout(
            envs, actions, seed=seed, partial_resets=partial_resets, reset_done_envs=reset_done_envs
        )
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g[0] == e[0]
        assert_same(g[1:], e[1:], path=f"result {i} ({e[0]})")
    episodes = sum(int((r[3] | r[4]).sum()) for r in expected if r[0] == "step")
    assert episodes >= min_episodes, f"only {episodes} episodes ended: the test is too short"
    return expected
