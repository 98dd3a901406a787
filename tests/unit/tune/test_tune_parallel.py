"""``envmgr.tune.tune(..., parallel=True)``: make_parallel's layouts of a PettingZoo env, measured
against a ceiling that packs the same envs' agents into rows; its call builds the winner.

Budgets are tiny: these tests check what is measured and said, never how fast anything is.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
from mpe2 import simple_spread_v3
from support.agent_envs import CheapAgentsEnv, spread_env, two_group_env

import envmgr
from envmgr.frontend.agents import AgentGroupsVectorEnv, AgentVectorEnv
from envmgr.tune import tune
from envmgr.tune.layouts import candidate_layouts
from envmgr.tune.run import usable_cores
from envmgr.tune.serial_agents import SerialAgentRows
from envmgr.tune.targets import ParallelEnvTarget, import_factory

pytestmark = pytest.mark.timeout(300)


def _built(result: Any) -> Any:
    """What the printed lines (imports, then the call) build."""
    scope: dict[str, Any] = {"envmgr": envmgr}
    for line in result.imports:
        exec(line, scope)  # noqa: S102 - our own output
    return eval(result.call, scope)  # noqa: S307 - our own output


def test_simple_spread_is_tuned_in_agent_rows_and_the_call_builds_the_winner() -> None:
    result = tune(
        "mpe2.simple_spread_v3:parallel_env", num_envs=4, seconds=1.0, rounds=1, parallel=True
    )
    expected = candidate_layouts(4, usable_cores(), has_vector_entry_point=False)
    assert [m.layout for m in result.measurements] == expected
    assert result.agent_slots == 3 and result.vector_ceiling is None
    assert len(result.ceiling) == 1 and result.ceiling[0] > 0
    for m in result.measurements:
        assert m.rates[0] > 0 and m.ratios == [m.rates[0] / result.ceiling[0]], m.label
        assert m.reading is not None and m.reading.batches > 0, m.label
        groups = {g.name for g in m.reading.groups}
        assert groups >= {f"worker_{i}" for i in range(m.layout.n_workers)}, (m.label, groups)
        assert ("worker_caller" in groups) == bool(m.layout.caller_envs), (m.label, groups)
    assert result.imports == ["import mpe2.simple_spread_v3"]
    assert result.call.startswith(
        "envmgr.make_parallel(mpe2.simple_spread_v3.parallel_env, num_envs=4, n_workers="
    )
    with _built(result) as envs:
        assert isinstance(envs, AgentVectorEnv)
        assert (envs.num_parallel_envs, envs.slots) == (4, 3)
        assert envs.manager.n_workers == result.best.layout.n_workers
        assert envs.manager.caller_envs == result.best.layout.caller_envs
    text = result.format()
    assert text.startswith("envmgr tune --parallel mpe2.simple_spread_v3:parallel_env: 4 envs x 3")
    assert "env-steps/s agent-steps/s" in text
    # Each row gives the env-steps and the agent-steps, three rows per env.
    best_row = next(line for line in text.splitlines() if line.startswith("* "))
    env_rate, agent_rate = best_row[37:].split()[:2]
    assert int(agent_rate.replace(",", "")) == round(result.best.rate * 3)
    assert int(env_rate.replace(",", "")) == round(result.best.rate)
    assert "\nUse:\n    import mpe2.simple_spread_v3\n    envmgr.make_parallel(" in text


def test_several_groups_are_stepped_whole_and_kwargs_go_to_the_factory() -> None:
    result = tune(
        "mpe2.simple_tag_v3:parallel_env",
        num_envs=2,
        seconds=0.6,
        rounds=1,
        env_kwargs={"num_good": 1, "num_adversaries": 2},
        parallel=True,
    )
    # One batch per group has no send/recv: no first-ready layout.
    expected = candidate_layouts(2, usable_cores(), False, first_ready=False)
    assert [m.layout for m in result.measurements] == expected
    assert not any(m.layout.first_ready for m in result.measurements)
    assert result.agent_slots == 3
    assert result.call.startswith(
        "envmgr.make_parallel(lambda: mpe2.simple_tag_v3.parallel_env(num_good=1, "
        "num_adversaries=2), num_envs=2, "
    )
    with _built(result) as envs:
        assert isinstance(envs, AgentGroupsVectorEnv)
        assert envs.num_envs == {"adversary": 4, "agent": 2}
        assert envs.manager.n_workers == result.best.layout.n_workers


def _same_rows(ours: tuple[Any, ...], theirs: tuple[Any, ...], n: int, slots: int) -> None:
    """SerialAgentRows' one observation group and flags against make_parallel's rows."""
    (obs,), rewards, terms, truncs, active = ours
    t_obs, t_rewards, t_terms, t_truncs, t_active = theirs
    np.testing.assert_array_equal(obs.reshape(n * slots, -1), t_obs)
    np.testing.assert_array_equal(rewards.reshape(-1).astype(t_rewards.dtype), t_rewards)
    for mine, other in ((terms, t_terms), (truncs, t_truncs), (active, t_active)):
        np.testing.assert_array_equal(mine.reshape(-1), other)


@pytest.mark.parametrize(
    "env_fn",
    [
        functools.partial(CheapAgentsEnv, max_steps=5, death_p=0.2, arrive_by=3),
        functools.partial(simple_spread_v3.parallel_env, N=3, max_cycles=3),
    ],
    ids=["deaths-and-arrivals", "simple_spread"],
)
def test_the_ceilings_loop_packs_the_rows_make_parallel_gives(env_fn: Any) -> None:
    n = 3
    rows = SerialAgentRows(env_fn, n)
    try:
        with envmgr.make_parallel(env_fn, n, n_workers=1) as envs:
            slots = envs.slots
            obs, infos = envs.reset(seed=5)
            rows.reset(seed=5)
            assert rows.active.reshape(-1).tolist() == infos["active"].tolist()
            np.testing.assert_array_equal(rows.obs[0].reshape(n * slots, -1), obs)
            envs.action_space.seed(1)
            ended = 0
            for _ in range(14):  # past two episode ends and their resets
                actions = envs.action_space.sample()
                ours = rows.step(actions.reshape(n, slots))
                obs, rewards, terms, truncs, infos = envs.step(actions)
                _same_rows(ours, (obs, rewards, terms, truncs, infos["active"]), n, slots)
                ended += int((terms | truncs).any())
            assert ended >= 2
    finally:
        rows.close()


def test_the_ceilings_loop_keeps_one_array_per_observation_space() -> None:
    rows = SerialAgentRows(two_group_env, 2)
    try:
        rows.reset(seed=0)
        # scout_* see 3 floats, tank_* 5: a [envs, agents, obs] array each.
        assert [o.shape for o in rows.obs] == [(2, 2, 3), (2, 3, 5)]
        assert rows.rewards.shape == rows.active.shape == (2, 5)
        assert rows.where["tank_0"] == (2, 1, 0)
        tank = rows.obs[1][0, 0]
        assert tank[1] == 2 and rows.active[0, 2]  # column 1: the agent's index
    finally:
        rows.close()


@pytest.mark.parametrize(
    ("env", "error", "says"),
    [
        ("mpe2.simple_spread_v3", ValueError, "as module:factory"),
        ("no_such_module_x:parallel_env", ImportError, "no_such_module_x"),
        ("mpe2.simple_spread_v3:nope", ValueError, "has no attribute nope"),
        ("mpe2.simple_spread_v3:__name__", TypeError, "not a factory"),
        ("mpe2.simple_spread_v3:raw_env", ValueError, "AEC env: tune a factory that wraps it"),
        ("gymnasium.envs.classic_control:CartPoleEnv", ValueError, "a Gymnasium env"),
        ("support.agent_envs:undeclared_env", ValueError, "has no possible_agents"),
        ("gymnasium:make", ValueError, "building one env raised TypeError"),
    ],
)
def test_what_is_not_a_parallel_env_factory_is_refused_before_anything_starts(
    env: str, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        tune(env, num_envs=2, seconds=0.1, parallel=True)


def test_a_callable_is_named_in_the_call_when_it_can_be_imported() -> None:
    assert import_factory(spread_env)[1:] == (
        "support.agent_envs:spread_env",
        "support.agent_envs.spread_env",
        "support.agent_envs",
    )
    assert import_factory(lambda: spread_env())[2:] == ("env_fn", "")
    target = ParallelEnvTarget(spread_env, None)
    assert target.imports == ("import support.agent_envs",)
    assert target.agent_slots == 3 and target.first_ready
    with pytest.raises(TypeError, match="parallel=True"):
        tune(spread_env, num_envs=2, seconds=0.1)
