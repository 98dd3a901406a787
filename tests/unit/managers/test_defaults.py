"""Default worker counts: one rule for every way of building a manager.

``n_workers`` defaults to ``min(num_envs, cpu_count)`` and the envs are split as
evenly as they go, the first workers taking one env more; ``envs_per_worker``
asks for an even split. A single factory with no size at all is refused with an
error that says what to pass. Checked against ``os.cpu_count()`` as the machine
reports it, so the expectations hold on any core count.
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
import pytest

import envmgr
from envmgr import SubprocessEnvManager
from envmgr.managers.arguments import resolve_layout

pytestmark = pytest.mark.timeout(60)

CORES = os.cpu_count() or 1


def cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


def expected_sizes(num_envs: int, cores: int = CORES) -> tuple[int, ...]:
    """The rule, written out: min(num_envs, cores) workers, the first ones one env more."""
    n = min(num_envs, cores)
    return tuple(num_envs // n + (w < num_envs % n) for w in range(n))


def test_the_rule_written_out() -> None:
    assert expected_sizes(7, cores=2) == (4, 3)
    assert expected_sizes(7, cores=4) == (2, 2, 2, 1)
    assert expected_sizes(2, cores=8) == (1, 1)


@pytest.mark.parametrize("num_envs", [1, 2, 3, 7])
def test_a_list_of_factories_gets_one_worker_per_core(num_envs: int) -> None:
    """``SubprocessEnvManager([f] * 7)``, the swap for ``AsyncVectorEnv([f] * 7)``, runs
    the envs on every core, not all in one worker."""
    with SubprocessEnvManager([cartpole] * num_envs, context="fork") as envs:
        assert envs.worker_sizes == expected_sizes(num_envs)
        assert envs.n_workers == len(envs.worker_pids) == min(num_envs, CORES)
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (num_envs, 4)


@pytest.mark.parametrize("num_envs", [2, 7])
def test_one_factory_with_num_envs_follows_the_same_rule(num_envs: int) -> None:
    with SubprocessEnvManager(cartpole, num_envs=num_envs, context="fork") as envs:
        assert envs.worker_sizes == expected_sizes(num_envs)


@pytest.mark.parametrize("num_envs", [1, 2, 7])
def test_make_follows_the_same_rule_and_its_repr_names_the_split(num_envs: int) -> None:
    with envmgr.make("CartPole-v1", num_envs=num_envs, vector_kwargs={"context": "fork"}) as envs:
        sizes = expected_sizes(num_envs)
        assert envs.worker_sizes == sizes
        text = repr(envs)
        assert "None" not in text, text
        if len(set(sizes)) == 1:
            assert f"envs_per_worker={sizes[0]}" in text
        else:
            assert f"worker_sizes={sizes}" in text


def test_an_even_split_is_asked_for_with_envs_per_worker() -> None:
    with SubprocessEnvManager([cartpole] * 6, envs_per_worker=3, context="fork") as envs:
        assert envs.worker_sizes == (3, 3)
    split = "7 env factories were given, which cannot be split into groups of envs_per_worker=3"
    with pytest.raises(ValueError, match=split):
        SubprocessEnvManager([cartpole] * 7, envs_per_worker=3)


def test_one_factory_with_a_size_for_the_workers_only() -> None:
    with SubprocessEnvManager(cartpole, n_workers=2, context="fork") as envs:
        assert envs.worker_sizes == (1, 1)  # envs_per_worker defaults to 1
    # envs_per_worker alone: one worker per core, as Ray gives one actor per node.
    fns, layout = resolve_layout(cartpole, None, 3)
    assert layout.sizes == (3,) * CORES and len(fns) == 3 * CORES


@pytest.mark.parametrize(
    "build",
    [
        lambda: SubprocessEnvManager(cartpole),
        lambda: SubprocessEnvManager(cartpole, context="fork", max_restarts=1),
    ],
    ids=["bare", "with-options"],
)
def test_one_factory_and_no_size_is_an_error_naming_what_to_pass(build: Any) -> None:
    with pytest.raises(TypeError, match="one env factory and no size: pass num_envs=N") as ei:
        build()
    text = str(ei.value)
    assert "n_workers then defaults to min(N, cores)" in text
    assert "envs_per_worker" in text


def test_caller_envs_come_out_of_num_envs_before_the_split() -> None:
    """``num_envs`` counts the caller's envs; the rule splits what is left for the workers."""
    with SubprocessEnvManager(cartpole, num_envs=7, caller_envs=2, context="fork") as envs:
        assert envs.worker_sizes == expected_sizes(5)
        assert envs.num_envs == 7


def test_sb3_adapter_follows_the_same_rule() -> None:
    pytest.importorskip("stable_baselines3", reason="the SB3 adapter needs the [sb3] extra")
    from envmgr.integrations.sb3 import EnvmgrVecEnv

    with EnvmgrVecEnv([cartpole] * 7, start_method="fork") as venv:
        assert venv.manager.worker_sizes == expected_sizes(7)


def test_ray_follows_the_same_rule_over_its_alive_nodes() -> None:
    """Ray's cap is the alive node count (``default_groups``), its message says so."""
    names = ("n_actors", "envs_per_actor")
    _, layout = resolve_layout(cartpole, None, None, num_envs=7, default_groups=2, names=names)
    assert layout.sizes == expected_sizes(7, cores=2)
    _, layout = resolve_layout([cartpole] * 7, None, None, default_groups=3, names=names)
    assert layout.sizes == expected_sizes(7, cores=3)
    _, layout = resolve_layout(cartpole, None, 4, default_groups=2, names=names)
    assert layout.sizes == (4, 4)  # one actor per node
    with pytest.raises(TypeError, match=r"n_actors then defaults to min\(N, alive nodes\)"):
        resolve_layout(cartpole, None, None, default_groups=2, names=names)
