"""Multi-agent faults: each error case of the spec names the env index and the agent;
a multi-agent worker that raises, exits, is SIGKILLed or hangs behaves as the fault
table says (``test_faults.py``), and with restarts its rows that were active come back
truncated with ``infos["envmgr_restarted"]`` while the other worker's rows go on equal
to the serial reference; and a steady-state step with deaths and arrivals pickles
nothing (bytes through the workers' pipes, ``/proc/<pid>/io``).

Layout: 4 envs on 2 workers (envs 0-1, 2-3); the faulty env is whichever env is built
first (``fire_in=(0,)`` over one shared counter), so the test learns its worker from the
results, not from a guess about start-up order.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from support.agent_envs import (
    BAD_CASES,
    AgentFaultEnv,
    BadAgentsEnv,
    CheapAgentsEnv,
    SyntheticAgentsEnv,
    one_group_env,
    undeclared_env,
)
from support.agents_reference import ReferenceAgents
from support.envs import assert_same
from support.fault_envs import EXIT_CODE, InjectedFault
from support.helpers import full_text

from envmgr import WorkerDiedError, WorkerTimeoutError, make_parallel

pytestmark = pytest.mark.timeout(60)

STEP_TIMEOUT = 1.5
NUM_ENVS = 4
SLOTS = 4  # one_group_env: agent_0..3
AT_STEP = 3

# ------------------------------------------------------------------ the spec's errors

CULPRIT = {case: "agent_1" for case in BAD_CASES} | {"unknown_agent": "intruder_0"}


@pytest.mark.parametrize("case", BAD_CASES)
def test_a_bad_agent_is_named_with_its_env(case: str, tmp_path: Path) -> None:
    """Env 1 (one worker builds its envs in order) misbehaves at step 2."""
    fn = functools.partial(BadAgentsEnv, case, state_dir=str(tmp_path), bad_in=(1,))
    with make_parallel(fn, 2, n_workers=1, context="fork") as envs:
        envs.reset(seed=0)
        envs.step(np.zeros(envs.num_envs, np.int64))
        with pytest.raises(Exception) as ei:
            envs.step(np.zeros(envs.num_envs, np.int64))
    text = full_text(ei.value)
    assert re.search(r"\benv 1\b", text), text
    assert CULPRIT[case] in text, text


def test_more_agents_than_max_agents_is_named() -> None:
    fn = functools.partial(undeclared_env, late=0)  # four agents at reset
    with pytest.raises(Exception) as ei:
        with make_parallel(fn, 2, max_agents=3, n_workers=1, context="fork") as envs:
            envs.reset(seed=0)
    text = full_text(ei.value)
    assert re.search(r"\benv 0\b", text) and "max_agents" in text, text
    assert re.search(r"agent_\d", text), text


def test_mixed_spaces_in_a_one_group_request_name_the_agents_and_spaces() -> None:
    fn = functools.partial(
        SyntheticAgentsEnv, kinds=(("red", 1, 3), ("blue", 1, 4)), late=0, declare_agents=False
    )
    with pytest.raises(Exception) as ei:
        with make_parallel(fn, 1, max_agents=2, n_workers=1, context="fork") as envs:
            envs.reset(seed=0)
    text = full_text(ei.value)
    assert "red_0" in text and "blue_0" in text, text
    assert "(3,)" in text and "(4,)" in text, text


def test_actions_of_the_wrong_shape_are_refused() -> None:
    with make_parallel(one_group_env, 2, n_workers=1, context="fork") as envs:
        envs.reset(seed=0)
        with pytest.raises((ValueError, TypeError)) as ei:
            envs.step(np.zeros(envs.num_envs + 1, np.int64))
        assert "shape" in str(ei.value)
        envs.step(np.zeros(envs.num_envs, np.int64))  # still usable


def test_a_padded_space_that_does_not_fit_is_named() -> None:
    small = (spaces.Box(-np.inf, np.inf, (3,), np.float32), spaces.Discrete(3))
    with pytest.raises(Exception) as ei:
        with make_parallel(
            one_group_env,
            1,
            pad=True,
            observation_space=small[0],
            action_space=small[1],
            n_workers=1,
            context="fork",
        ) as envs:
            envs.reset(seed=0)
    text = full_text(ei.value)
    assert re.search(r"\benv 0\b", text) and "agent_0" in text, text


# ------------------------------------------------------------------ the fault table


def fault_fn(kind: str, tmp_path: Path) -> Any:
    return functools.partial(
        AgentFaultEnv, kind=kind, at_step=AT_STEP, tag=0, state_dir=str(tmp_path), fire_in=(0,)
    )


DEATHS = {
    "exit": (WorkerDiedError, rf"exited with code {EXIT_CODE} during step"),
    "sigkill": (WorkerDiedError, r"killed by signal SIGKILL"),
    "hang": (WorkerTimeoutError, rf"did not answer step within {STEP_TIMEOUT} s"),
}


@pytest.mark.parametrize("kind", sorted(DEATHS))
def test_a_dead_multi_agent_worker_closes_the_manager(kind: str, tmp_path: Path) -> None:
    error, pattern = DEATHS[kind]
    timeout = STEP_TIMEOUT if kind == "hang" else None
    with make_parallel(
        fault_fn(kind, tmp_path), NUM_ENVS, n_workers=2, context="fork", step_timeout=timeout
    ) as envs:
        envs.reset(seed=0)
        for _ in range(AT_STEP - 1):
            envs.step(np.zeros(envs.num_envs, np.int64))
        with pytest.raises(error) as ei:
            envs.step(np.zeros(envs.num_envs, np.int64))
    assert re.search(pattern, str(ei.value)), str(ei.value)


def test_an_env_exception_in_a_multi_agent_worker_is_reraised(tmp_path: Path) -> None:
    with make_parallel(fault_fn("raise", tmp_path), NUM_ENVS, n_workers=2, context="fork") as envs:
        envs.reset(seed=0)
        for _ in range(AT_STEP - 1):
            envs.step(np.zeros(envs.num_envs, np.int64))
        with pytest.raises(InjectedFault, match="failed at step 3"):
            envs.step(np.zeros(envs.num_envs, np.int64))


@pytest.mark.parametrize("kind", sorted(DEATHS))
def test_with_restarts_the_active_rows_come_back_truncated(kind: str, tmp_path: Path) -> None:
    timeout = STEP_TIMEOUT if kind == "hang" else None
    ref = ReferenceAgents([one_group_env] * NUM_ENVS)
    rng = np.random.default_rng(0)
    with make_parallel(
        fault_fn(kind, tmp_path),
        NUM_ENVS,
        n_workers=2,
        context="fork",
        max_restarts=1,
        step_timeout=timeout,
    ) as envs:
        assert_same(envs.reset(seed=0), ref.reset(seed=0))
        active = np.zeros(envs.num_envs, np.bool_)
        for t in range(AT_STEP):
            a = rng.integers(3, size=envs.num_envs)
            got, want = envs.step(a), ref.step(a)
            if t < AT_STEP - 1:
                assert_same(got, want, f"step {t + 1}")
                active = want[4]["active"]
        _, _, term, trunc, infos = got
        restarted = infos["_envmgr_restarted"]
        per_env = restarted.reshape(NUM_ENVS, SLOTS).any(axis=1)
        assert per_env.tolist() in ([True, True, False, False], [False, False, True, True])
        rows = np.repeat(per_env, SLOTS)
        assert restarted[rows & active].all() and not restarted[~rows].any()
        assert trunc[rows & active].all() and not term[rows].any()
        assert all(
            isinstance(infos["envmgr_restarted"][r], str) for r in np.flatnonzero(rows & active)
        )
        healthy = ~rows
        for part_got, part_want in zip(got[:4], want[:4], strict=True):
            np.testing.assert_array_equal(part_got[healthy], part_want[healthy])
        assert envs.manager.restarts.count(1) == 1
        for _ in range(3):  # it goes on: the healthy worker still equal to the reference
            a = rng.integers(3, size=envs.num_envs)
            got, want = envs.step(a), ref.step(a)
            np.testing.assert_array_equal(got[0][healthy], want[0][healthy])
    ref.close()


# ------------------------------------------------------------------ nothing pickled


def io_bytes(pid: int) -> tuple[int, int]:
    """``(rchar, wchar)``: bytes process ``pid`` has read and written through syscalls."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["rchar"]), int(fields["wchar"])


