"""Both managers give exactly SyncVectorEnv's results for the same factories, seeds
and actions: observations, rewards, terminations, truncations and infos (``_key``
masks, ``final_obs``/``final_info`` included), across autoresets.

Every test runs over the ``backend`` parameter (conftest.py): the local manager and
``RayEnvManager``; the Ray variant skips a few layouts and local-only knobs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from support.envs import (
    ACTION_SPACES,
    ActionTypeEnv,
    BigInfoEnv,
    DictObsEnv,
    TextActionEnv,
    TextObsEnv,
    assert_same,
)
from support.equivalence import cartpole, compare, local_only, sample_actions

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize(("n_workers", "envs_per_worker"), [(2, 2), (1, 3)])
def test_cartpole_matches_sync(backend: Backend, n_workers: int, envs_per_worker: int) -> None:
    if n_workers == 1:
        local_only(backend, "one layout is enough on Ray")
    compare(backend, cartpole, n_workers, envs_per_worker, steps=120)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("caller_envs", [0, 1])
def test_answers_many_times_a_pipe_buffer_arrive_whole(backend: Backend, caller_envs: int) -> None:
    """Infos and call results of 800 kB per env (a pipe holds 64 kB): the same as
    SyncVectorEnv's, with no worker stuck writing an answer nobody reads."""
    if caller_envs:
        local_only(backend, "caller_envs is the local manager's")
    big = functools.partial(BigInfoEnv, 100_000)
    kwargs = {"caller_envs": caller_envs} if caller_envs else {}
    compare(backend, [big] * 4, 2, None, steps=12, min_episodes=4, **kwargs)
    sync = SyncVectorEnv([big] * 4)
    with backend([big] * 4, 2, None, **kwargs) as envs:
        for venv in (sync, envs):
            venv.reset(seed=3)
            venv.step(np.ones(4, dtype=np.int64))
        assert_same(envs.call("frame", 100_000), sync.call("frame", 100_000), path="call")
    sync.close()


@pytest.mark.parametrize("space", sorted(ACTION_SPACES))
def test_envs_get_actions_of_the_types_sync_vector_env_gives(backend: Backend, space: str) -> None:
    """Each env's action is the same kind of value as under SyncVectorEnv (numpy scalars
    for Discrete, not Python ints): an env may act on its type, and CartPole's own
    ``Discrete.contains`` check is slower for an int. Seen in each step's info."""
    if space not in ("discrete", "text"):
        # An actor unbatches its rows with the workers' code: the scalar case and the
        # pickled fallback are the two ways an action can reach it.
        local_only(backend, "the same unbatching as the workers'; discrete and text run on Ray")
    compare(backend, functools.partial(ActionTypeEnv, space), 2, 2, steps=12)


@pytest.mark.parametrize(("n_workers", "envs_per_worker"), [(2, 2), (3, 1)])
def test_dict_obs_env_matches_sync(backend: Backend, n_workers: int, envs_per_worker: int) -> None:
    if n_workers == 3:
        local_only(backend, "one layout is enough on Ray")
    expected = compare(backend, DictObsEnv, n_workers, envs_per_worker, steps=40)
    # The infos really exercise the masks: some keys present for some envs only.
    step_infos = [r[5] for r in expected if r[0] == "step"]
    assert any("_t" in i and 0 < i["_t"].sum() < i["_t"].size for i in step_infos)
    assert any("detail" in i and "_steps" in i["detail"] for i in step_infos)


def test_sequence_of_different_factories_matches_sync(backend: Backend) -> None:
    fns = [functools.partial(DictObsEnv, max_len=k, tag=k) for k in (3, 5, 8, 12)]
    compare(backend, fns, 2, 2, steps=40)


def test_uneven_split_matches_sync(backend: Backend) -> None:
    # 5 envs over 2 workers: 3 and 2, in order.
    fns = [functools.partial(DictObsEnv, max_len=k, tag=k) for k in (3, 4, 5, 6, 7)]
    compare(backend, fns, 2, None, steps=40)


def test_list_of_seeds_matches_sync(backend: Backend) -> None:
    compare(backend, DictObsEnv, 2, 2, steps=25, seed=[11, 3, 11, 40])


def test_partial_reset_with_mask_matches_sync(backend: Backend) -> None:
    partial = {
        5: (np.array([True, False, False, True]), 100),
        12: (np.array([False, True, False, False]), None),  # only worker 0 is told
        20: (np.array([False, False, True, True]), [1, 2, 3, 4]),  # only worker 1 is told
    }
    compare(backend, DictObsEnv, 2, 2, steps=30, partial_resets=partial)


def test_partial_reset_cartpole_matches_sync(backend: Backend) -> None:
    local_only(backend, "Ray runs partial resets on the dict env (the with_mask test)")
    partial = {10: (np.array([False, True, True, False]), 5)}
    compare(backend, cartpole, 2, 2, steps=60, partial_resets=partial)


@pytest.mark.parametrize("env_fn", [DictObsEnv, cartpole], ids=["dict", "cartpole"])
def test_same_step_autoreset_matches_sync(backend: Backend, env_fn: Callable[[], gym.Env]) -> None:  # type: ignore[type-arg]
    if env_fn is cartpole:
        local_only(backend, "Ray runs the mode on the dict env")
    expected = compare(backend, env_fn, 2, 2, steps=60, autoreset_mode=AutoresetMode.SAME_STEP)
    finals = [r[5] for r in expected if r[0] == "step" and "final_obs" in r[5]]
    assert finals, "no final_obs seen"
    assert all(f["final_obs"].dtype == object and "_final_info" in f for f in finals)


