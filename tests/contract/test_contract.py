"""The contract both managers keep, run over the ``backend`` parameter: local workers,
local workers with the last group's envs stepped in this process (``caller_envs``),
and Ray actors.

Restarts and failures (a lost group is replaced under ``max_restarts``; beyond it the
manager is broken, not closed), env errors as their own type, uneven layouts, and the
per-env targets of ``get_attr`` / ``set_attr`` / ``call`` / ``apply``. Equivalence
with ``SyncVectorEnv`` and AsyncVectorEnv compatibility run over the same parameter
in ``test_equivalence.py`` and ``test_async_compat.py``.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend, on_backends
from support.envs import DictObsEnv, EnvBoom, ExplodingEnv
from support.helpers import cartpole

from envmgr.errors import (
    AlreadyPendingCallError,
    BrokenManagerError,
    BrokenWorkerError,
    ClosedManagerError,
    WorkerDiedError,
)

pytestmark = pytest.mark.timeout(120)


def tagged(n: int) -> list[Any]:
    return [functools.partial(DictObsEnv, tag=i) for i in range(n)]


# ----------------------------------------------------------------------------- restarts


@on_backends(caller="it kills group 1, the caller's envs: this process, which cannot be lost")
def test_lost_group_is_replaced_then_the_budget_breaks_the_manager(backend: Backend) -> None:
    zeros = np.zeros(4, dtype=np.int64)
    with backend(cartpole, 2, 2, max_restarts=1) as envs:
        envs.reset(seed=0)
        envs.step(zeros)
        backend.kill(envs, 1)
        obs, rew, term, trunc, infos = envs.step(zeros)
        np.testing.assert_array_equal(trunc, [False, False, True, True])
        np.testing.assert_array_equal(infos["_envmgr_restarted"], [False, False, True, True])
        note = infos["envmgr_restarted"][2]
        assert f"{envs.group_noun_singular} 1 (envs 2-3)" in note.split(": ")[0]
        assert envs.restarts == [0, 1]
        (failure,) = envs.failures
        assert isinstance(failure, WorkerDiedError) and failure.env_indices == (2, 3)

        # Next step: the truncated envs start new episodes (next-step autoreset).
        obs, rew, term, trunc, infos = envs.step(zeros)
        assert (rew[2:] == 0).all() and not (term | trunc)[2:].any()
        assert "envmgr_restarted" not in infos

        # Lost during a reset: the replacement carries out the reset asked for.
        backend.kill(envs, 0)
        obs, infos = envs.reset(seed=5)
        expected, _ = gym.vector.SyncVectorEnv([cartpole] * 4).reset(seed=5)
        np.testing.assert_array_equal(obs, expected)
        np.testing.assert_array_equal(infos["_envmgr_restarted"], [True, True, False, False])

        # Beyond the budget: the failure is raised, and the manager is broken.
        backend.kill(envs, 1)
        with pytest.raises(BrokenWorkerError, match="max_restarts=1 is spent") as ei:
            envs.step(zeros)
        assert ei.value.worker_index == 1 and isinstance(ei.value.__cause__, WorkerDiedError)
        with pytest.raises(BrokenManagerError) as later:
            envs.step(zeros)
        assert later.value.__cause__ is ei.value
        assert isinstance(later.value, gym.error.ClosedEnvironmentError)
    with pytest.raises(ClosedManagerError):  # the user closed it (the with block)
        envs.step(zeros)


@on_backends()
def test_without_restarts_a_lost_group_breaks_the_manager(backend: Backend) -> None:
    zeros = np.zeros(4, dtype=np.int64)
    with backend(cartpole, 2, 2) as envs:
        envs.reset(seed=0)
        backend.kill(envs, 0)
        with pytest.raises(WorkerDiedError) as ei:
            envs.step(zeros)
        assert ei.value.worker_index == 0 and ei.value.env_indices == (0, 1)
        for call in (lambda: envs.step(zeros), lambda: envs.reset(), lambda: envs.get_attr("spec")):
            with pytest.raises(BrokenManagerError, match="broken") as later:
                call()
            assert later.value.__cause__ is ei.value


@on_backends()
def test_env_errors_come_back_as_their_own_type(backend: Backend) -> None:
    fns = [ExplodingEnv, ExplodingEnv, functools.partial(ExplodingEnv, explode_at=1), ExplodingEnv]
    with backend(fns, 2, 2) as envs:
        envs.reset(seed=0)
        envs.step(np.zeros(4, dtype=np.int64))
        with pytest.raises(EnvBoom, match="boom at step 1") as ei:
            envs.step(np.zeros(4, dtype=np.int64))
        notes = " ".join(getattr(ei.value, "__notes__", []))
        assert "env 2" in notes and envs._where(1) in notes
        # An env error does not break the manager.
        assert envs.get_attr("explode_at") == (2, 2, 1, 2)


# ----------------------------------------------------------------------------- layouts


@on_backends()
def test_uneven_layout_send_recv_follow_the_real_groups(backend: Backend) -> None:
    with backend(tagged(5), 2) as envs:
        assert envs.num_envs == 5
        envs.reset(seed=0)
        actions = envs.action_space.sample()
        envs.send(actions)
        got = []
        while len(got) < 2:
            *_, ids = envs.recv()
            got.append(ids.tolist())
        assert sorted(got) == [[0, 1, 2], [3, 4]]
        with pytest.raises(ValueError, match="whole"):
            envs.send(actions, [2, 3])
        envs.send(actions[3:], [3, 4])
        with pytest.raises(AlreadyPendingCallError):
            envs.send(actions[3:], [4, 3])
        *_, ids = envs.recv()
        assert ids.tolist() == [3, 4]


@on_backends()
def test_recv_batch_size_counts_envs_even_when_the_small_group_finishes_first(
    backend: Backend,
) -> None:
    """Groups of 3 and 2 envs; the 2 are sent first and finish first. ``recv(batch_size=3)``
    must wait for the other group too: 2 envs are fewer than asked for."""
    with backend(tagged(5), 2) as envs:
        envs.reset(seed=0)
        actions = envs.action_space.sample()
        envs.send(actions[3:], [3, 4])
        *_, ids = envs.recv(batch_size=2)  # one group holds 2: whichever comes first
        assert ids.tolist() == [3, 4]
        envs.send(actions[3:], [3, 4])
        time.sleep(0.2)  # time for it to finish before the larger group is sent
        envs.send(actions[:3], [0, 1, 2])
        *_, ids = envs.recv(batch_size=3)
        assert ids.tolist() == [0, 1, 2, 3, 4]


# ----------------------------------------------------------------------------- per-env targets


def _spy_on_posts(envs: Any) -> list[list[int]]:
    """Record which groups each command goes to (white box: the backend's ``post``)."""
    posts: list[list[int]] = []
    backend = envs._backend
    post = backend.post

    def spy(commands: Any) -> None:
        posts.append(sorted(commands))
        post(commands)

    backend.post = spy
    return posts


def read_tag(env: gym.Env[Any, Any], plus: int = 0) -> int:
    return int(env.unwrapped.tag) + plus  # type: ignore[attr-defined]


@on_backends()
def test_per_env_call_get_attr_set_attr_apply(backend: Backend) -> None:
    with backend(tagged(5), 2) as envs:  # worker 0: envs 0-2, worker 1: envs 3-4
        posts = _spy_on_posts(envs)
        assert envs.get_attr("tag") == (0, 1, 2, 3, 4)
        assert envs.get_attr("tag", env_ids=[4, 0]) == (4, 0)
        assert posts[-1] == [0, 1]
        assert envs.get_attr("tag", env_ids=[3]) == (3,)
        assert posts[-1] == [1], "only the worker owning env 3 is asked"
        assert envs.call("scaled", 10, env_ids=[1, 2], offset=1) == (11, 21)
        assert posts[-1] == [0]

        envs.set_attr("tag", [30, 10], env_ids=[3, 1])
        assert posts[-1] == [0, 1]
        envs.set_attr("tag", 7, env_ids=[4])
        assert posts[-1] == [1]
        assert envs.get_attr("tag") == (0, 10, 2, 30, 7)
        with pytest.raises(ValueError, match="got 3 values for 2 envs"):
            envs.set_attr("tag", [1, 2, 3], env_ids=[0, 1])

        assert envs.apply(read_tag, env_ids=[4, 1], plus=100) == (107, 110)
        assert posts[-1] == [0, 1]
        assert envs.apply(read_tag) == (0, 10, 2, 30, 7)
        with pytest.raises(ValueError, match="env_ids must be env indices"):
            envs.get_attr("tag", env_ids=[5])
        # A mask, floats or strings are not indices (they were read as 0/1, cut, parsed).
        mask = np.array([True, False, True, False, False])
        for bad, what in ((mask, "bool"), ([1.7], "float64"), (["0"], "<U1")):
            with pytest.raises(TypeError, match=f"integer env indices, got {what}"):
                envs.set_attr("tag", 1, env_ids=bad)
            with pytest.raises(TypeError, match=f"integer env indices, got {what}"):
                envs.send(np.zeros(len(bad), np.int64), bad)
        assert envs.get_attr("tag") == (0, 10, 2, 30, 7)
