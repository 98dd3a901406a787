"""Behaviour of SubprocessEnvManager: construction, the VectorEnv API, errors, timers.

Every test that starts workers closes its manager through ``with`` (the leak
check in conftest.py verifies no process or shared-memory segment survives).
Time appears only as liveness bounds on polling loops ("gone within 30 s") and
as the ``step_timeout`` of envs that block until the test sees the other worker
finished; no test expects the machine to be fast. Only the public API is used
(and ``/proc`` for what the operating system shows about the workers).
"""

from __future__ import annotations

import functools
import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from time import monotonic
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
from envs import (
    BoxActionEnv,
    DictObsEnv,
    EnvBoom,
    ExitingEnv,
    ExplodingEnv,
    FactoryBoom,
    TextActionEnv,
    TextObsEnv,
    UnloadableErrorEnv,
    UnpicklableInfoEnv,
    assert_same,
    dict_obs_space,
    failing_factory,
)
from fault_envs import (
    fault_env_fns,
    process_state,
    process_token,
    segment_of,
    segment_path,
    wait_gone,
)
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_space

import envmgr
from envmgr import (
    AlreadyPendingCallError,
    BrokenManagerError,
    BrokenWorkerError,
    ClosedManagerError,
    NoAsyncCallError,
    RemoteTraceback,
    SubprocessEnvManager,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
    timers,
)
from envmgr.protocol.shared_memory import fits_shared_memory

pytestmark = pytest.mark.timeout(60)


def cartpole() -> gym.Env:  # type: ignore[type-arg]
    return gym.make("CartPole-v1")


def full_text(exc: BaseException) -> str:
    """The message of an exception together with its notes."""
    return "\n".join([str(exc), *getattr(exc, "__notes__", [])])


def batch_actions(envs: gym.vector.VectorEnv, steps: int, seed: int = 0) -> list[Any]:
    space = batch_space(envs.single_action_space, envs.num_envs)
    space.seed(seed)
    return [space.sample() for _ in range(steps)]


