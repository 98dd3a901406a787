"""Constructing SubprocessEnvManager: the layout of envs over workers, arguments that
do not fit together, and the spaces and metadata a manager reports.

(envmgr.managers.arguments, envmgr.managers.local)
"""

from __future__ import annotations

import re
import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space
from support.envs import DictObsEnv, dict_obs_space
from support.helpers import cartpole, full_text

import envmgr
from envmgr import SubprocessEnvManager
from envmgr.managers.arguments import default_group_count

pytestmark = pytest.mark.timeout(60)


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
    ],
)
def test_layout_of_a_sequence_of_factories(
    n_fns: int, n_workers: int | None, envs_per_worker: int | None, expected: tuple[int, int] | None
) -> None:
    # With neither size, the default worker count: tests/test_defaults.py.
    w, e = _layout([DictObsEnv] * n_fns, n_workers, envs_per_worker)
    assert w * e == n_fns
    assert (w, e) == expected


def test_layout_of_one_factory() -> None:
    assert _layout(DictObsEnv, 3, 2) == (3, 2)
    assert _layout(DictObsEnv, None, 4) == (default_group_count(None), 4)  # one per core
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


def _returns_none() -> None:
    return None


def _returns_a_vector_env() -> Any:
    return gym.make_vec("CartPole-v1", 2)


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (_returns_none, r"env 2's factory returned NoneType, not a gymnasium.Env"),
        (_returns_a_vector_env, r"env 2's factory returned .*VectorEnv.*pass vector_fn= instead"),
    ],
)
def test_a_factory_that_returns_no_env_is_named(factory: Any, match: str) -> None:
    """It used to be reported as a worker that exited with code 1 during start."""
    with pytest.raises(TypeError, match=match):
        SubprocessEnvManager([cartpole, cartpole, factory, cartpole], 2, 2, context="fork")


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


def test_unpicklable_factory_raises_value_error_at_construction() -> None:
    lock = threading.Lock()

    def make() -> DictObsEnv:
        with lock:
            return DictObsEnv()

    with pytest.raises(ValueError, match=r"cannot be pickled.*lock") as ei:
        SubprocessEnvManager(make, n_workers=2, envs_per_worker=1)
    assert "worker 0" in str(ei.value)


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


def test_dict_obs_space_helper_matches_the_env() -> None:
    # Guards the test env itself: the space helper and the env agree.
    assert DictObsEnv().observation_space == dict_obs_space()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"close_timeout": "5"}, TypeError, "close_timeout must be a number of seconds, got '5'"),
        ({"close_timeout": -1}, ValueError, "close_timeout must be >= 0 seconds, got -1"),
        ({"step_timeout": float("nan")}, ValueError, "step_timeout must be > 0 seconds, got nan"),
        ({"step_timeout": 0}, ValueError, "step_timeout must be > 0 seconds, got 0"),
        ({"step_timeout": "5"}, TypeError, "step_timeout must be a number of seconds or None"),
        ({"start_timeout": -1}, ValueError, "start_timeout must be > 0 seconds, got -1"),
        ({"timer_interval": "x"}, TypeError, "timer_interval must be a number of seconds, got"),
        ({"restart_window": -1}, ValueError, "restart_window must be > 0 seconds, got -1"),
        ({"spin_seconds": "x"}, TypeError, "spin_seconds must be a number of seconds, got 'x'"),
        ({"spin_seconds": float("nan")}, ValueError, "spin_seconds must be >= 0 seconds, got nan"),
        ({"parent_spin_seconds": -1}, ValueError, "parent_spin_seconds must be >= 0 seconds"),
        ({"copy": "yes"}, TypeError, "copy must be True or False, got 'yes'"),
    ],
)
def test_bad_durations_and_flags_are_refused_before_anything_starts(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    """A bad close_timeout used to surface only at close(), which then could not finish
    (zombie workers, a segment left); nan meant no limit at all."""
    with pytest.raises(error, match=re.escape(match)):
        SubprocessEnvManager(cartpole, 2, 2, context="fork", **kwargs)


def test_a_bad_timeout_for_one_wait_is_refused_and_ends_no_worker() -> None:
    """A deadline that passes at once would count as the worker overrunning it."""
    with SubprocessEnvManager(cartpole, 2, 2, context="fork") as envs:
        envs.reset(seed=0)
        pids = list(envs.worker_pids)
        envs.step_async(envs.action_space.sample())
        for bad, error in ((-1, ValueError), (0, ValueError), ("1", TypeError)):
            with pytest.raises(error, match="timeout must be"):
                envs.step_wait(timeout=bad)  # type: ignore[arg-type]
        envs.step_wait(timeout=30)
        envs.send(envs.action_space.sample())
        with pytest.raises(ValueError, match="timeout must be > 0 seconds, got -1"):
            envs.recv(timeout=-1)
        envs.recv(batch_size=4, timeout=30)
        envs.step(envs.action_space.sample())
        assert envs.worker_pids == pids


def test_numpy_integers_are_sizes_too() -> None:
    """np.int64(4) (from a config array, say) was refused as 'not a positive int'."""
    with SubprocessEnvManager(
        cartpole, num_envs=np.int64(4), n_workers=np.int32(2), context="fork"
    ) as envs:
        assert (envs.num_envs, envs.n_workers) == (4, 2)
        assert type(envs.num_envs) is int
    with envmgr.make("CartPole-v1", num_envs=np.int64(4), n_workers=np.int64(2)) as envs:
        assert (envs.num_envs, envs.n_workers) == (4, 2)
    with pytest.raises(ValueError, match=r"num_envs must be a positive int, got np.float64\(4.0\)"):
        SubprocessEnvManager(cartpole, num_envs=np.float64(4.0))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_envs": 0}, "num_envs must be a positive int, got 0"),  # was blamed on caller_envs
        (
            {"num_envs": 2, "autoreset_mode": "bogus"},
            "autoreset_mode must be one of ['NextStep', 'SameStep', 'Disabled']",
        ),
    ],
)
def test_a_bad_size_or_mode_is_named_as_itself(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=re.escape(match)):
        SubprocessEnvManager(cartpole, **kwargs)