@pytest.mark.parametrize("env_fn", [DictObsEnv, cartpole], ids=["dict", "cartpole"])
def test_disabled_autoreset_matches_sync(backend: Backend, env_fn: Callable[[], gym.Env]) -> None:  # type: ignore[type-arg]
    if env_fn is cartpole:
        local_only(backend, "Ray runs the mode on the dict env")
    expected = compare(
        backend, env_fn, 2, 2, steps=60, autoreset_mode=AutoresetMode.DISABLED, reset_done_envs=True
    )
    assert any(r[0] == "reset_done" for r in expected)


def test_same_step_with_partial_reset_matches_sync(backend: Backend) -> None:
    partial = {7: (np.array([True, True, False, False]), 9)}
    compare(
        backend,
        DictObsEnv,
        2,
        2,
        steps=30,
        autoreset_mode=AutoresetMode.SAME_STEP,
        partial_resets=partial,
    )


@pytest.mark.parametrize("spin_seconds", [0.0, 0.05], ids=["block-at-once", "spin-long"])
def test_worker_wake_up_paths_match_sync(backend: Backend, spin_seconds: float) -> None:
    local_only(backend, "spin_seconds is the local doorbell's")
    # More workers than cores; workers either sleep at once (every step needs a
    # wake-up) or spin long enough to catch every step without sleeping.
    compare(backend, DictObsEnv, 3, 1, steps=40, spin_seconds=spin_seconds)


def test_fork_context_matches_sync(backend: Backend) -> None:
    local_only(backend, "start methods are the local manager's")
    compare(backend, DictObsEnv, 2, 2, steps=30, context="fork", copy=False)


def test_text_actions_fallback_matches_sync(backend: Backend) -> None:
    compare(backend, TextActionEnv, 2, 2, steps=12)


def test_send_recv_of_every_env_matches_sync_step(backend: Backend) -> None:
    fns = [DictObsEnv] * 4
    sync = SyncVectorEnv(fns)
    try:
        actions = sample_actions(sync.single_action_space, 4, 30)
        expected = [sync.reset(seed=3)] + [sync.step(a) for a in actions]
    finally:
        sync.close()
    with backend(fns, 2) as envs:
        got: list[Any] = [envs.reset(seed=3)]
        for a in actions:
            envs.send(a)
            *result, env_ids = envs.recv(batch_size=4)
            assert env_ids.tolist() == [0, 1, 2, 3]
            got.append(tuple(result))
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert_same(tuple(g), tuple(e), path=f"result {i}")


def test_first_ready_recv_keeps_every_env_trajectory(backend: Backend) -> None:
    """Workers step independently under send/recv; each env must still see exactly
    its own actions in order, so its trajectory equals the synchronous one."""
    n, steps = 4, 12
    single = DictObsEnv().action_space
    per_env_actions = [sample_actions(single, 1, steps, seed=100 + i) for i in range(n)]
    sync = SyncVectorEnv([DictObsEnv] * n)
    try:
        sync.reset(seed=9)
        expected: list[list[tuple[Any, ...]]] = [[] for _ in range(n)]
        for t in range(steps):
            batch = np.concatenate([per_env_actions[i][t] for i in range(n)])
            obs, rew, term, trunc, _ = sync.step(batch)
            for i in range(n):
                expected[i].append((obs["pos"][i].copy(), rew[i], term[i], trunc[i]))
    finally:
        sync.close()
    got: list[list[tuple[Any, ...]]] = [[] for _ in range(n)]
    with backend([DictObsEnv] * n, 2) as envs:
        envs.reset(seed=9)
        envs.send(np.concatenate([per_env_actions[i][0] for i in range(n)]))
        in_flight = n
        while in_flight:
            obs, rew, term, trunc, _, ids = envs.recv(batch_size=2)
            in_flight -= len(ids)
            for k, i in enumerate(ids.tolist()):
                got[i].append((obs["pos"][k].copy(), rew[k], term[k], trunc[k]))
            if len(got[ids[0]]) < steps:
                envs.send(
                    np.concatenate([per_env_actions[i][len(got[i])] for i in ids.tolist()]), ids
                )
                in_flight += len(ids)
    for i in range(n):
        assert len(got[i]) == steps
        for t in range(steps):
            assert_same(got[i][t], expected[i][t], path=f"env {i} step {t}")


def test_send_recv_with_fallback_observations(backend: Backend) -> None:
    """Text observations travel pickled; send/recv returns them like a step does."""
    fns = [TextObsEnv] * 4
    sync = SyncVectorEnv(fns)
    try:
        actions = sample_actions(sync.single_action_space, 4, 10)
        expected = [sync.reset(seed=1)] + [sync.step(a) for a in actions]
    finally:
        sync.close()
    with backend(fns, 2) as envs:
        got: list[Any] = [envs.reset(seed=1)]
        for a in actions:
            envs.send(a)
            *result, env_ids = envs.recv(batch_size=4)
            assert env_ids.tolist() == [0, 1, 2, 3]
            got.append(tuple(result))
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert_same(tuple(g), tuple(e), path=f"result {i}")
