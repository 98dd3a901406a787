"""``copy=False`` and ``copy=True``: views into the shared-memory segment (writable,
overwritten by the next step, still readable after close) or independent arrays.

(envmgr.frontend.results, envmgr.protocol.shared_memory)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.envs import DictObsEnv, TextObsEnv
from support.helpers import batch_actions

from envmgr import SubprocessEnvManager

pytestmark = pytest.mark.timeout(60)


def test_copy_false_returns_writable_views_that_the_next_step_overwrites() -> None:
    with SubprocessEnvManager(DictObsEnv, 2, 2, copy=False) as envs:
        actions = batch_actions(envs, 2)
        obs1, _ = envs.reset(seed=0)
        leaves1 = [obs1["pos"], obs1["mode"], *obs1["nested"]]
        before = [leaf.copy() for leaf in leaves1]
        for leaf in leaves1:
            assert leaf.flags.writeable  # as AsyncVectorEnv's shared-memory observations
        obs2, *_ = envs.step(actions[0])
        leaves2 = [obs2["pos"], obs2["mode"], *obs2["nested"]]
        for a, b in zip(leaves1, leaves2, strict=True):
            assert np.shares_memory(a, b)
            assert np.array_equal(a, b)  # the old view shows the new step
        assert not np.array_equal(before[0], leaves1[0])  # overwritten in place


def test_copy_true_returns_independent_arrays() -> None:
    with SubprocessEnvManager(DictObsEnv, 2, 2) as envs:
        actions = batch_actions(envs, 2)
        obs1, _ = envs.reset(seed=0)
        snapshot = {"pos": obs1["pos"].copy(), "mode": obs1["mode"].copy()}
        obs1["pos"][...] = 0.5  # writeable, and nobody else sees it
        obs2, *_ = envs.step(actions[0])
        assert not np.shares_memory(obs1["pos"], obs2["pos"])
        assert np.all(obs1["pos"] == 0.5)
        assert np.array_equal(obs1["mode"], snapshot["mode"])
        assert obs2["pos"].flags.writeable


def test_view_held_after_close_does_not_crash(run_python: Any) -> None:
    # In a child interpreter: if the segment were unmapped under the view, reading
    # it would crash the interpreter (SIGSEGV) rather than fail an assertion.
    proc = run_python(
        """
        import os
        import numpy as np
        from support.envs import DictObsEnv
        from envmgr import SubprocessEnvManager

        from support.fault_envs import segment_of

        with SubprocessEnvManager(DictObsEnv, 1, 2, copy=False) as envs:
            obs, _ = envs.reset(seed=0)
            expected = obs["pos"].copy()
            name = segment_of(envs.worker_pids)
        assert not os.path.exists("/dev/shm/" + name), "segment not unlinked"
        assert np.array_equal(obs["pos"], expected)
        print("view still readable")
        """
    )
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{proc.stderr[-3000:]}"
    assert "view still readable" in proc.stdout


def test_text_observations_with_copy_false() -> None:
    with SubprocessEnvManager(TextObsEnv, 1, 2, copy=False) as envs:
        obs, _ = envs.reset(seed=0)
        assert isinstance(obs, tuple) and all(isinstance(o, str) for o in obs)
        obs, *_ = envs.step(np.array([1, 2]))
        assert envs.observation_space.contains(obs)


def test_the_observation_writer_copies_in_one_pass_when_the_dtype_matches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker's views carry an unpickled dtype, never the instance an env's arrays carry.
    Compared by identity, every batch took the checked slow path (np.copyto of a list),
    which cost CartPole 2 x 32 about a fifth of its rate
    (benchmarks/results/record/before_after_2026-12-03d.txt)."""
    import pickle

    from envmgr.envside.single_group import _make_writer

    dtype = pickle.loads(pickle.dumps(np.dtype(np.float32)))
    out = np.ndarray((3, 4), dtype=dtype, buffer=bytearray(48))
    assert out.dtype is not np.dtype(np.float32)  # as in a worker
    write = _make_writer(out)

    def slow_path(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("np.copyto: the checked path ran for matching dtypes")

    monkeypatch.setattr(np, "copyto", slow_path)
    write([np.full(4, k, np.float32) for k in range(3)])
    assert out.tolist() == [[0.0] * 4, [1.0] * 4, [2.0] * 4]
    with pytest.raises(AssertionError, match="checked path"):  # a float64 value is checked
        write([np.zeros(4, np.float64)] * 3)
