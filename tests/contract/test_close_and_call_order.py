"""Misuse kept apart from failure: close() (idempotent, inside a failing ``with``,
with a reset in flight), then calls on a closed manager, and calls out of order
(gymnasium's own NoAsyncCallError / AlreadyPendingCallError).

(envmgr.frontend.vector_env)
"""

from __future__ import annotations

import gc
import os

import gymnasium as gym
import pytest
from support.envs import DictObsEnv
from support.fault_envs import process_token, segment_of, segment_path, wait_gone
from support.helpers import batch_actions

from envmgr import (
    AlreadyPendingCallError,
    ClosedManagerError,
    NoAsyncCallError,
    SubprocessEnvManager,
)

pytestmark = pytest.mark.timeout(60)


def test_close_is_idempotent() -> None:
    envs = SubprocessEnvManager(DictObsEnv, 2, 1)
    try:
        envs.reset(seed=0)
    finally:
        envs.close()
    assert envs.closed
    envs.close()
    envs.close()
    assert envs.closed


def test_close_after_an_exception_inside_with_cleans_up() -> None:
    class Oops(Exception):
        pass

    with pytest.raises(Oops):
        with SubprocessEnvManager(DictObsEnv, 2, 2) as envs:
            envs.reset(seed=0)
            envs.step_async(envs.action_space.sample())  # left pending on purpose
            raise Oops
    assert envs.closed
    for pid in envs.worker_pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_close_with_a_pending_reset() -> None:
    """close() with a reset in flight neither waits for it nor leaves anything behind; it
    warns as AsyncVectorEnv does."""
    with pytest.warns(UserWarning, match="pending call to `reset` to complete"):
        with SubprocessEnvManager(DictObsEnv, 2, 1, context="fork") as envs:
            tokens = [process_token(p) for p in envs.worker_pids]
            segment = segment_of(envs.worker_pids)
            envs.reset_async(seed=0)
    assert envs.closed
    assert not wait_gone(tokens, timeout=0.0), "close() returned with workers alive"
    assert not segment_path(segment).exists()
    with pytest.raises(ClosedManagerError, match="closed"):
        envs.reset_wait()


def test_a_closed_manager_raises_closed_manager_error() -> None:
    with SubprocessEnvManager(DictObsEnv, 1, 2) as envs:
        envs.reset(seed=0)
        action = envs.action_space.sample()
    with pytest.raises(ClosedManagerError) as ei:
        envs.step(action)
    assert isinstance(ei.value, gym.error.ClosedEnvironmentError)
    for call in (
        lambda: envs.reset(),
        lambda: envs.step_async(action),
        lambda: envs.step_wait(),
        lambda: envs.get_attr("tag"),
        lambda: envs.set_attr("tag", 1),
    ):
        with pytest.raises(ClosedManagerError):
            call()


def test_step_wait_without_step_async_raises_no_async_call_error() -> None:
    with SubprocessEnvManager(DictObsEnv, 1, 2) as envs:
        envs.reset(seed=0)
        with pytest.raises(NoAsyncCallError) as ei:
            envs.step_wait()
        assert isinstance(ei.value, gym.error.NoAsyncCallError)
        with pytest.raises(NoAsyncCallError):
            envs.reset_wait()
        envs.step_async(envs.action_space.sample())
        with pytest.raises(NoAsyncCallError):
            envs.reset_wait()  # a step, not a reset, is pending
        envs.step_wait()


def test_step_async_twice_raises_already_pending_call_error() -> None:
    with SubprocessEnvManager(DictObsEnv, 1, 2) as envs:
        envs.reset(seed=0)
        actions = batch_actions(envs, 2)
        envs.step_async(actions[0])
        with pytest.raises(AlreadyPendingCallError) as ei:
            envs.step_async(actions[1])
        assert isinstance(ei.value, gym.error.AlreadyPendingCallError)
        with pytest.raises(AlreadyPendingCallError):
            envs.reset_async()
        with pytest.raises(AlreadyPendingCallError):
            envs.get_attr("tag")
        envs.step_wait()  # the first call is still intact
        envs.step(actions[1])


def test_close_unmaps_the_segment_while_the_manager_is_still_referenced() -> None:
    """close() left two views of the action arrays in the backend: the deleted segment
    stayed mapped, and its file descriptor open, for as long as the object lived."""
    envs = SubprocessEnvManager(DictObsEnv, 2, 1)
    envs.reset(seed=0)
    segment = segment_of(envs.worker_pids)
    envs.close()
    gc.collect()  # what close() drops may sit in reference cycles; envs itself stays alive
    with open("/proc/self/maps") as maps:
        assert segment not in maps.read()
    assert not any(segment in os.path.realpath(f"/proc/self/fd/{fd}") for fd in _fds())


def _fds() -> list[str]:
    try:
        return os.listdir("/proc/self/fd")
    except OSError:
        return []
