"""Every observation-space kind, every autoreset mode and partial resets give
SyncVectorEnv's results; gymnasium's vector wrappers work on top of the manager;
gauges and timers set by env code ship with the worker tree."""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from support.backend_cases import on_backends
from support.equivalence import compare

from envmgr import SubprocessEnvManager, timers

pytestmark = pytest.mark.timeout(90)

SPACES: dict[str, spaces.Space] = {  # type: ignore[type-arg]
    "box": spaces.Box(-1.0, 1.0, (3,), np.float32),
    "discrete": spaces.Discrete(5, start=2),
    "multidiscrete": spaces.MultiDiscrete([3, 4]),
    "multibinary": spaces.MultiBinary(4),
    "dict": spaces.Dict({"a": spaces.Discrete(3), "b": spaces.Box(0, 1, (2,), np.float64)}),
    "tuple": spaces.Tuple((spaces.MultiBinary(2), spaces.Box(-2, 2, (1,), np.float32))),
}


class AnySpaceEnv(gym.Env):  # type: ignore[type-arg]
    """Observations sampled from ``space`` with the env's seeded generator; episodes
    of random length; an info with a number every third step."""

    action_space = spaces.Discrete(2)

    def __init__(self, kind: str) -> None:
        self.observation_space = SPACES[kind]
        self.t = 0
        self.length = 5

    def _obs(self) -> Any:
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        return self.observation_space.sample()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(3, 9))
        return self._obs(), {"length": self.length}

    def step(self, action: Any) -> Any:
        self.t += 1
        info = {"t": self.t} if self.t % 3 == 0 else {}
        done = self.t >= self.length
        return self._obs(), float(action) + 0.5, done and action == 1, done and action == 0, info


def _cases(pairs: Any) -> list[Any]:
    return [pytest.param(mode, kind, id=f"{mode.value}-{kind}") for mode, kind in pairs]


_EVERY_PAIR = _cases((mode, kind) for mode in AutoresetMode for kind in sorted(SPACES))
# Ray and caller_envs move each space through the same env-side and parent-side code
# as the local workers (only the transport differs), so they take every space in one
# mode and every mode on the nested space: each Ray manager starts a Ray worker process
# per actor, the dearest build in the suite.
_EACH_SPACE_AND_MODE = _cases(
    [(AutoresetMode.NEXT_STEP, kind) for kind in sorted(SPACES)]
    + [(mode, "dict") for mode in AutoresetMode if mode != AutoresetMode.NEXT_STEP]
)


@on_backends("mode, kind", local=_EVERY_PAIR, caller=_EACH_SPACE_AND_MODE, ray=_EACH_SPACE_AND_MODE)
def test_every_space_and_autoreset_mode_matches_sync(
    backend: Backend, mode: AutoresetMode, kind: str
) -> None:
    mask = np.array([True, False, False, True])
    compare(
        backend,
        functools.partial(AnySpaceEnv, kind),
        2,
        2,
        30,
        autoreset_mode=mode,
        partial_resets={11: (mask, 99)},
        reset_done_envs=mode == AutoresetMode.DISABLED,
        context="fork",
    )


def _cartpole() -> gym.Env:  # type: ignore[type-arg]
    return gym.make("CartPole-v1")


def test_gymnasium_vector_wrappers_work_on_the_manager() -> None:
    from gymnasium.wrappers.vector import NormalizeObservation, RecordEpisodeStatistics

    actions = np.random.default_rng(0).integers(0, 2, size=(200, 4))
    outputs = []
    for make in (
        lambda: SyncVectorEnv([_cartpole] * 4),
        lambda: SubprocessEnvManager(_cartpole, 2, 2, context="fork"),
    ):
        venv = NormalizeObservation(RecordEpisodeStatistics(make()))
        try:
            obs, _ = venv.reset(seed=3)
            returns = []
            for a in actions:
                obs, _, _, _, infos = venv.step(a)
                if "episode" in infos:
                    returns.extend(infos["episode"]["r"][infos["_episode"]].tolist())
            outputs.append((obs, returns))
        finally:
            venv.close()
    (obs_sync, ret_sync), (obs_mgr, ret_mgr) = outputs
    assert ret_sync, "no episode finished: the comparison would be empty"
    assert ret_mgr == ret_sync
    np.testing.assert_allclose(obs_mgr, obs_sync)


class GaugedEnv(gym.Wrapper):  # type: ignore[type-arg]
    def step(self, action: Any) -> Any:
        with timers.hierarchical_timer("physics"):
            result = self.env.step(action)
        timers.set_gauge("last_action", float(action))
        return result


def test_env_code_timers_and_gauges_ship_with_the_worker_tree() -> None:
    timers.reset_timers()
    with SubprocessEnvManager(lambda: GaugedEnv(_cartpole()), 2, 2, context="fork") as envs:
        envs.reset(seed=0)
        for _ in range(7):
            envs.step(np.array([0, 1, 1, 0]))
        tree = timers.get_timer_tree()
    gauge = tree["gauges"]["last_action"]
    assert (gauge["min"], gauge["max"], gauge["count"]) == (0.0, 1.0, 28)
    for w in (0, 1):
        step = tree["children"]["workers"]["children"][f"worker_{w}"]["children"]["step"]
        assert step["count"] == 7
        # two envs per worker; an autoreset step runs reset, not step, so <= 14
        assert 0 < step["children"]["physics"]["count"] <= 14
        assert step["children"]["physics"]["count"] == step["children"]["env.step"]["count"]


class KeepsActionsEnv(gym.Env):  # type: ignore[type-arg]
    """Keeps every action object it is handed, as an env that stores its last action
    (for a reward on action change, say) does."""

    observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, kind: str) -> None:
        self.action_space = SPACES[kind]
        self.kept: list[Any] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> Any:
        self.kept.append(action)
        return np.zeros(1, np.float32), 0.0, False, False, {}


@pytest.mark.parametrize("kind", ["box", "multidiscrete", "multibinary"])
@on_backends()
def test_an_env_that_keeps_its_actions_keeps_what_it_was_given(backend: Backend, kind: str) -> None:
    """The batch of actions is overwritten at every step (shared memory): each env is
    handed a private copy of its row, so the ones it kept do not change under it."""
    space = SPACES[kind]
    space.seed(0)
    sent = [np.stack([space.sample() for _ in range(4)]) for _ in range(5)]
    with backend(functools.partial(KeepsActionsEnv, kind), 2, 2) as envs:
        envs.reset(seed=0)
        for actions in sent:
            envs.step(actions)
        kept = envs.get_attr("kept")
    for env in range(4):
        np.testing.assert_array_equal(np.stack(kept[env]), np.stack([a[env] for a in sent]))
