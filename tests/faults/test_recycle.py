"""Recycling: a healthy worker (or actor) past ``max_worker_steps`` or ``max_worker_memory``
is replaced, its envs truncated with ``infos["envmgr_recycled"]`` where their episode had
not ended, the results otherwise those of ``SyncVectorEnv``, the restart budget untouched.

The caller group (``caller_envs``) runs in this process: it has no process to replace,
so its envs are never recycled and its rows stay equal to ``SyncVectorEnv``'s throughout.
"""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend, on_backends
from gymnasium import spaces
from support.fault_envs import rss_bytes

from envmgr import timers
from envmgr.frontend.recycling import RECYCLED_INFO_KEY

pytestmark = pytest.mark.timeout(60)

#: Steps of an episode of CountingEnv: it terminates at its LENGTH-th step.
LENGTH = 4


class CountingEnv(gym.Env):  # type: ignore[type-arg]
    """Observes ``[t, tag, draw]``: its step in the episode, its tag, and a number drawn
    from its generator at reset; terminates at step ``LENGTH``; ``close()`` leaves a line
    in ``log``, so that a clean stop is seen from outside."""

    observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float64)
    action_space = spaces.Discrete(3)

    def __init__(self, tag: int, log: str | None = None, draw: bool = True) -> None:
        self.tag, self.log, self.draw = tag, log, draw
        self.t = 0
        self.drawn = 0.0

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.tag, self.drawn])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        self.drawn = float(self.np_random.integers(1000)) if self.draw else 0.0
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        return self._obs(), float(action) + self.t, self.t >= LENGTH, False, {}

    def close(self) -> None:
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(f"{self.tag} {os.getpid()}\n")


