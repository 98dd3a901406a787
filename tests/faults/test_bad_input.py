"""Bad input and calls out of order on the fault tests' managers, under every start
method: ValueError naming the env before anything is sent, gymnasium's call-order
errors, and close() with a step in flight.

Shared layout and helpers: fault_cases.py.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend, on_backends
from support.envs import BoxActionEnv
from support.fault_cases import (
    EPW,
    FRONT_END,
    N_WORKERS,
    NUM_ENVS,
    Tracker,
    assert_closed_for_good,
    make_manager,
)
from support.helpers import cartpole

from envmgr import (
    AlreadyPendingCallError,
    ClosedManagerError,
    NoAsyncCallError,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("check_actions", ["safe", "strict"])
@on_backends("context", local=["fork", "forkserver", "spawn"], caller=FRONT_END, ray=FRONT_END)
def test_bad_actions_raise_value_error_and_the_manager_stays_usable(
    backend: Backend, context: str, check_actions: str, tmp_path: Path
) -> None:
    # "safe" is the default: it refuses what cannot be placed in the batch unchanged
    # (a wrong count or shape, a dtype that loses values) and passes values outside
    # the space (range, sign) on to the env, as AsyncVectorEnv does; "strict" refuses those too.
    strict = check_actions == "strict"
    kwargs = {"check_actions": "strict"} if strict else {}
    with make_manager("none", context, tmp_path, backend=backend, **kwargs) as envs:
        assert envs.check_actions == check_actions
        envs.reset(seed=0)
        good = np.array([0, 1, 0, 1])
        bad = {
            # Envmgr's own message: numpy's broadcast error would name the shapes too,
            # and a single action would broadcast to every env without one.
            "count": (np.array([0, 1, 0]), r"actions has shape \(3,\), expected \(4,\)"),
            "one": (np.array([1]), r"actions has shape \(1,\), expected \(4,\)"),
            "too many": (np.array([0, 1, 0, 1, 0]), r"has shape \(5,\), expected \(4,\)"),
            "2-d": (np.zeros((4, 1), dtype=np.int64), r"has shape \(4, 1\), expected \(4,\)"),
            "dtype": (
                np.array([0.0, 1.0, 0.5, 1.0]),
                r"float.*env 2 \(worker 1\)|env 2 \(worker 1\).*float",
            ),
            "strings": (np.array(["a", "b", "c", "d"]), r"dtype"),
        }
        values = {
            "range": (np.array([0, 1, 2, 0]), r"env 2 \(worker 1\)"),
            "negative": (np.array([-1, 1, 0, 0]), r"env 0 \(worker 0\)"),
        }
        if strict:
            bad.update(values)
        else:  # FaultEnv takes any integer: the step goes through
            for name, (actions, _) in values.items():
                obs, *_ = envs.step(actions)
                assert obs.shape == (NUM_ENVS, 2), name
        for name, (actions, pattern) in bad.items():
            with pytest.raises(ValueError, match=pattern):
                envs.step(actions)
            obs, *_ = envs.step(good)  # nothing was sent: the manager is in step
            assert obs.shape == (NUM_ENVS, 2), name
            with pytest.raises(ValueError):
                envs.send(actions)
        # env_ids must be whole workers.
        with pytest.raises(ValueError, match="whole workers"):
            envs.send(np.array([0, 1]), [1, 2])
        with pytest.raises(NoAsyncCallError):
            envs.recv()  # none of those was sent
        envs.send(good)
        envs.recv(batch_size=NUM_ENVS)
    with pytest.raises(ClosedManagerError):
        envs.step(good)


@on_backends(caller=FRONT_END, ray=FRONT_END)
def test_send_names_the_env_a_bad_action_was_meant_for(backend: Backend, tmp_path: Path) -> None:
    """send() checks a sub-batch; its message must name the global env id, not the position."""
    with make_manager("none", "fork", tmp_path, check_actions="strict", backend=backend) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError) as ei:
            envs.send(np.array([0, 5]), [2, 3])  # env 3's action is out of Discrete(2)
        envs.send(np.array([0, 1]), [2, 3])  # the manager is usable
        envs.recv()
    assert "env 3 (worker 1)" in str(ei.value), str(ei.value)


@on_backends(caller=FRONT_END, ray=FRONT_END)
def test_nan_and_out_of_bounds_box_actions(backend: Backend, tmp_path: Path) -> None:
    fns = [BoxActionEnv] * NUM_ENVS
    with backend(fns, N_WORKERS, EPW, context="fork", check_actions="strict") as envs:
        envs.reset(seed=0)
        actions = np.zeros((NUM_ENVS, 2), dtype=np.float32)
        for value, pattern in (
            (np.nan, "not finite"),
            (np.inf, "not finite|outside"),
            (1.5, "outside"),
        ):
            actions[3, 1] = value
            with pytest.raises(ValueError, match=rf"env 3 \(worker 1\).*({pattern})"):
                envs.step(actions)
        actions[3, 1] = 0.5
        obs, *_ = envs.step(actions)
        assert obs.shape == (NUM_ENVS, 2)
        with pytest.raises(ValueError):
            envs.step(np.zeros((NUM_ENVS, 3), dtype=np.float32))


@on_backends("context", local=["fork", "forkserver", "spawn"], caller=FRONT_END, ray=FRONT_END)
def test_calls_out_of_order(backend: Backend, context: str, tmp_path: Path) -> None:
    with make_manager("none", context, tmp_path, backend=backend) as envs:
        zeros = np.zeros(NUM_ENVS, dtype=np.int64)
        envs.reset(seed=0)
        with pytest.raises(NoAsyncCallError) as ei:
            envs.step_wait()
        assert isinstance(ei.value, gym.error.NoAsyncCallError)
        with pytest.raises(NoAsyncCallError):
            envs.reset_wait()
        with pytest.raises(NoAsyncCallError, match="send"):
            envs.recv()
        # A pending step_async blocks everything else until step_wait.
        envs.step_async(zeros)
        with pytest.raises(AlreadyPendingCallError):
            envs.step_async(zeros)
        with pytest.raises(AlreadyPendingCallError):
            envs.send(zeros)
        with pytest.raises(NoAsyncCallError):
            envs.reset_wait()
        envs.step_wait()
        # Steps in flight through send() block the batch API until recv.
        envs.send(zeros[:2], [0, 1])
        with pytest.raises(AlreadyPendingCallError):
            envs.step(zeros)
        with pytest.raises(AlreadyPendingCallError):
            envs.reset()
        with pytest.raises(
            AlreadyPendingCallError, match=r"in flight.*worker 0|worker 0.*in flight"
        ):
            envs.send(zeros[:2], [0, 1])
        *_, ids = envs.recv()
        np.testing.assert_array_equal(ids, [0, 1])
        with pytest.raises(NoAsyncCallError):
            envs.recv()
        envs.step(zeros)
    assert_closed_for_good(envs)


@on_backends(ray="closing Ray actors: test_ray.py::test_close_leaves_no_actors")
def test_close_with_a_step_in_flight_then_calls_raise_closed(
    backend: Backend, tmp_path: Path
) -> None:
    envs = make_manager("none", "fork", tmp_path, backend=backend)
    tracker = Tracker(envs)
    envs.reset(seed=0)
    envs.send(np.zeros(NUM_ENVS, dtype=np.int64))
    envs.close()
    tracker.assert_cleaned_up()
    assert_closed_for_good(envs)


@on_backends()
def test_an_argument_that_does_not_pickle_is_refused_and_no_worker_is_lost(
    backend: Backend,
) -> None:
    """A lock in reset options or call arguments used to be taken for a cut pipe: the
    worker was stopped and the manager broken (or a restart spent). On Ray the groups
    before the one whose share failed had their call already sent: a set_attr was half
    done."""
    lock = threading.Lock()
    with backend([cartpole] * 6, 3, 2) as envs:
        envs.reset(seed=0)
        envs.set_attr("mark", 0)
        attempts = (
            (lambda: envs.reset(options={"lock": lock}), "reset()'s options"),
            (lambda: envs.call("render", lock), "the call's arguments"),
            # Env 2 is group 1's: group 0's share is fine, and a worker's (not the caller's).
            (lambda: envs.set_attr("mark", [1, 2, lock, 4, 5, 6]), "set_attr()'s values"),
        )
        for attempt, what in attempts:
            with pytest.raises(
                ValueError, match=f"{re.escape(what)} cannot be sent to the workers"
            ):
                attempt()
        assert envs.get_attr("mark") == (0,) * 6  # no group got its share
        envs.step(envs.action_space.sample())
        assert envs.restarts == [0, 0, 0]
