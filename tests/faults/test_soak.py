"""A soak: 10^6 env steps with workers killed and recycled all along, and the parent
process does not grow: its resident memory, open file descriptors, threads and the
``/dev/shm/envmgr_*`` segments stay as they were after warm-up.

CI only (``ci_only``): it steps 2 workers x 16 envs for 31,250 batches. It prints what it
measured, so that the CI log has the figures.
"""

from __future__ import annotations

import gc
import os
import signal
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import shm_entries
from gymnasium import spaces

from envmgr import SubprocessEnvManager
from envmgr.protocol.shared_memory import SEGMENT_PREFIX

pytestmark = [pytest.mark.ci_only, pytest.mark.timeout(1800)]

N_WORKERS, ENVS_PER_WORKER = 2, 16
ENV_STEPS = 1_000_000
BATCHES = ENV_STEPS // (N_WORKERS * ENVS_PER_WORKER)
#: Batches before the figures are taken as the baseline: past the first kill and the
#: first recycle of each worker, so that every path has run once.
WARM_UP = 10_000
KILL_EVERY = 4_000
RECYCLE_AFTER = 5_000
#: How much the parent's resident memory may grow after warm-up.
RSS_BOUND = 20_000_000


class TinyEnv(gym.Env):  # type: ignore[type-arg]
    """Four numbers a step, an episode of 10 to 99 steps: as cheap as an env gets."""

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, tag: int) -> None:
        self.tag = tag
        self.t = 0
        self.length = 10

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(10, 100))
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        obs = self.np_random.uniform(-1, 1, 4).astype(np.float32)
        return obs, float(action), self.t >= self.length, False, {}


def _figures(seen: set[str]) -> dict[str, int]:
    """The parent's resident bytes, open fds and threads, the ``/dev/shm/envmgr_*``
    segments it maps, and how many of those it ever mapped (``seen``, updated) are in
    ``/dev/shm``: other programs' segments on the same machine do not count."""
    # Earlier tests' garbage in reference cycles (a segment of theirs still mapped) is
    # freed whenever the collector runs; collected here, it cannot look like drift.
    gc.collect()
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/maps") as f:
        paths = {line.split()[5] for line in f if f"/dev/shm/{SEGMENT_PREFIX}" in line}
    mapped = {os.path.basename(p) for p in paths}
    seen |= mapped
    return {
        "rss": rss,
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
        "mapped": len(mapped),
        "shm": len(shm_entries() & seen),
    }


def test_a_million_env_steps_with_restarts_and_recycles_leave_the_parent_flat() -> None:
    fns = [partial(TinyEnv, i) for i in range(N_WORKERS * ENVS_PER_WORKER)]
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, size=(64, len(fns)))
    kills = 0
    with SubprocessEnvManager(
        fns,
        N_WORKERS,
        ENVS_PER_WORKER,
        max_restarts=BATCHES // KILL_EVERY + 1,
        max_worker_steps=RECYCLE_AFTER,
    ) as envs:
        envs.reset(seed=0)
        warm: dict[str, int] = {}
        seen: set[str] = set()
        peak = 0
        for t in range(1, BATCHES + 1):
            if t % KILL_EVERY == 0:
                os.kill(envs.worker_pids[kills % N_WORKERS], signal.SIGKILL)
                kills += 1
            envs.step(actions[t % len(actions)])
            if t == WARM_UP:
                warm = _figures(seen)
            elif t > WARM_UP and t % 1_000 == 0:
                now = _figures(seen)
                peak = max(peak, now["rss"])
                drift = {k: v for k, v in now.items() if k != "rss" and v != warm[k]}
                assert not drift, f"after {t:,} batches: {drift}, after warm-up {warm}"
        end = _figures(seen)
        restarts, recycles = envs.restarts, envs.recycles
    print(
        f"\nsoak: {BATCHES:,} batches ({BATCHES * len(fns):,} env steps), "
        f"{kills} kills, restarts {restarts}, recycles {recycles}\n"
        f"soak: after warm-up ({WARM_UP:,} batches): rss {warm['rss'] / 1e6:.1f} MB, "
        f"{warm['fds']} fds, {warm['threads']} threads, {warm['mapped']} envmgr segment(s) "
        f"mapped, {warm['shm']} in /dev/shm\n"
        f"soak: at the end: rss {end['rss'] / 1e6:.1f} MB (peak {peak / 1e6:.1f} MB, "
        f"+{(max(peak, end['rss']) - warm['rss']) / 1e6:.1f} MB), {end['fds']} fds, "
        f"{end['threads']} threads, {end['mapped']} mapped, {end['shm']} in /dev/shm"
    )
    assert sum(restarts) == kills and kills == BATCHES // KILL_EVERY
    assert min(recycles) >= 1
    assert max(peak, end["rss"]) - warm["rss"] < RSS_BOUND
    assert {k: v for k, v in end.items() if k != "rss"} == {
        k: v for k, v in warm.items() if k != "rss"
    }
