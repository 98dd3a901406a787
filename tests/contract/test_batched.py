"""Batched envs hosted in workers (``vector_fn=``, ``make(..., vectorization_mode=...)``).

Each worker (or Ray actor) hosts one ``gymnasium.vector.VectorEnv`` for its share
of the envs. Results must equal in-process batched envs of the same block sizes,
seeded ``s + first env index`` -- bit for bit, over hundreds of steps with
autoresets -- and for SyncVectorEnv blocks, a flat SyncVectorEnv seeded ``s``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import SyncVectorEnv
from support.envs import DictObsEnv, assert_same

import envmgr
from envmgr import SubprocessEnvManager, timers

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


def cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


def sync_cartpoles(n: int) -> SyncVectorEnv:
    return SyncVectorEnv([cartpole] * n)


def blocks_rollout(
    blocks: list[gym.vector.VectorEnv], seed: int, actions: list[np.ndarray]
) -> list[tuple[Any, ...]]:
    """In-process reference: each block seeded ``seed + its first env``, results joined."""
    starts = [int(s) for s in np.cumsum([0] + [b.num_envs for b in blocks[:-1]])]
    pairs = list(zip(blocks, starts, strict=True))
    out: list[tuple[Any, ...]] = [(np.concatenate([b.reset(seed=seed + s)[0] for b, s in pairs]),)]
    for a in actions:
        parts = [b.step(a[s : s + b.num_envs])[:4] for b, s in pairs]
        out.append(tuple(np.concatenate([p[k] for p in parts]) for k in range(4)))
    return out


@pytest.mark.parametrize("num_envs", [6, 5])
def test_cartpole_vector_env_blocks_match_bit_for_bit(backend: Backend, num_envs: int) -> None:
    if backend.name == "ray" and num_envs == 5:
        pytest.skip("one layout is enough on Ray")
    steps = 300
    rng = np.random.default_rng(1)
    actions = [rng.integers(0, 2, num_envs) for _ in range(steps)]
    sizes = [num_envs - num_envs // 2, num_envs // 2]
    expected = blocks_rollout([CartPoleVectorEnv(num_envs=k) for k in sizes], 7, actions)
    with backend(None, 2, vector_fn=CartPoleVectorEnv, num_envs=num_envs) as envs:
        got: list[tuple[Any, ...]] = [(envs.reset(seed=7)[0],)]
        for a in actions:
            got.append(envs.step(a)[:4])
    np.testing.assert_array_equal(got[0][0], expected[0][0])
    for t, (g, e) in enumerate(zip(got[1:], expected[1:], strict=True)):
        for k in range(4):
            np.testing.assert_array_equal(g[k], e[k], err_msg=f"step {t} field {k}")
    dones = sum(int((g[2] | g[3]).sum()) for g in got[1:])
    assert dones > 5, "the run should cross several autoresets"


def test_sync_vector_env_blocks_equal_a_flat_sync_vector_env(backend: Backend) -> None:
    n, steps = 6, 200
    flat = sync_cartpoles(n)
    rng = np.random.default_rng(2)
    actions = [rng.integers(0, 2, n) for _ in range(steps)]
    expected = [flat.reset(seed=3)] + [flat.step(a) for a in actions]
    flat.close()
    with backend(None, 2, vector_fn=sync_cartpoles, num_envs=n) as envs:
        got = [envs.reset(seed=3)] + [envs.step(a) for a in actions]
        # Calls reach the hosted SyncVectorEnvs: one result per env.
        assert [s.id for s in envs.get_attr("spec")] == ["CartPole-v1"] * n
        assert envs.get_attr("spec", env_ids=[5])[0].id == "CartPole-v1"
    for t, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert_same(tuple(g), tuple(e), path=f"result {t}")


def test_make_with_vectorization_mode_sync_equals_flat_sync() -> None:
    n = 4
    flat = sync_cartpoles(n)
    expected = flat.reset(seed=11)[0]
    flat.close()
    with envmgr.make("CartPole-v1", num_envs=n, n_workers=2, vectorization_mode="sync") as envs:
        np.testing.assert_array_equal(envs.reset(seed=11)[0], expected)
    with envmgr.make(
        "CartPole-v1", num_envs=n, n_workers=2, vectorization_mode="vector_entry_point"
    ) as envs:
        envs.reset(seed=0)
        assert envs.num_envs == n and envs.step(np.zeros(n, dtype=np.int64))[0].shape == (n, 4)


def test_partial_reset_and_send_recv_at_worker_granularity() -> None:
    # reset_mask goes to the hosted envs as it is: the result equals in-process blocks.
    blocks = [CartPoleVectorEnv(num_envs=3), CartPoleVectorEnv(num_envs=3)]
    mask = np.array([False, True, False, False, False, False])
    for b, start in zip(blocks, (0, 3), strict=True):
        b.reset(seed=start)
    expected = blocks[0].reset(seed=50, options={"reset_mask": mask[:3]})[0]
    with SubprocessEnvManager(vector_fn=CartPoleVectorEnv, num_envs=6, n_workers=2) as envs:
        first, _ = envs.reset(seed=0)
        obs, _ = envs.reset(seed=50, options={"reset_mask": mask})
        np.testing.assert_array_equal(obs[:3], expected)
        np.testing.assert_array_equal(obs[3:], first[3:])  # worker 1 was not asked
        envs.send(np.ones(3, dtype=np.int64), [3, 4, 5])
        *_, ids = envs.recv()
        assert ids.tolist() == [3, 4, 5]


def test_timers_have_one_env_step_per_batch_call() -> None:
    timers.reset_timers()
    with SubprocessEnvManager(vector_fn=CartPoleVectorEnv, num_envs=8, n_workers=2) as envs:
        envs.reset(seed=0)
        with timers.hierarchical_timer("loop"):
            for _ in range(25):
                envs.step(np.zeros(8, dtype=np.int64))
        tree = timers.get_timer_tree()
        seconds, steps = envs.env_step_seconds()  # one batch call counts for each env
        assert (steps == 25).all() and (seconds > 0).all()
    timers.reset_timers()
    workers = tree["children"]["loop"]["children"]["workers"]["children"]
    for w in ("worker_0", "worker_1"):
        assert workers[w]["children"]["step"]["children"]["env.step"]["count"] == 25


def test_a_killed_worker_is_rebuilt_and_its_envs_truncated(backend: Backend) -> None:
    with backend(None, 2, vector_fn=CartPoleVectorEnv, num_envs=4, max_restarts=1) as envs:
        envs.reset(seed=0)
        envs.step(np.zeros(4, dtype=np.int64))
        backend.kill(envs, 0)
        *_, trunc, infos = envs.step(np.zeros(4, dtype=np.int64))
        np.testing.assert_array_equal(trunc, [True, True, False, False])
        assert "envmgr_restarted" in infos
        obs, rew, term, trunc, _ = envs.step(np.zeros(4, dtype=np.int64))
        assert (rew[:2] == 0).all() and not (term | trunc)[:2].any()  # new episodes


def not_a_vector_env(n: int) -> Any:
    return cartpole()


def wrong_size(n: int) -> Any:
    return CartPoleVectorEnv(num_envs=n + 1)


def spaces_differ(n: int) -> Any:
    return CartPoleVectorEnv(num_envs=n) if n == 2 else SyncVectorEnv([DictObsEnv] * n)


@pytest.mark.parametrize(
    ("vector_fn", "error", "match"),
    [
        (not_a_vector_env, TypeError, "returned TimeLimit, not a gymnasium.vector.VectorEnv"),
        (wrong_size, ValueError, "asked for 2 envs but returned a VectorEnv with num_envs=3"),
        (spaces_differ, ValueError, "worker 1 .* has observation_space"),
    ],
)
def test_bad_vector_factories_fail_at_construction(vector_fn: Any, error: type, match: str) -> None:
    # 5 envs: worker 0 gets 3, worker 1 gets 2 (only the third case cares).
    num_envs = 5 if vector_fn is spaces_differ else 4
    with pytest.raises(error, match=match):
        SubprocessEnvManager(vector_fn=vector_fn, num_envs=num_envs, n_workers=2)


def test_a_mismatching_autoreset_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="autoreset_mode='SameStep', but the VectorEnv"):
        SubprocessEnvManager(
            vector_fn=CartPoleVectorEnv, num_envs=4, n_workers=2, autoreset_mode="SameStep"
        )
    with pytest.raises(TypeError, match="exactly one of env_fns"):
        SubprocessEnvManager(cartpole, vector_fn=CartPoleVectorEnv, num_envs=2)
    with pytest.raises(TypeError, match="needs num_envs"):
        SubprocessEnvManager(vector_fn=CartPoleVectorEnv, n_workers=2)


def test_example_runs(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "batched_env.py"),
            "--steps",
            "20",
            "--num-envs",
            "8",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=80,
    )
    assert proc.returncode == 0, proc.stderr
    assert "20 batch steps of 8 envs" in proc.stdout and "env.step" in proc.stdout
