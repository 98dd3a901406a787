"""``caller_envs=K``: the parent steps the batch's last K envs itself.

(envmgr.backends.local.caller_group)

The caller's envs go through the same EnvGroup and serve() as a worker's, so the
batch must be exactly SyncVectorEnv's in every autoreset mode, per-env calls must
reach them, their exceptions must be raised as they are, and their time must show
up as its own node (``worker_caller``) in the timer tree.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend
from gymnasium.vector import AutoresetMode
from support.envs import (
    ActionTypeEnv,
    DictObsEnv,
    EnvBoom,
    ExplodingEnv,
    FactoryBoom,
    TextActionEnv,
    failing_factory,
)
from support.equivalence import compare

from envmgr import SubprocessEnvManager, timers

pytestmark = pytest.mark.timeout(90)

LOCAL = Backend("local")


def cartpole() -> gym.Env:  # type: ignore[type-arg]
    return gym.make("CartPole-v1")


def dict_fns(n: int) -> list[Any]:
    return [functools.partial(DictObsEnv, max_len=3 + k, tag=k) for k in range(n)]


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_caller_envs_match_sync_in_every_autoreset_mode(mode: AutoresetMode) -> None:
    # 6 envs: workers 0-1 and 2-3, the caller 4-5; infos with per-env keys and masks.
    n = 6
    partial = {5: (np.array([1, 0, 0, 1, 0, 1], dtype=bool), 99)}
    compare(
        LOCAL,
        dict_fns(n),
        2,
        None,
        steps=40,
        autoreset_mode=mode,
        partial_resets=partial if mode != AutoresetMode.DISABLED else None,
        reset_done_envs=mode == AutoresetMode.DISABLED,
        caller_envs=2,
    )


def test_caller_envs_get_actions_of_the_types_sync_vector_env_gives() -> None:
    fns = [functools.partial(ActionTypeEnv, "discrete")] * 4
    compare(LOCAL, fns, 1, 2, steps=12, caller_envs=2)


def test_caller_envs_cartpole_with_num_envs_matches_sync() -> None:
    compare(LOCAL, [cartpole] * 7, 2, None, steps=120, seed=3, caller_envs=3)


def test_caller_envs_get_their_own_pickled_actions() -> None:
    """Text actions have no fixed shape: they travel pickled, the caller's share cut
    from the batch by the caller group itself. Every env reports the action it got;
    all differ, so env i given env i-1's action cannot pass (step, and send() with
    the ids out of order)."""
    actions = ("a", "b", "aa", "ab", "ba", "bb")
    with SubprocessEnvManager([TextActionEnv] * 6, 2, caller_envs=2) as envs:
        assert envs.worker_sizes == (2, 2)  # envs 4 and 5 are the caller's
        envs.reset(seed=0)
        *_, infos = envs.step(actions)
        assert infos["action"].tolist() == list(actions)
        ids = [5, 4, 1, 0]
        envs.send(tuple(actions[i] for i in ids), ids)
        *_, infos, got = envs.recv(batch_size=4)
        assert dict(zip(got.tolist(), infos["action"].tolist(), strict=True)) == {
            i: actions[i] for i in ids
        }


def test_layout_counts_caller_envs_in_num_envs() -> None:
    with SubprocessEnvManager(cartpole, num_envs=10, n_workers=2, caller_envs=4) as envs:
        assert envs.num_envs == 10
        assert envs.n_workers == 2 and len(envs.worker_pids) == 2
        assert envs.worker_sizes == (3, 3)
        assert envs.restarts == [0, 0, 0]  # per group: the caller's block is the last
        envs.restarts.append(7)  # a copy: the manager's own count is untouched
        assert envs.restarts == [0, 0, 0]
    # envs_per_worker describes the workers: the caller's envs come on top.
    with SubprocessEnvManager(cartpole, 2, 3, caller_envs=2) as envs:
        assert envs.num_envs == 8
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (8, 4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_envs": 4, "caller_envs": 4}, "leaves no env for the workers"),
        ({"num_envs": 4, "caller_envs": -1}, "caller_envs must be an int >= 0"),
        ({"num_envs": 4, "caller_envs": 1.5}, "caller_envs must be an int >= 0"),
    ],
)
def test_bad_caller_envs_is_refused_before_anything_starts(
    kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        SubprocessEnvManager(cartpole, n_workers=2, **kwargs)


def test_calls_and_attributes_reach_caller_envs() -> None:
    with SubprocessEnvManager(dict_fns(5), 2, caller_envs=2) as envs:
        envs.reset(seed=0)
        assert envs.get_attr("tag") == (0, 1, 2, 3, 4)
        assert envs.get_attr("tag", env_ids=[4, 0]) == (4, 0)
        envs.set_attr("tag", [40, 30], env_ids=[4, 3])
        assert envs.get_attr("tag") == (0, 1, 2, 30, 40)
        assert envs.apply(lambda env: env.tag * 2, env_ids=[3]) == (60,)
        assert envs.call("get_wrapper_attr", "tag", env_ids=[4]) == (40,)


def test_send_recv_steps_the_caller_group_inside_recv() -> None:
    with SubprocessEnvManager(cartpole, num_envs=6, n_workers=2, caller_envs=2) as envs:
        envs.async_reset(seed=1)
        seen: list[int] = []
        for _ in range(3):
            obs, _, _, _, _, ids = envs.recv()
            seen.extend(ids.tolist())
            assert obs.shape == (len(ids), 4)
        assert sorted(seen) == list(range(6))
        envs.send(np.zeros(6, dtype=np.int64))
        returned: set[tuple[int, ...]] = set()
        # A pool loop: recv one group, send it back. The caller group is ready
        # whenever the parent steps it, so it may come back many times while the
        # workers are busy (first-ready), but a finished worker sent earlier goes
        # first: every group keeps coming back.
        for _ in range(100_000):
            *_, ids = envs.recv()
            returned.add(tuple(ids.tolist()))
            envs.send(np.zeros(len(ids), dtype=np.int64), ids)
            if len(returned) == 3:
                break
        assert returned == {(0, 1), (2, 3), (4, 5)}


def test_caller_env_exception_is_raised_as_is_and_manager_lives_on() -> None:
    fns = [functools.partial(ExplodingEnv, explode_at=k) for k in (99, 99, 2)]
    with SubprocessEnvManager(fns, 2, caller_envs=1) as envs:
        envs.reset(seed=0)
        actions = np.zeros(3, dtype=np.int64)
        envs.step(actions)
        envs.step(actions)
        with pytest.raises(EnvBoom, match="boom at step 2") as info:
            envs.step(actions)
        notes = getattr(info.value, "__notes__", [])
        assert any("caller (envs 2-2), env 2, during step" in n for n in notes), notes
        # An env's exception is not a lost group: the manager is still usable.
        envs.reset(seed=0)
        obs, *_ = envs.step(actions)
        assert obs.shape == (3, 1)


def test_caller_factory_exception_is_raised_as_is() -> None:
    with pytest.raises(FactoryBoom) as info:
        SubprocessEnvManager([cartpole, cartpole, failing_factory], 2, caller_envs=1)
    notes = getattr(info.value, "__notes__", [])
    assert any("caller (envs 2-2), env 2, during make" in n for n in notes), notes


def test_caller_time_is_its_own_timer_node() -> None:
    timers.reset_timers()
    with SubprocessEnvManager(cartpole, num_envs=6, n_workers=2, caller_envs=2) as envs:
        envs.reset(seed=0)
        for _ in range(10):
            envs.step(np.zeros(6, dtype=np.int64))
        tree = timers.get_timer_tree()
    workers = tree["children"]["workers"]["children"]
    assert {"worker_0", "worker_1", "worker_caller", "worker_root"} <= set(workers)
    caller = workers["worker_caller"]
    assert caller["children"]["step"]["count"] == 10
    # The caller group's own timers do not land in (or reset) the user's tree.
    assert "step" not in tree["children"]


def test_ray_manager_refuses_caller_envs_before_starting_ray() -> None:
    from envmgr.frontend.options import check_options

    with pytest.raises(TypeError, match="only SubprocessEnvManager steps envs"):
        check_options("RayEnvManager", {"caller_envs": 4})


def test_caller_env_exception_in_recv_ends_its_send_and_the_manager_recovers() -> None:
    """An exception from a caller env during ``recv`` is raised as is, and that group's
    send() is over: the next ``recv`` collects the workers only (not stale caller rows),
    after which ``reset`` and stepping go on."""
    fns = [functools.partial(ExplodingEnv, explode_at=k) for k in (99, 99, 2)]
    with SubprocessEnvManager(fns, 2, caller_envs=1) as envs:
        envs.reset(seed=0)
        actions = np.zeros(3, dtype=np.int64)
        with pytest.raises(EnvBoom, match="boom at step 2"):
            for _ in range(10):
                envs.send(actions)
                envs.recv(batch_size=3)
        *_, ids = envs.recv(batch_size=3)  # the workers' steps, still in flight
        np.testing.assert_array_equal(ids, [0, 1])
        envs.reset(seed=0)  # nothing left in flight
        envs.send(actions)
        *_, ids = envs.recv(batch_size=3)
        np.testing.assert_array_equal(ids, [0, 1, 2])