class GrowingEnv(CountingEnv):
    """Keeps ``chunk`` more bytes (touched) at every step, up to ``cap`` chunks, and takes
    ``pause`` seconds per step, so that the manager's periodic memory read finds it over
    its limit within a few steps of passing it (and a manager that never recycles cannot
    take more than ``cap`` chunks)."""

    def __init__(self, tag: int, chunk: int = 5_000_000, cap: int = 40, pause: float = 0.02):
        super().__init__(tag, draw=False)
        self.chunk, self.cap, self.pause = chunk, cap, pause
        self.kept: list[np.ndarray] = []

    def step(self, action: Any) -> Any:
        if len(self.kept) < self.cap:
            self.kept.append(np.ones(self.chunk // 8))
        if self.pause:
            time.sleep(self.pause)
        obs, reward, _, trunc, info = super().step(action)
        return obs, reward, False, trunc, info  # never ends: only recycling truncates


def _fns(n: int, log: str | None = None, draw: bool = True) -> list[Any]:
    return [partial(CountingEnv, i, log, draw) for i in range(n)]


def _node(tree: dict[str, Any], *path: str) -> dict[str, Any]:
    node = tree
    for name in path:
        children = node.get("children", {})
        assert name in children, f"no {name!r} under {'/'.join(path)}: children {sorted(children)}"
        node = children[name]
    return node


def _noted(infos: dict[str, Any]) -> np.ndarray:
    """Which envs carry the recycling note in ``infos``."""
    if RECYCLED_INFO_KEY not in infos:
        return np.zeros(0, dtype=bool)
    return np.asarray(infos[f"_{RECYCLED_INFO_KEY}"], dtype=bool)


@on_backends()
def test_recycled_by_step_count_at_a_boundary_then_truncated(
    backend: Backend, tmp_path: Path, fresh_timers: None
) -> None:
    """Every group steps LENGTH batches: the first time its episodes all end there (a
    boundary: nothing truncated, the next step is the replacement's autoreset, as
    SyncVectorEnv's); the second time they are mid-episode (truncated, with the note)."""
    log = tmp_path / "closed"
    n_groups, per = 2, 2
    num = n_groups * per
    actions = np.random.default_rng(0).integers(0, 3, size=(2 * LENGTH + 3, num))
    sync = gym.vector.SyncVectorEnv(_fns(num, draw=False))
    with backend(_fns(num, str(log), draw=False), n_groups, per, max_worker_steps=LENGTH) as envs:
        recyclable = envs.n_workers if backend.name == "caller" else n_groups
        process_rows = np.arange(num) < recyclable * per
        assert envs.max_restarts == 0  # recycling is not charged to the restart budget
        obs, _ = envs.reset(seed=0)
        want, _ = sync.reset(seed=0)
        np.testing.assert_array_equal(obs, want)
        with timers.hierarchical_timer("loop"):
            for t, a in enumerate(actions, 1):
                obs, rew, term, trunc, infos = envs.step(a)
                w_obs, w_rew, w_term, w_trunc, _ = sync.step(a)
                noted = _noted(infos)
                if t == LENGTH:  # every episode ended here: noted, nothing forced
                    np.testing.assert_array_equal(noted, process_rows)
                    assert "max_worker_steps=4" in infos[RECYCLED_INFO_KEY][0]
                if t == 2 * LENGTH:  # the replacements' LENGTH-th step: mid-episode
                    np.testing.assert_array_equal(noted, process_rows)
                    np.testing.assert_array_equal(trunc, process_rows)
                    w_trunc = w_trunc | process_rows
                if t not in (LENGTH, 2 * LENGTH):
                    assert not noted.any(), t
                if t <= 2 * LENGTH:
                    np.testing.assert_array_equal(obs, w_obs, err_msg=f"step {t}")
                    np.testing.assert_array_equal(rew, w_rew, err_msg=f"step {t}")
                    np.testing.assert_array_equal(term, w_term)
                    np.testing.assert_array_equal(trunc, w_trunc)
                elif t == 2 * LENGTH + 1:  # the truncated envs start a new episode
                    assert (obs[process_rows, 0] == 0).all() and (rew[process_rows] == 0).all()
                # The caller's rows are never recycled: SyncVectorEnv's to the end.
                np.testing.assert_array_equal(obs[~process_rows], w_obs[~process_rows])
        # Recycled after steps 4 and 8 (the third would be due after step 12).
        want_recycles = [2] * recyclable + [0] * (n_groups - recyclable)
        assert envs.recycles == want_recycles
        assert envs.restarts == [0] * n_groups
        tree = timers.get_timer_tree()
        noun = envs.group_noun_singular
        assert _node(tree, "loop", "workers", f"recycle_{noun}_0")["count"] == 2
        assert f"restart_{noun}_0" not in _node(tree, "loop", "workers")["children"]
    sync.close()
    # Each retired incarnation closed its envs (a clean stop), then the last ones at close.
    closed = log.read_text().split()
    tags = [int(tag) for tag in closed[::2]]
    for env in range(num):
        assert tags.count(env) == (3 if process_rows[env] else 1), closed


@on_backends(ray="the reset boundary is the front end's, pinned on the local backends")
def test_a_reset_of_all_its_envs_is_the_boundary_of_a_due_group(backend: Backend) -> None:
    """A group found over its limit mid-episode, then reset with seeds: replaced before
    that reset, which it carries out as asked: the results are SyncVectorEnv's again."""
    num = 4
    sync = gym.vector.SyncVectorEnv(_fns(num))
    with backend(_fns(num), 2, 2, max_worker_steps=2) as envs:
        envs.reset(seed=0)
        sync.reset(seed=0)
        for _ in range(2):
            _, _, _, trunc, infos = envs.step(np.ones(num, dtype=np.int64))
        assert _noted(infos)[:2].all() and trunc[:2].all()
        pids = list(envs.worker_pids)
        obs, _ = envs.reset(seed=7)
        want, _ = sync.reset(seed=7)
        np.testing.assert_array_equal(obs, want)
        assert envs.worker_pids[0] != pids[0]
        got = envs.step(np.ones(num, dtype=np.int64))  # the replacements' first step
        expected = sync.step(np.ones(num, dtype=np.int64))
        for a, b in zip(got[:4], expected[:4], strict=True):
            np.testing.assert_array_equal(a, b)
        assert envs.recycles[0] == 1 and envs.restarts[0] == 0
    sync.close()


@on_backends(caller="the caller group runs in this process: its memory is the caller's own")
def test_recycled_by_memory_when_an_env_grows(backend: Backend) -> None:
    """An env that keeps 5 MB per step passes a limit 60 MB above its worker's size at
    start: the worker is recycled (its env truncated, with the note), and its replacement
    starts small; the other worker, which does not grow, is left alone."""
    fns = [partial(GrowingEnv, 0), partial(CountingEnv, 1, None, False)]
    with backend(fns, 2, 1) as probe:
        start = max(probe.apply(lambda env: rss_bytes()))
    with backend(fns, 2, 1, max_worker_memory=start + 60_000_000) as envs:
        envs.reset(seed=0)
        for _ in range(300):
            _, _, _, trunc, infos = envs.step(np.zeros(2, dtype=np.int64))
            if _noted(infos).any():
                break
        else:
            pytest.fail("worker 0 grew 5 MB a step for 300 steps and was never recycled")
        assert trunc[0] and not trunc[1] and list(_noted(infos)) == [True, False]
        assert "max_worker_memory" in infos[RECYCLED_INFO_KEY][0]
        envs.step(np.zeros(2, dtype=np.int64))  # the replacement is made here
        assert envs.recycles == [1, 0] and envs.restarts == [0, 0]
        assert max(envs.apply(lambda env: rss_bytes(), env_ids=[0])) < start + 60_000_000
