"""Ctrl-C, or an exception, between reaping a lost worker and recording its replacement.

A lost worker's replacement is started by :meth:`WorkerPool.spawn`, which first makes
the new process's pipe and config; the old process stays recorded as the group's,
reaped but not closed, until the new one takes its place. An interrupt in that window
must reach the caller as the ``KeyboardInterrupt`` it is, with the restart redone at
the next call; an exception there breaks the manager with that exception, and
``close()`` still leaves nothing behind (the leak check fails a test that does).

No env code runs in that window, so the test reaches it through the pool's documented
seam, ``envmgr.backends.local.pool.spawn_setup_hook``: a Ctrl-C there is a real
SIGINT raised in this process, the way a terminal delivers one.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from support.fault_envs import process_token, wait_gone

from envmgr import BrokenManagerError, SubprocessEnvManager
from envmgr.backends.local import pool
from envmgr.frontend.results import RESTARTED_INFO_KEY

pytestmark = pytest.mark.timeout(60)


class SetUpFailure(RuntimeError):
    """What the seam raises in the ``exception`` case."""


def _cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in this process, as in a plain ``python`` run."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.fixture
def cut_spawn(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Arm the seam: the next spawn of group ``armed["group"]`` meets ``armed["how"]``."""
    armed: dict[str, Any] = {"group": None, "how": None, "fired": 0}

    def hook(g: int) -> None:
        if g != armed["group"]:
            return
        armed["group"] = None  # once
        armed["fired"] += 1
        if armed["how"] == "interrupt":
            signal.raise_signal(signal.SIGINT)
        else:
            raise SetUpFailure(f"set-up of worker {g}'s replacement failed")

    monkeypatch.setattr(pool, "spawn_setup_hook", hook)
    yield armed


def _kill_worker(envs: SubprocessEnvManager, g: int) -> int:
    victim = envs.worker_pids[g]
    token = process_token(victim)
    os.kill(victim, signal.SIGKILL)
    assert not wait_gone([token], timeout=10.0, zombie_ok=True), "the killed worker lives"
    return victim


@pytest.mark.usefixtures("sigint_raises")
@pytest.mark.parametrize("caller_envs", [0, 1])
def test_ctrl_c_before_the_replacement_is_recorded_is_redone_at_the_next_call(
    cut_spawn: dict[str, Any], caller_envs: int
) -> None:
    with SubprocessEnvManager(_cartpole, 2, 1, caller_envs=caller_envs, max_restarts=3) as envs:
        actions = np.zeros(envs.num_envs, dtype=np.int64)
        envs.reset(seed=0)
        victim = _kill_worker(envs, 1)
        cut_spawn.update(group=1, how="interrupt")
        with pytest.raises(KeyboardInterrupt):
            envs.step(actions)
        assert cut_spawn["fired"] == 1
        assert not envs.closed
        _, rewards, _, truncs, infos = envs.step(actions)  # the restart, redone
        assert rewards.shape == (envs.num_envs,)
        assert truncs[1] and not truncs[0]
        assert "cut off by an interrupt" in infos[RESTARTED_INFO_KEY][1]
        assert envs.worker_pids[1] != victim
        assert envs.step(actions)[1].shape == (envs.num_envs,)


def test_an_exception_before_the_replacement_is_recorded_breaks_the_manager_with_it(
    cut_spawn: dict[str, Any],
) -> None:
    with SubprocessEnvManager(_cartpole, 2, 1, max_restarts=3) as envs:
        actions = np.zeros(envs.num_envs, dtype=np.int64)
        envs.reset(seed=0)
        _kill_worker(envs, 1)
        cut_spawn.update(group=1, how="exception")
        with pytest.raises(SetUpFailure) as caught:
            envs.step(actions)
        notes = " ".join(getattr(caught.value, "__notes__", []))
        assert "while envmgr built a replacement" in notes, notes
        with pytest.raises(BrokenManagerError) as broken:
            envs.step(actions)  # refused at once, never a wait on the lost worker
        assert broken.value.__cause__ is caught.value