def _pid_exists(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


# =============================================================== constructor arguments


def _layout(env_fns: Any, n_workers: int | None, envs_per_worker: int | None) -> tuple[int, int]:
    with SubprocessEnvManager(env_fns, n_workers, envs_per_worker, context="fork") as envs:
        assert envs.num_envs == envs.n_workers * envs.envs_per_worker
        assert len(envs.worker_pids) == envs.n_workers
        return envs.n_workers, envs.envs_per_worker


@pytest.mark.parametrize(
    ("n_fns", "n_workers", "envs_per_worker", "expected"),
    [
        (6, None, 3, (2, 3)),
        (6, 3, None, (3, 2)),
        (6, 2, 3, (2, 3)),
        (5, None, None, None),  # derived from the core count: checked below
    ],
)
def test_layout_of_a_sequence_of_factories(
    n_fns: int, n_workers: int | None, envs_per_worker: int | None, expected: tuple[int, int] | None
) -> None:
    w, e = _layout([DictObsEnv] * n_fns, n_workers, envs_per_worker)
    assert w * e == n_fns
    if expected is not None:
        assert (w, e) == expected
    else:  # the most workers that split 5 envs evenly, at most one per core
        assert (w, e) == ((5, 1) if (os.cpu_count() or 1) >= 5 else (1, 5))


def test_layout_of_one_factory() -> None:
    assert _layout(DictObsEnv, 3, 2) == (3, 2)
    assert _layout(DictObsEnv, None, 4) == (min(2, os.cpu_count() or 1), 4)
    assert _layout(DictObsEnv, 3, None) == (3, 1)


@pytest.mark.parametrize(
    ("env_fns", "kwargs", "match"),
    [
        ([DictObsEnv] * 6, {"n_workers": 7}, r"6 env factories .*n_workers=7"),
        ([DictObsEnv] * 6, {"envs_per_worker": 4}, r"6 env factories .*envs_per_worker=4"),
        ([DictObsEnv] * 6, {"n_workers": 2, "envs_per_worker": 2}, r"2 \* 2 = 4.*6 env factories"),
        ([], {}, "empty"),
        (DictObsEnv, {"n_workers": 0}, "n_workers must be a positive int"),
        (DictObsEnv, {"envs_per_worker": -1}, "envs_per_worker must be a positive int"),
        (DictObsEnv, {"n_workers": 1.5}, "n_workers must be a positive int"),
        (DictObsEnv, {"n_workers": True}, "n_workers must be a positive int"),
        (DictObsEnv, {"context": "no-such-method"}, "not a start method"),
    ],
)
def test_inconsistent_arguments_raise_value_error(
    env_fns: Any, kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        SubprocessEnvManager(env_fns, **kwargs)


@pytest.mark.parametrize(
    ("env_fns", "match"),
    [
        ([DictObsEnv, "not a factory"], r"env_fns\[1\] is the string 'not a factory'"),
        ([DictObsEnv, None, DictObsEnv], r"env_fns\[1\] is None, not a zero-argument callable"),
    ],
)
def test_non_factories_raise_type_error(env_fns: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        SubprocessEnvManager(env_fns)


def test_num_envs_is_workers_times_envs_per_worker() -> None:
    with SubprocessEnvManager(DictObsEnv, n_workers=2, envs_per_worker=3) as envs:
        assert (envs.num_envs, envs.n_workers, envs.envs_per_worker) == (6, 2, 3)
        assert len(envs.worker_pids) == 2
        obs, _ = envs.reset(seed=0)
        assert obs["pos"].shape == (6, 3)
    fns = [DictObsEnv] * 4
    with SubprocessEnvManager(fns, envs_per_worker=2) as envs:
        assert (envs.num_envs, envs.n_workers, envs.envs_per_worker) == (4, 2, 2)


def test_workers_with_different_spaces_are_rejected() -> None:
    fns = [DictObsEnv, DictObsEnv, cartpole, cartpole]
    with pytest.raises(ValueError, match=r"worker 1 \(envs 2-3\) has observation_space"):
        SubprocessEnvManager(fns, n_workers=2)


def test_envs_with_different_spaces_in_one_worker_are_rejected() -> None:
    with pytest.raises(ValueError, match="env 1 has observation space") as ei:
        SubprocessEnvManager([DictObsEnv, cartpole], n_workers=1)
    assert "worker 0" in full_text(ei.value)


# =============================================================== spaces and metadata


def test_spaces_are_the_single_spaces_batched() -> None:
    with SubprocessEnvManager(DictObsEnv, 2, 2) as envs:
        single = DictObsEnv()
        assert envs.single_observation_space == single.observation_space
        assert envs.single_action_space == single.action_space
        assert envs.observation_space == batch_space(single.observation_space, 4)
        assert envs.action_space == batch_space(single.action_space, 4)
        assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
        assert envs.metadata["render_fps"] == 30
        obs, _ = envs.reset(seed=1)
        assert envs.observation_space.contains(obs)


def test_metadata_reports_the_autoreset_mode() -> None:
    with SubprocessEnvManager(cartpole, 1, 2, autoreset_mode="SameStep") as envs:
        assert envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        assert envs.spec is not None and envs.spec.id == "CartPole-v1"
        assert "CartPole-v1" in repr(envs)


# =============================================================== start methods


def test_each_start_method_constructs_resets_and_steps(start_method: str) -> None:
    with SubprocessEnvManager(DictObsEnv, 2, 2, context=start_method) as envs:
        assert envs.context == start_method
        assert len(set(envs.worker_pids)) == 2 and os.getpid() not in envs.worker_pids
        obs, infos = envs.reset(seed=3)
        assert envs.observation_space.contains(obs)
        for action in batch_actions(envs, 12):
            obs, rew, term, trunc, infos = envs.step(action)
            assert envs.observation_space.contains(obs)
            assert rew.shape == (4,) and rew.dtype == np.float64
            assert term.dtype == np.bool_ and trunc.dtype == np.bool_
            assert isinstance(infos, dict)


def test_test_envs_travel_by_reference() -> None:
    """The env classes are pickled by reference (module ``envs``), so the start-method
    tests above prove that workers import ``tests/envs.py`` under every method."""
    payload = cloudpickle.dumps(DictObsEnv)
    assert b"envs" in payload and b"DictObsEnv" in payload
    assert len(payload) < 200, "pickled by value: the by-reference path is not exercised"


def test_default_start_method_is_forkserver_where_it_exists() -> None:
    expected = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    assert envmgr.default_start_method() == expected
    with SubprocessEnvManager(DictObsEnv, 1, 1) as envs:
        assert envs.context == expected


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_lambda_and_closure_factories_work_without_fork(context: str) -> None:
    tags = [10, 20]

    def make_closure(tag: int) -> Any:
        def make() -> DictObsEnv:
            return DictObsEnv(max_len=4, tag=tag)

        return make

    fns = [lambda: DictObsEnv(tag=tags[0]), make_closure(tags[1])]
    with SubprocessEnvManager(fns, n_workers=2, context=context) as envs:
        assert envs.get_attr("tag") == (10, 20)
        assert envs.get_attr("max_len") == (9, 4)
        envs.reset(seed=0)
        envs.step(envs.action_space.sample())


# =============================================================== observations: copy or view


def test_copy_false_returns_writable_views_that_the_next_step_overwrites() -> None:
    with SubprocessEnvManager(DictObsEnv, 2, 2, copy=False) as envs:
        actions = batch_actions(envs, 2)
        obs1, _ = envs.reset(seed=0)
        leaves1 = [obs1["pos"], obs1["mode"], *obs1["nested"]]
        before = [leaf.copy() for leaf in leaves1]
        for leaf in leaves1:
            assert leaf.flags.writeable  # as AsyncVectorEnv's shared-memory observations
        obs2, *_ = envs.step(actions[0])
        leaves2 = [obs2["pos"], obs2["mode"], *obs2["nested"]]
        for a, b in zip(leaves1, leaves2, strict=True):
            assert np.shares_memory(a, b)
            assert np.array_equal(a, b)  # the old view shows the new step
        assert not np.array_equal(before[0], leaves1[0])  # overwritten in place


def test_copy_true_returns_independent_arrays() -> None:
    with SubprocessEnvManager(DictObsEnv, 2, 2) as envs:
        actions = batch_actions(envs, 2)
        obs1, _ = envs.reset(seed=0)
        snapshot = {"pos": obs1["pos"].copy(), "mode": obs1["mode"].copy()}
        obs1["pos"][...] = 0.5  # writeable, and nobody else sees it
        obs2, *_ = envs.step(actions[0])
        assert not np.shares_memory(obs1["pos"], obs2["pos"])
        assert np.all(obs1["pos"] == 0.5)
        assert np.array_equal(obs1["mode"], snapshot["mode"])
        assert obs2["pos"].flags.writeable


def test_view_held_after_close_does_not_crash(run_python: Any) -> None:
    # In a child interpreter: if the segment were unmapped under the view, reading
    # it would crash the interpreter (SIGSEGV) rather than fail an assertion.
    proc = run_python(
        """
        import os
        import numpy as np
        from envs import DictObsEnv
        from envmgr import SubprocessEnvManager

        from fault_envs import segment_of

        with SubprocessEnvManager(DictObsEnv, 1, 2, copy=False) as envs:
            obs, _ = envs.reset(seed=0)
            expected = obs["pos"].copy()
            name = segment_of(envs.worker_pids)
        assert not os.path.exists("/dev/shm/" + name), "segment not unlinked"
        assert np.array_equal(obs["pos"], expected)
        print("view still readable")
        """
    )
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{proc.stderr[-3000:]}"
    assert "view still readable" in proc.stdout


# =============================================================== VectorEnv API


def test_step_async_and_step_wait() -> None:
    with SubprocessEnvManager(DictObsEnv, 2, 2) as envs:
        envs.reset_async(seed=5)
        obs, infos = envs.reset_wait()
        assert envs.observation_space.contains(obs)
        for action in batch_actions(envs, 5):
            envs.step_async(action)
            obs, rew, term, trunc, infos = envs.step_wait()
            assert rew.shape == (4,)


def test_call_get_attr_set_attr_render() -> None:
    fns = [functools.partial(DictObsEnv, tag=k, render_mode="rgb_array") for k in range(4)]
    with SubprocessEnvManager(fns, n_workers=2) as envs:
        envs.reset(seed=0)
        assert envs.render_mode == "rgb_array"
        assert envs.get_attr("tag") == (0, 1, 2, 3)
        assert envs.call("scaled", 2, offset=1) == (1, 3, 5, 7)
        assert envs.call("max_len") == (9, 9, 9, 9)  # a non-callable attribute is read
        frames = envs.render()
        assert len(frames) == 4
        for k, frame in enumerate(frames):
            assert frame.shape == (2, 3, 3) and np.all(frame == k)
        envs.set_attr("tag", 7)
        assert envs.get_attr("tag") == (7, 7, 7, 7)
        envs.set_attr("tag", [4, 5, 6, 8])
        assert envs.get_attr("tag") == (4, 5, 6, 8)
        with pytest.raises(ValueError, match="Got `3` values for 4 environments"):
            envs.set_attr("tag", [1, 2, 3])
        with pytest.raises(AttributeError) as ei:
            envs.get_attr("no_such_attribute")
        # Every env raises; whichever worker answered first is named.
        assert re.search(r"worker [01] \(envs \d-\d\), env \d, during call", full_text(ei.value))
        # Still usable after an error raised by every env.
        assert envs.get_attr("tag") == (4, 5, 6, 8)
        envs.step(envs.action_space.sample())


def test_reset_arguments_are_checked() -> None:
    with SubprocessEnvManager(DictObsEnv, 2, 2) as envs:
        with pytest.raises(ValueError, match="got length=3"):
            envs.reset(seed=[1, 2, 3])
        with pytest.raises(TypeError, match="reset_mask"):  # AsyncVectorEnv's types
            envs.reset(options={"reset_mask": np.array([1, 0, 1, 0])})
        with pytest.raises(ValueError, match="reset_mask"):
            envs.reset(options={"reset_mask": np.zeros(4, dtype=bool)})
        obs, _ = envs.reset(seed=0)  # still usable
        assert envs.observation_space.contains(obs)


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


# =============================================================== errors raised by envs


def test_env_exception_in_step_is_reraised_as_its_own_type(start_method: str) -> None:
    fns = [functools.partial(ExplodingEnv, explode_at=100)] * 3 + [
        functools.partial(ExplodingEnv, explode_at=2)
    ]
    with SubprocessEnvManager(fns, n_workers=2, context=start_method) as envs:
        envs.reset(seed=0)
        zeros = np.zeros(4, dtype=np.int64)
        envs.step(zeros)
        envs.step(zeros)
        with pytest.raises(EnvBoom, match="boom at step 2") as ei:
            envs.step(zeros)
    exc = ei.value
    assert isinstance(exc.__cause__, RemoteTraceback)
    remote = str(exc.__cause__)
    assert "detonate" in remote and "envs.py" in remote and "EnvBoom" in remote
    assert exc.worker_index == 1  # type: ignore[attr-defined]
    assert exc.env_index == 3  # type: ignore[attr-defined]
    notes = "\n".join(getattr(exc, "__notes__", []))
    assert "worker 1" in notes and "env 3" in notes and "step" in notes


def test_exception_that_cannot_be_recreated_becomes_worker_error() -> None:
    fns = [functools.partial(ExplodingEnv, explode_at=100), UnloadableErrorEnv]
    with SubprocessEnvManager(fns, n_workers=1) as envs:
        envs.reset(seed=0)
        with pytest.raises(WorkerError) as ei:
            envs.step(np.zeros(2, dtype=np.int64))
    exc = ei.value
    assert exc.worker_index == 0 and exc.env_index == 1
    assert "UnloadableError" in exc.remote_type
    assert "left/right" in str(exc) and "env 1" in str(exc)
    assert isinstance(exc.__cause__, RemoteTraceback)


def test_factory_exception_surfaces_at_construction() -> None:
    fns = [DictObsEnv] * 3 + [failing_factory]
    with pytest.raises(FactoryBoom, match="refused") as ei:
        SubprocessEnvManager(fns, n_workers=2)
    exc = ei.value
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert "failing_factory" in str(exc.__cause__)
    assert exc.worker_index == 1 and exc.env_index == 3  # type: ignore[attr-defined]
    notes = "\n".join(getattr(exc, "__notes__", []))
    assert "worker 1" in notes and "env 3" in notes
    # (no leaked process or segment: checked by the conftest fixture)


def test_unpicklable_factory_raises_value_error_at_construction() -> None:
    lock = threading.Lock()

    def make() -> DictObsEnv:
        with lock:
            return DictObsEnv()

    with pytest.raises(ValueError, match=r"cannot be pickled.*lock") as ei:
        SubprocessEnvManager(make, n_workers=2, envs_per_worker=1)
    assert "worker 0" in str(ei.value)


def test_unpicklable_info_raises_an_error_naming_the_worker() -> None:
    fns = [functools.partial(UnpicklableInfoEnv, explode_at=100)] * 2 + [UnpicklableInfoEnv] * 2
    with SubprocessEnvManager(fns, n_workers=2) as envs:
        envs.reset(seed=0)
        zeros = np.zeros(4, dtype=np.int64)
        envs.step(zeros)
        with pytest.raises(TypeError) as ei:
            envs.step(zeros)
    exc = ei.value
    assert str(exc) == "cannot pickle '_thread.lock' object"
    assert "raised in envmgr worker 1 (envs 2-3), during step (sending the result)" in full_text(
        exc
    )
    assert exc.worker_index == 1  # type: ignore[attr-defined]


# =============================================================== bad actions


def test_bad_discrete_actions_raise_value_error_and_the_manager_stays_usable() -> None:
    with SubprocessEnvManager(cartpole, 2, 2, check_actions="strict") as envs:
        envs.reset(seed=0)
        good = np.array([0, 1, 0, 1])
        with pytest.raises(ValueError, match=r"shape \(3,\).*\(4,\)"):
            envs.step(np.array([0, 1, 0]))
        envs.step(good)
        with pytest.raises(ValueError, match=r"env 2 \(worker 1\)"):
            envs.step(np.array([0, 1, 2, 0]))
        envs.step(good)
        with pytest.raises(ValueError, match=r"env 0 \(worker 0\)"):
            envs.step(np.array([-1, 1, 0, 0]))
        envs.step(good)


def test_float_action_for_discrete_names_the_env() -> None:
    with SubprocessEnvManager(cartpole, 2, 2) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError) as ei:
            envs.step(np.array([0.0, 1.0, 0.5, 1.0]))
        message = str(ei.value)
        assert "float" in message
        assert "env 2" in message and "worker 1" in message, message
        obs, *_ = envs.step(np.array([0, 1, 0, 1]))
        assert obs.shape == (4, 4)


def test_nan_box_action_raises_value_error_naming_the_env() -> None:
    with SubprocessEnvManager(BoxActionEnv, 2, 2, check_actions="strict") as envs:
        envs.reset(seed=0)
        actions = np.zeros((4, 2), dtype=np.float32)
        actions[3, 1] = np.nan
        with pytest.raises(ValueError, match=r"env 3 \(worker 1\).*not finite"):
            envs.step(actions)
        actions[3, 1] = 1.5
        with pytest.raises(ValueError, match=r"env 3 \(worker 1\).*outside"):
            envs.step(actions)
        actions[3, 1] = 0.0
        obs, *_ = envs.step(actions)
        assert obs.shape == (4, 2)


def test_bad_multidiscrete_action_in_dict_env() -> None:
    with SubprocessEnvManager(DictObsEnv, 2, 2, check_actions="strict") as envs:
        envs.reset(seed=0)
        actions = np.zeros((4, 2), dtype=np.int64)
        actions[1, 1] = 4  # nvec is [3, 4]
        with pytest.raises(ValueError, match=r"env 1 \(worker 0\).*\[0, 4\]"):
            envs.step(actions)
        actions[1, 1] = 3
        envs.step(actions)


def test_out_of_bounds_actions_reach_the_env_unless_strict() -> None:
    """By default (and with ``check_actions="off"``) an out-of-bounds action reaches the env
    unchanged, as in SyncVectorEnv; ``"strict"`` refuses it."""
    outside = np.full((2, 2), 5.0, dtype=np.float32)
    sync = SyncVectorEnv([BoxActionEnv] * 2)
    sync.reset(seed=0)
    want = sync.step(outside)
    sync.close()
    for mode in ("safe", "off"):
        with SubprocessEnvManager(BoxActionEnv, 1, 2, check_actions=mode) as envs:
            envs.reset(seed=0)
            got = envs.step(outside)
        assert_same(got, want)
    with SubprocessEnvManager(BoxActionEnv, 1, 2, check_actions="strict") as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match=r"env 0 \(worker 0\).*outside"):
            envs.step(outside)


# =============================================================== dead and hung workers


def test_sigkilled_worker_raises_worker_died_error(start_method: str) -> None:
    with SubprocessEnvManager(DictObsEnv, 2, 2, context=start_method) as envs:
        envs.reset(seed=0)
        action = envs.action_space.sample()
        envs.step(action)
        os.kill(envs.worker_pids[0], signal.SIGKILL)
        with pytest.raises(WorkerDiedError) as ei:
            envs.step(action)
        exc = ei.value
        assert "worker 0" in str(exc) and "SIGKILL" in str(exc)
        assert exc.worker_index == 0 and exc.env_indices == (0, 1)
        assert exc.exitcode == -signal.SIGKILL
        assert envs.closed
        with pytest.raises(BrokenManagerError):
            envs.step(action)
    envs.close()


@pytest.mark.parametrize("next_call", ["reset", "get_attr", "step-fallback-actions"])
def test_sigkilled_idle_worker_is_named_with_its_signal_by_any_next_call(next_call: str) -> None:
    """Whichever call meets the dead worker first (through the pipe rather than the
    shared-memory hand-off), the error names the worker and the signal."""
    env_fn = TextActionEnv if next_call == "step-fallback-actions" else DictObsEnv
    with SubprocessEnvManager(env_fn, 2, 2) as envs:
        envs.reset(seed=0)
        action = envs.action_space.sample()
        envs.step(action)
        pid = envs.worker_pids[0]
        os.kill(pid, signal.SIGKILL)
        deadline = monotonic() + 30  # let it die, so the next call meets a dead worker
        while _pid_exists(pid) and monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(WorkerDiedError) as ei:
            if next_call == "reset":
                envs.reset()
            elif next_call == "get_attr":
                envs.get_attr("t")
            else:
                envs.step(action)
        exc = ei.value
        assert "worker 0 (envs 0-1)" in str(exc)
        assert "SIGKILL" in str(exc), str(exc)
        assert exc.exitcode == -signal.SIGKILL
        assert envs.closed


def test_worker_exiting_inside_step_raises_worker_died_error() -> None:
    fns = [functools.partial(ExplodingEnv, explode_at=100)] * 2 + [
        functools.partial(ExitingEnv, explode_at=1, exit_code=3)
    ] * 2
    with SubprocessEnvManager(fns, n_workers=2) as envs:
        envs.reset(seed=0)
        zeros = np.zeros(4, dtype=np.int64)
        envs.step(zeros)
        with pytest.raises(WorkerDiedError) as ei:
            envs.step(zeros)
    assert ei.value.worker_index == 1 and ei.value.exitcode == 3
    assert "worker 1 (envs 2-3)" in str(ei.value) and "code 3" in str(ei.value)


def hung_worker_1(tmp_path: Path, **kwargs: Any) -> SubprocessEnvManager:
    """2 workers x 1 env; env 1 (worker 1) sleeps for an hour in its 2nd step."""
    fns = fault_env_fns(
        "hang",
        2,
        1,
        at_step=2,
        state_dir=tmp_path,
        ready_file=str(tmp_path / "blocked"),
        step_log=str(tmp_path / "steps"),
    )
    # spin_seconds=0: a worker sleeps as soon as it has published its step.
    return SubprocessEnvManager(fns, 2, 1, spin_seconds=0.0, close_timeout=0.5, **kwargs)


def start_the_hanging_step(envs: SubprocessEnvManager, tmp_path: Path) -> None:
    """step_async, then wait until worker 0 has finished (its env logged two steps and its
    process sleeps) and env 1 is blocked: only worker 1 can miss the deadline."""
    (tmp_path / "steps").touch()
    envs.step_async(np.zeros(2, dtype=np.int64))
    token = process_token(envs.worker_pids[0])
    deadline = monotonic() + 30  # a liveness bound
    while not (
        (tmp_path / "blocked").exists()
        and (tmp_path / "steps").read_text().split().count("0") == 2
        and token is not None
        and process_state(token) == "S"
    ):
        assert monotonic() < deadline, "worker 0 did not finish its step"
        time.sleep(0.01)


def test_hung_worker_raises_worker_timeout_error(tmp_path: Path) -> None:
    with hung_worker_1(tmp_path, step_timeout=0.5) as envs:
        envs.reset(seed=0)
        envs.step(np.zeros(2, dtype=np.int64))
        start_the_hanging_step(envs, tmp_path)
        with pytest.raises(WorkerTimeoutError) as ei:
            envs.step_wait()
        exc = ei.value
        assert isinstance(exc, TimeoutError)
        assert str(exc) == "worker 1 (envs 1-1): it did not answer step within 0.5 s"
        assert exc.worker_index == 1 and exc.env_indices == (1,)
        with pytest.raises(BrokenManagerError):
            envs.step(np.zeros(2, dtype=np.int64))


def test_killed_worker_is_restarted_under_a_restart_policy() -> None:
    with SubprocessEnvManager(DictObsEnv, 2, 2, max_restarts=1) as envs:
        envs.reset(seed=0)
        actions = np.zeros((4, 2), dtype=np.int64)
        envs.step(actions)
        old = envs.worker_pids[1]
        os.kill(old, signal.SIGKILL)
        obs, rew, term, trunc, infos = envs.step(actions)
        assert envs.observation_space.contains(obs)
        assert trunc[2:].all(), "the replaced worker's envs end their episodes"
        assert infos["_envmgr_restarted"].tolist() == [False, False, True, True]
        assert (
            "worker 1" in infos["envmgr_restarted"][2] and "SIGKILL" in infos["envmgr_restarted"][2]
        )
        assert envs.restarts == [0, 1] and envs.worker_pids[1] != old
        for _ in range(3):
            envs.step(actions)
        os.kill(envs.worker_pids[1], signal.SIGKILL)
        with pytest.raises(BrokenWorkerError, match="max_restarts=1"):
            envs.step(actions)
        assert envs.closed


@pytest.mark.parametrize("transport", ["shared-memory", "fallback"])
def test_restarted_envs_return_their_new_episode_observation(transport: str) -> None:
    """After a worker is replaced mid-step, its envs (truncated) must show the
    observation their fresh episode starts with, whatever the transport."""
    if transport == "fallback":
        fns = [functools.partial(TextObsEnv, reset_obs="eeeeee")] * 4
    else:
        fns = [DictObsEnv] * 4
    with SubprocessEnvManager(fns, n_workers=2, max_restarts=1) as envs:
        envs.reset(seed=0)
        actions = np.zeros((4, 2) if transport == "shared-memory" else 4, dtype=np.int64)
        before, *_ = envs.step(actions)
        os.kill(envs.worker_pids[1], signal.SIGKILL)
        obs, _, _, trunc, _ = envs.step(actions)
        assert trunc.tolist() == [False, False, True, True]
        if transport == "fallback":
            assert obs[2:] == ("eeeeee", "eeeeee"), f"stale observations {obs[2:]}"
        else:
            for i in (2, 3):  # a fresh random episode, not the last observation
                assert not np.array_equal(obs["pos"][i], before["pos"][i])
            assert envs.observation_space.contains(obs)


def test_hung_worker_is_replaced_under_a_restart_policy(tmp_path: Path) -> None:
    with hung_worker_1(tmp_path, step_timeout=0.5, max_restarts=1) as envs:
        envs.reset(seed=0)
        envs.step(np.zeros(2, dtype=np.int64))
        start_the_hanging_step(envs, tmp_path)
        _, _, _, trunc, infos = envs.step_wait()  # worker 1 sleeps: replaced
        assert trunc.tolist() == [False, True]
        assert infos["_envmgr_restarted"].tolist() == [False, True]
        assert infos["envmgr_restarted"][1] == (
            "worker 1 (envs 1-1): it did not answer step within 0.5 s"
        )
        assert envs.restarts == [0, 1]
        envs.step(np.zeros(2, dtype=np.int64))


def test_env_step_seconds_counts_every_env_step() -> None:
    with SubprocessEnvManager(DictObsEnv, 2, 2) as envs:
        envs.reset(seed=0)
        expected = np.zeros(4, dtype=np.int64)
        pending_reset = np.zeros(4, dtype=bool)
        for a in batch_actions(envs, 25):
            _, _, term, trunc, _ = envs.step(a)
            expected += ~pending_reset  # an autoreset step is not an env.step
            pending_reset = term | trunc
        seconds, steps = envs.env_step_seconds()
    assert steps.tolist() == expected.tolist()
    assert seconds.shape == (4,) and (seconds > 0).all()


def test_call_async_and_call_wait() -> None:
    fns = [functools.partial(DictObsEnv, tag=k) for k in range(4)]
    with SubprocessEnvManager(fns, n_workers=2) as envs:
        envs.call_async("scaled", 3)
        with pytest.raises(AlreadyPendingCallError):
            envs.step_async(envs.action_space.sample())
        assert envs.call_wait() == (0, 3, 6, 9)
        with pytest.raises(NoAsyncCallError):
            envs.call_wait()


def test_worker_timeout_error_is_what_async_vector_env_code_catches() -> None:
    assert issubclass(WorkerTimeoutError, TimeoutError)
    assert issubclass(WorkerTimeoutError, mp.TimeoutError)


# =============================================================== fallback transport


def test_text_observations_use_the_fallback_and_match_sync() -> None:
    n_workers, epw = 2, 2
    fns = [TextObsEnv] * (n_workers * epw)
    assert not fits_shared_memory(TextObsEnv().observation_space)
    sync = SyncVectorEnv(fns)
    actions = batch_actions(sync, 30, seed=4)
    mask = np.array([False, True, True, False])

    def run(venv: gym.vector.VectorEnv) -> list[Any]:
        out: list[Any] = [venv.reset(seed=2)]
        for t, a in enumerate(actions):
            if t == 10:
                out.append(venv.reset(seed=50, options={"reset_mask": mask.copy()}))
            out.append(venv.step(a))
        return out

    try:
        expected = run(sync)
    finally:
        sync.close()
    with SubprocessEnvManager(fns, n_workers=n_workers) as envs:
        got = run(envs)
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            assert_same(g, e, path=f"result {i}")
    assert sum(int(r[2].sum()) for r in expected if len(r) == 5) >= 3


def test_text_observations_with_copy_false() -> None:
    with SubprocessEnvManager(TextObsEnv, 1, 2, copy=False) as envs:
        obs, _ = envs.reset(seed=0)
        assert isinstance(obs, tuple) and all(isinstance(o, str) for o in obs)
        obs, *_ = envs.step(np.array([1, 2]))
        assert envs.observation_space.contains(obs)


# =============================================================== timers


def _node(tree: dict[str, Any], *path: str) -> dict[str, Any]:
    node = tree
    for name in path:
        children = node.get("children", {})
        assert name in children, f"no {name!r} under {'/'.join(path)}: children {sorted(children)}"
        node = children[name]
    return node


def _check_worker_counts(
    workers: dict[str, Any], n_workers: int, envs_per_worker: int, steps: int
) -> None:
    root = _node(workers, "worker_root")
    assert root.get("is_parallel") is True
    assert _node(root, "step")["count"] == steps * n_workers
    for w in range(n_workers):
        sub = _node(workers, f"worker_{w}")
        assert sub.get("is_parallel") is True
        step = _node(sub, "step")
        assert step["count"] == steps, f"worker_{w}"
        env_calls = sum(
            step.get("children", {}).get(k, {}).get("count", 0) for k in ("env.step", "env.reset")
        )
        assert env_calls == steps * envs_per_worker, f"worker_{w}"


def test_merged_timer_tree(start_method: str, fresh_timers: None) -> None:
    n_steps = 7  # far fewer than a timer shipment's worth: reading must flush
    with SubprocessEnvManager(DictObsEnv, 2, 2, context=start_method) as envs:
        actions = batch_actions(envs, n_steps)
        envs.reset(seed=0)
        with timers.hierarchical_timer("env_step"):
            for a in actions:
                envs.step(a)
        tree = timers.get_timer_tree()
    env_step = _node(tree, "env_step")
    assert env_step["count"] == 1
    workers = _node(env_step, "workers")
    assert workers["count"] == n_steps
    _check_worker_counts(workers, 2, 2, n_steps)
    # The reset happened outside env_step: its timings sit under root/workers.
    reset_root = _node(tree, "workers", "worker_root", "reset")
    assert reset_root["count"] == 2
    assert _node(reset_root, "env.reset")["count"] == 4


@pytest.mark.parametrize("timer_interval", [0.0, 3600.0])
def test_timer_counts_do_not_depend_on_the_shipping_interval(
    timer_interval: float, fresh_timers: None
) -> None:
    n_steps = 7
    with SubprocessEnvManager(DictObsEnv, 2, 3, timer_interval=timer_interval) as envs:
        actions = batch_actions(envs, 2 * n_steps)
        envs.reset(seed=0)
        with timers.hierarchical_timer("env_step"):
            for a in actions[:n_steps]:
                envs.step(a)
        first = timers.get_timer_tree()
        again = timers.get_timer_tree()  # a second read must not count anything twice
        with timers.hierarchical_timer("env_step"):
            for a in actions[n_steps:]:
                envs.step(a)
    after_close = timers.get_timer_tree()  # close() pulled in the rest
    _check_worker_counts(_node(first, "env_step", "workers"), 2, 3, n_steps)
    _check_worker_counts(_node(again, "env_step", "workers"), 2, 3, n_steps)
    _check_worker_counts(_node(after_close, "env_step", "workers"), 2, 3, 2 * n_steps)


def test_reading_timers_while_send_steps_are_in_flight_loses_no_step(fresh_timers: None) -> None:
    # Reading the tree flushes worker timings; with send() steps in flight that
    # flush must neither be sent over them nor swallow them.
    with SubprocessEnvManager(DictObsEnv, 2, 1, spin_seconds=0.0, step_timeout=5) as envs:
        envs.reset(seed=0)
        actions = np.zeros((2, 2), dtype=np.int64)
        for _ in range(3):
            envs.send(actions)
            timers.get_timer_tree()
            *_, env_ids = envs.recv(batch_size=2)
            assert env_ids.tolist() == [0, 1]
        tree = timers.get_timer_tree()
    assert _node(tree, "workers", "worker_root", "step")["count"] == 3 * 2


def test_forked_worker_timers_start_empty(fresh_timers: None) -> None:
    n_steps = 5
    with SubprocessEnvManager(DictObsEnv, 2, 2, context="fork") as first:
        first.reset(seed=0)
        with timers.hierarchical_timer("env_step"):
            for a in batch_actions(first, 3 * n_steps):
                first.step(a)
    # The parent's tree is full of the first manager's timings when the second forks.
    assert _node(timers.get_timer_tree(), "env_step", "workers", "worker_0", "step")["count"] > 0
    with SubprocessEnvManager(DictObsEnv, 2, 2, context="fork") as second:
        timers.reset_timers()
        second.reset(seed=0)
        with timers.hierarchical_timer("env_step"):
            for a in batch_actions(second, n_steps):
                second.step(a)
        tree = timers.get_timer_tree()
    _check_worker_counts(_node(tree, "env_step", "workers"), 2, 2, n_steps)


# =============================================================== process hygiene


def test_fork_workers_do_not_start_their_own_resource_trackers(run_python: Any) -> None:
    """In a fresh interpreter, a fork-context manager must not make its workers start
    resource_tracker processes of their own: those warn about "leaked" segments at
    exit and unlink the manager's live segment when a worker dies."""
    proc = run_python(
        """
        import numpy as np
        from envs import DictObsEnv
        from envmgr import SubprocessEnvManager

        with SubprocessEnvManager(DictObsEnv, 2, 2, context="fork") as envs:
            envs.reset(seed=0)
            envs.step(np.zeros((4, 2), dtype=np.int64))
        print("done")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stdout
    assert "resource_tracker" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
def test_workers_and_segment_go_when_the_parent_is_killed(context: str) -> None:
    """A manager process killed with SIGKILL cannot close anything: its workers must
    notice and exit, and its segment must not stay in /dev/shm."""
    code = textwrap.dedent(
        f"""
        import json, os, signal, sys
        from envs import DictObsEnv
        from fault_envs import segment_of
        from envmgr import SubprocessEnvManager

        envs = SubprocessEnvManager(DictObsEnv, 2, 1, context={context!r})
        envs.reset(seed=0)
        shm = segment_of(envs.worker_pids)
        print(json.dumps({{"pids": envs.worker_pids, "shm": shm}}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = dict(os.environ)
    tests_dir = str(Path(__file__).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tests_dir, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=50,
        env=env,
        cwd=tests_dir,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    started = json.loads(proc.stdout.splitlines()[0])
    pids, shm = started["pids"], Path("/dev/shm") / started["shm"]
    try:
        deadline = monotonic() + 30  # a liveness bound, not a performance threshold
        while monotonic() < deadline and (any(map(_pid_exists, pids)) or shm.exists()):
            time.sleep(0.05)
        alive = [pid for pid in pids if _pid_exists(pid)]
        assert not alive, f"workers {alive} outlived their killed manager"
        assert not shm.exists(), f"{shm} outlived its killed manager"
    finally:
        for pid in pids:  # never leave orphans behind on a shared machine
            if _pid_exists(pid):
                os.kill(pid, signal.SIGKILL)
        if shm.exists():
            shm.unlink()


def test_dict_obs_space_helper_matches_the_env() -> None:
    # Guards the test env itself: the space helper and the env agree.
    assert DictObsEnv().observation_space == dict_obs_space()


def test_the_doorbell_wake_up_is_an_empty_message_of_multiprocessing_pipes() -> None:
    """The parent wakes a sleeping worker with raw bytes, not ``send_bytes``: they must be
    what ``Connection.recv_bytes`` reads as an empty message on this Python."""
    import multiprocessing as mp

    from envmgr.backends.local import doorbell as signalling

    reader, writer = mp.Pipe(duplex=False)
    try:
        os.write(writer.fileno(), signalling._EMPTY_MESSAGE)
        writer.send_bytes(b"next")
        assert reader.recv_bytes() == b""
        assert reader.recv_bytes() == b"next"
    finally:
        reader.close()
        writer.close()