def test_a_step_with_deaths_and_arrivals_pickles_nothing() -> None:
    """Numeric infos, agents dying and arriving: per step the workers write at most the
    one-byte wake-up (a pickled answer would be hundreds of bytes)."""
    fn = functools.partial(CheapAgentsEnv, max_steps=10**6, death_p=0.01, arrive_by=40)
    steps = 60
    ref = ReferenceAgents([fn] * NUM_ENVS, autoreset_mode=AutoresetMode.NEXT_STEP)
    rng = np.random.default_rng(0)
    actions = [rng.integers(4, size=NUM_ENVS * 16) for _ in range(steps + 5)]
    _, infos = ref.reset(seed=0)
    activity = [ref.step(a)[4]["active"] for a in actions]
    changes = np.diff(np.array(activity[4:]).astype(int), axis=0)
    assert (changes < 0).any() and (changes > 0).any(), "no death or no arrival in the window"
    with make_parallel(fn, NUM_ENVS, n_workers=2, context="fork", timer_interval=1e9) as envs:
        envs.reset(seed=0)
        for a in actions[:5]:  # info layouts settle
            envs.step(a)
        before = [io_bytes(p) for p in envs.manager.worker_pids]
        for a in actions[5:]:
            envs.step(a)
        after = [io_bytes(p) for p in envs.manager.worker_pids]
    written = sum(b[1] - a[1] for a, b in zip(before, after, strict=True))
    read = sum(b[0] - a[0] for a, b in zip(before, after, strict=True))
    assert written <= 2 * steps, f"workers wrote {written} bytes in {steps} steps"
    assert read <= 4 * 2 * steps, f"workers read {read} bytes in {steps} steps"
    ref.close()
