"""Workers under every start method: fork, forkserver (the default) and spawn, with
factories that travel by reference (module ``envs``) or by value (lambdas, closures).

(envmgr.backends.local.process)
"""

from __future__ import annotations

import multiprocessing as mp
import os
from typing import Any

import cloudpickle
import numpy as np
import pytest
from support.envs import DictObsEnv
from support.helpers import batch_actions

import envmgr
from envmgr import SubprocessEnvManager

pytestmark = pytest.mark.timeout(60)


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
