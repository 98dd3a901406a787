"""The front end's one state: idle, pending(call), in flight, broken(cause) or closed.

The transitions first, on the value itself; then the state a real manager (worker
processes or Ray actors) is in through its life, broken kept apart from closed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend

from envmgr.errors import (
    AlreadyPendingCallError,
    BrokenManagerError,
    ClosedManagerError,
    NoAsyncCallError,
    WorkerDiedError,
)
from envmgr.frontend.state import CLOSED, IDLE, CallKind, PendingCall, Phase, State

# ------------------------------------------------------------------ the value


def test_a_state_is_frozen_and_its_in_flight_map_read_only() -> None:
    flying = State.flying({0: 3})
    with pytest.raises(dataclasses.FrozenInstanceError):
        flying.phase = Phase.IDLE  # type: ignore[misc]
    with pytest.raises(TypeError):
        flying.in_flight[1] = 4  # type: ignore[index]


def test_in_flight_returns_to_idle_when_the_last_group_lands() -> None:
    flying = State.flying({0: 3, 1: 3})
    assert flying.phase is Phase.IN_FLIGHT
    one_left = flying.landed([0])
    assert dict(one_left.in_flight) == {1: 3}
    assert one_left.landed([1]) is IDLE  # the hot path compares by identity
    assert State.flying({}) is IDLE
    pending = State.pending(PendingCall(CallKind.STEP, {0: 1}))
    assert pending.landed([0]) is pending  # only in-flight groups land


def test_joined_adds_groups_to_those_in_flight_without_touching_the_old_state() -> None:
    first = IDLE.joined({0: 1})
    both = first.joined({1: 2})
    assert (first.phase, dict(first.in_flight)) == (Phase.IN_FLIGHT, {0: 1})
    assert dict(both.in_flight) == {0: 1, 1: 2}
    assert dict(both.joined({0: 3}).in_flight) == {0: 3, 1: 2}  # a group's newer seq wins
    assert IDLE.joined({}) is IDLE
    assert dict(both.landed([0, 5]).in_flight) == {1: 2}  # a group not in flight is ignored
    assert dict(both.in_flight) == {0: 1, 1: 2}


def test_only_steps_and_resets_replace_a_lost_group() -> None:
    assert [k for k in CallKind if k.replaces_lost] == [CallKind.RESET, CallKind.STEP]


def test_each_state_refuses_what_it_cannot_do() -> None:
    step = State.pending(PendingCall(CallKind.STEP, {0: 1}))
    with pytest.raises(AlreadyPendingCallError, match="pending call to `step`"):
        step.check_idle("M", "workers", "reset_async")
    with pytest.raises(NoAsyncCallError, match="reset_wait.*a step call is pending"):
        step.check_pending("M", CallKind.RESET)
    assert step.check_pending("M", CallKind.STEP).seqs == {0: 1}
    with pytest.raises(AlreadyPendingCallError, match=r"workers \[1\] have send\(\) steps"):
        State.flying({1: 2}).check_idle("M", "workers", "step")
    with pytest.raises(ClosedManagerError, match="Trying to operate on `M`"):
        CLOSED.check_usable("M", "step")
    cause = WorkerDiedError("worker 1 (envs 2-3) exited", 1, (2, 3))
    broken = State.broken(cause)
    assert broken.closed and CLOSED.closed and not IDLE.closed
    with pytest.raises(BrokenManagerError, match=r"cannot step: the manager is broken") as ei:
        broken.check_idle("M", "workers", "step")
    assert ei.value.__cause__ is cause and ei.value.env_indices == (2, 3)
    IDLE.check_idle("M", "workers", "step")  # nothing to refuse


# ------------------------------------------------------------------ a manager's life


def _cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


def _phase(envs: Any) -> Phase:
    return envs._session.state.phase  # type: ignore[no-any-return]


ZEROS = np.zeros(4, dtype=np.int64)


@pytest.mark.timeout(120)
def test_one_state_field_follows_every_call(backend: Backend) -> None:
    with backend([_cartpole] * 4, 2, 2, context="fork") as envs:
        assert _phase(envs) is Phase.IDLE and not envs.closed
        envs.reset_async(seed=0)
        assert envs._session.state.call.kind is CallKind.RESET
        envs.reset_wait()
        envs.step_async(ZEROS)
        assert _phase(envs) is Phase.PENDING
        envs.step_wait()
        envs.call_async("get_wrapper_attr", "gravity")
        assert envs._session.state.call.kind is CallKind.CALL
        envs.call_wait()
        envs.send(ZEROS[2:], [2, 3])
        assert dict(envs._session.state.in_flight).keys() == {1}
        envs.send(ZEROS[:2], [0, 1])
        *_, ids = envs.recv(batch_size=4)
        assert sorted(ids.tolist()) == [0, 1, 2, 3]
        assert envs._session.state is IDLE
        envs.step(ZEROS)  # the hot path left no trace
        assert envs._session.state is IDLE
        with pytest.raises(AttributeError):
            envs.closed = False  # derived from the state, so read-only
    assert _phase(envs) is Phase.CLOSED and envs.closed


@pytest.mark.timeout(120)
def test_a_broken_manager_names_its_cause_until_the_user_closes_it(backend: Backend) -> None:
    envs = backend([_cartpole] * 4, 2, 2, context="fork")
    try:
        envs.reset(seed=0)
        backend.kill(envs, 1)
        with pytest.raises(WorkerDiedError) as died:
            envs.step(ZEROS)
        state = envs._session.state
        assert state.phase is Phase.BROKEN and state.cause is died.value and envs.closed
        with pytest.raises(BrokenManagerError, match="cannot reset_async") as ei:
            envs.reset_async()
        assert ei.value.__cause__ is died.value
    finally:
        envs.close()
    assert _phase(envs) is Phase.CLOSED
    with pytest.raises(ClosedManagerError, match="cannot step"):
        envs.step(ZEROS)
