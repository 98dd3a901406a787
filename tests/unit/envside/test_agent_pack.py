"""Whole-group packing (``envside.agent_pack``) writes what the per-agent path writes.

The same envs, seeds and actions are packed twice in this process: once as
``ParallelEnvRows`` does by default, once with the group packer switched off, so every
step goes the general, per-agent way. Every array and info must agree, over episodes
with deaths, arrivals out of slot order, rewards kept for dead agents and two groups.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import create_empty_array
from support.agent_envs import SyntheticAgentsEnv, kaz_env, one_group_env, tag_env, two_group_env

from envmgr.envside import agent_rows
from envmgr.envside.agent_layout import describe_agents
from envmgr.envside.agent_rows import ParallelEnvRows


class StaleObservationsEnv(SyntheticAgentsEnv):
    """Also observes the agents that died earlier (not live, no flags): rows left empty."""

    def step(self, actions: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        dead = list(self._dead)
        obs, *rest = super().step(actions)
        return ({**{a: self._obs(a) for a in dead}, **obs}, *rest)


ENVS: dict[str, Callable[[], Any]] = {
    "one-group": one_group_env,
    "stale-observations": StaleObservationsEnv,
    "two-groups": two_group_env,
    "kaz": kaz_env,
    "mpe2-tag": tag_env,
}
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


def _rows(env_fn: Callable[[], Any], mode: AutoresetMode, n: int = 3) -> ParallelEnvRows:
    return ParallelEnvRows([env_fn] * n, describe_agents(env_fn()), mode)


def _assert_same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, tuple):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray) and a.dtype != object:
        np.testing.assert_array_equal(a, b, err_msg=where)
        assert a.dtype == b.dtype, where
    else:
        assert repr(a) == repr(b), where


def _run(rows: ParallelEnvRows, steps: int) -> list[Any]:
    out = [_copied(rows.reset(seed=3))]
    space = rows.action_space
    space.seed(11)
    for _ in range(steps):
        actions = space.sample()
        out.append(rows.step(actions))
        # The arrays are reused: keep this step's values.
        out[-1] = _copied(out[-1])
    rows.close()
    return out


def _copied(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_copied(v) for v in value)
    return value.copy() if isinstance(value, np.ndarray) else value


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("name", list(ENVS))
def test_group_packing_writes_what_the_per_agent_path_writes(
    name: str, mode: AutoresetMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _run(_rows(ENVS[name], mode), 60)
    monkeypatch.setattr(agent_rows, "write_step_rows", lambda *args: None)
    general = _run(_rows(ENVS[name], mode), 60)
    for t, (x, y) in enumerate(zip(fast, general, strict=True)):
        _assert_same(x, y, f"{name} step {t}")


def test_rows_pack_into_the_arrays_they_are_given() -> None:
    rows = _rows(one_group_env, AutoresetMode.NEXT_STEP)
    arrays = create_empty_array(rows.single_observation_space, rows.num_envs, np.zeros)
    assert rows.observe_into(arrays)
    obs, _ = rows.reset(seed=0)
    assert obs is arrays
    obs, *_ = rows.step(rows.action_space.sample())
    assert obs is arrays
    assert arrays["agent"]["active"].any()
    rows.close()


def test_rows_keep_their_own_arrays_when_given_others_of_another_layout() -> None:
    rows = _rows(one_group_env, AutoresetMode.NEXT_STEP)
    arrays = create_empty_array(rows.single_observation_space, rows.num_envs, np.zeros)
    arrays["agent"]["obs"] = arrays["agent"]["obs"].astype(np.float64)
    assert not rows.observe_into(arrays)
    obs, _ = rows.reset(seed=0)
    assert obs is not arrays
    assert not arrays["agent"]["active"].any()
    rows.close()
