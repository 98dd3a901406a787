"""Late replies on the Ray backend: the same deterministic scenario as
``test_late_replies.py`` (env 3 blocks in its step until the test releases it,
after the timeout), with ``RayEnvManager``.

Runs after every other module (``conftest.py`` orders ``test_ray*`` modules last:
Ray leaves native threads behind, which fork-based tests must not inherit). It
uses a Ray instance of its own if none is running, and stops only that one.
Without the Ray extra the module skips, unless ``ENVMGR_REQUIRE_RAY=1`` (set by
``.ci/run``), which turns the skip into a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest
from support import fault_envs
from support.backend_cases import LocalRay
from support.fault_cases import (
    AT_STEP,
    FAULT_ENV,
    NUM_ENVS,
    SEED,
    action_batches,
    assert_batch_shapes,
    assert_rows_equal,
    reference,
    wait_until,
)
from support.fault_envs import process_token, wait_gone

from envmgr import BrokenManagerError, WorkerTimeoutError

pytestmark = pytest.mark.timeout(120)

STEP_TIMEOUT = 3.0  # a Ray call costs about a millisecond; env 3 blocks until released

if os.environ.get("ENVMGR_REQUIRE_RAY") == "1":
    import ray  # noqa: F401  # a missing extra fails here instead of skipping
else:
    pytest.importorskip("ray", reason='pip install "envmgr[ray]" to run the Ray backend tests')


@pytest.fixture(scope="module", autouse=True)
def fault_envs_by_value() -> Iterator[None]:
    """Ray workers cannot import tests/ modules: ship the fault envs by value, for this
    module only (registered at import, it would change every other module's
    pickles and tracebacks too)."""
    cloudpickle.register_pickle_by_value(fault_envs)
    yield
    cloudpickle.unregister_pickle_by_value(fault_envs)


@pytest.fixture(scope="module")
def ray_instance(ray_session: LocalRay) -> Any:
    """The session's Ray (conftest.py), started here if no earlier module did."""
    return ray_session.ensure()


def blocked_ray_manager(tmp_path: Path, **kwargs: Any) -> Any:
    """2 actors x 2 envs; env 3 blocks in its 2nd step until ``tmp_path / "release"``."""
    from envmgr.managers.ray import RayEnvManager

    fns = fault_envs.fault_env_fns(
        "hang",
        NUM_ENVS,
        FAULT_ENV,
        at_step=AT_STEP,
        state_dir=tmp_path,
        ready_file=str(tmp_path / "blocked"),
        release_file=str(tmp_path / "release"),
    )
    return RayEnvManager(fns, 2, 2, num_cpus_per_actor=0.5, **kwargs)


def release_and_wait_for_the_old_actor(tmp_path: Path) -> None:
    """Let the blocked step finish, then wait until the process that ran it has exited."""
    token = process_token(int((tmp_path / "blocked").read_text()))
    (tmp_path / "release").touch()
    left = wait_gone([token], timeout=30.0, zombie_ok=True)
    assert not left, f"the timed-out actor's process is still running: {left}"


def test_a_step_answered_after_its_timeout_is_dropped_with_restarts(
    ray_instance: Any, tmp_path: Path
) -> None:
    sync, want_obs = reference()
    first, cut = action_batches(AT_STEP, seed=4)
    with blocked_ray_manager(tmp_path, max_restarts=1, step_timeout=STEP_TIMEOUT) as envs:
        obs, _ = envs.reset(seed=SEED)
        np.testing.assert_array_equal(obs, want_obs)
        assert_rows_equal(envs.step(first), sync.step(first), slice(None), "step 1")
        envs.step_async(cut)
        wait_until((tmp_path / "blocked").exists, "env 3 blocking", timeout=60.0)
        obs, rew, term, trunc, infos = envs.step_wait()
        sync.step(cut)
        assert envs.restarts == [0, 1]
        np.testing.assert_array_equal(trunc, [False, False, True, True])
        assert f"did not answer step within {STEP_TIMEOUT}" in infos["envmgr_restarted"][3]
        held = [np.array(x) for x in (obs, rew, term, trunc)]

        release_and_wait_for_the_old_actor(tmp_path)
        for got, before in zip((obs, rew, term, trunc), held, strict=True):
            np.testing.assert_array_equal(got, before, err_msg="a late answer changed a batch")
        for k, a in enumerate(action_batches(5, seed=5)):
            obs, rew, term, trunc, infos = envs.step(a)
            assert_batch_shapes(obs, rew, term, trunc)
            assert_rows_equal((obs, rew, term, trunc), sync.step(a), slice(0, 2), f"actor 0, {k}")
            assert "envmgr_restarted" not in infos
            np.testing.assert_array_equal(obs[2:, 0], [k, k])  # t of the new episode
            if k:
                np.testing.assert_allclose(rew[2:], a[2:] + k / 10.0)
        calls = envs.get_attr("calls")
        assert calls == (AT_STEP + 5, AT_STEP + 5, 4, 4), calls
    sync.close()


def test_a_caller_retrying_after_a_timeout_gets_an_error_not_a_late_batch(
    ray_instance: Any, tmp_path: Path
) -> None:
    first, cut = action_batches(AT_STEP, seed=4)
    with blocked_ray_manager(tmp_path) as envs:
        envs.reset(seed=SEED)
        envs.step(first)
        envs.step_async(cut)
        wait_until((tmp_path / "blocked").exists, "env 3 blocking", timeout=60.0)
        with pytest.raises(WorkerTimeoutError) as ei:
            envs.step_wait(timeout=STEP_TIMEOUT)
        assert f"did not answer step within {STEP_TIMEOUT}" in str(ei.value)
        release_and_wait_for_the_old_actor(tmp_path)
        for retry in (lambda: envs.step(cut), lambda: envs.step_wait(), lambda: envs.recv()):
            with pytest.raises(BrokenManagerError):
                retry()
        assert ei.value.worker_index == 1, f"the healthy actor was blamed: {ei.value}"