def test_recv_refuses_a_batch_size_that_is_no_count() -> None:
    with SubprocessEnvManager(cartpole, 2, 2, context="fork") as envs:
        envs.reset(seed=0)
        envs.send(envs.action_space.sample())
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match="batch_size must be a positive int"):
                envs.recv(batch_size=bad)  # type: ignore[arg-type]
        *_, ids = envs.recv(batch_size=4)
        assert ids.tolist() == [0, 1, 2, 3]


REGISTERED_IN_MAIN = """
import gymnasium as gym
import numpy as np
from support.envs import DictObsEnv
from envmgr import SubprocessEnvManager


class OnlyInMain(DictObsEnv):
    pass


gym.register("OnlyInMain-v0", entry_point=OnlyInMain)
ids = ["OnlyInMain-v0"]
try:
    import ale_py

    gym.register_envs(ale_py)  # Gymnasium 1.x: ALE's ids exist only after this
    ids.append("ALE/Pong-v5")
except ImportError:
    pass
for env_id in ids:
    for context in ("forkserver", "spawn"):
        with SubprocessEnvManager(lambda: gym.make(env_id), 2, 1, context=context) as envs:
            envs.reset(seed=0)
            envs.step(envs.action_space.sample())
            print(env_id, context, "stepped", envs.num_envs, "envs")
"""


def test_envs_registered_by_the_script_are_made_in_workers_that_never_ran_it(
    run_python: Any,
) -> None:
    """The usual Gymnasium 1.x script registers its envs (``gym.register_envs(ale_py)``,
    ``gym.register(...)``) and passes ``lambda: gym.make(id)``. Forkserver and spawn
    workers never run the script, so gym.make raised NamespaceNotFound/NameNotFound there
    until the parent's registrations travelled with the factories."""
    proc = run_python(REGISTERED_IN_MAIN, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # ale_py registers its ids when a worker's gym.make imports it: over the parent's
    # entries, gymnasium warned once per id (700 lines per worker).
    assert "Overriding environment" not in proc.stderr, proc.stderr[:2000]
    for context in ("forkserver", "spawn"):
        assert f"OnlyInMain-v0 {context} stepped 2 envs" in proc.stdout, proc.stdout
        if _has("ale_py"):
            assert f"ALE/Pong-v5 {context} stepped 2 envs" in proc.stdout, proc.stdout


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
