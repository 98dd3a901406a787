"""The shared-memory segment: which spaces fit, create/attach, slices, close."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector.utils import create_empty_array
from support.envs import dict_obs_space

from envmgr.protocol.shared_memory import (
    SEGMENT_PREFIX,
    SharedBuffers,
    SharedLayout,
    fits_shared_memory,
    tree_map,
)

pytestmark = pytest.mark.timeout(60)

N_ENVS = 4


def _leaves(tree: Any) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    tree_map(out.append, tree)
    return out


def _shm_path(buffers: SharedBuffers) -> str:
    return f"/dev/shm/{buffers.name}"


# ------------------------------------------------------------------ fits_shared_memory

FIXED = {
    "Box": spaces.Box(-1, 1, (2, 3), np.float32),
    "Box-int": spaces.Box(0, 255, (4,), np.uint8),
    "Discrete": spaces.Discrete(5, start=-2),
    "MultiDiscrete": spaces.MultiDiscrete([[2, 3], [4, 5]]),
    "MultiBinary": spaces.MultiBinary(6),
    "Dict": spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Box(0, 1, (2,))}),
    "Tuple": spaces.Tuple((spaces.Discrete(2), spaces.MultiBinary(3))),
    "nested": dict_obs_space(),
}
NOT_FIXED = {
    "Text": spaces.Text(5),
    "Graph": spaces.Graph(spaces.Box(0, 1, (2,)), spaces.Discrete(3)),
    "Sequence": spaces.Sequence(spaces.Discrete(3)),
    "OneOf": spaces.OneOf((spaces.Discrete(2), spaces.Box(0, 1, (2,)))),
    "Dict-with-Text": spaces.Dict({"a": spaces.Discrete(2), "t": spaces.Text(4)}),
    "Tuple-with-Sequence": spaces.Tuple((spaces.Discrete(2), spaces.Sequence(spaces.Discrete(2)))),
    "nested-Graph": spaces.Dict(
        {"x": spaces.Tuple((spaces.Box(0, 1, (1,)), spaces.Graph(spaces.Discrete(2), None)))}
    ),
}


@pytest.mark.parametrize("name", sorted(FIXED))
def test_fixed_shape_spaces_fit(name: str) -> None:
    assert fits_shared_memory(FIXED[name]) is True


@pytest.mark.parametrize("name", sorted(NOT_FIXED))
def test_spaces_without_fixed_shape_do_not_fit(name: str) -> None:
    assert fits_shared_memory(NOT_FIXED[name]) is False


# ------------------------------------------------------------------ create / attach


@pytest.fixture
def buffers() -> Any:
    b = SharedBuffers.create(dict_obs_space(), spaces.MultiDiscrete([3, 4]), N_ENVS)
    yield b
    b.close()


def test_create_lays_out_the_batch_like_gymnasium(buffers: SharedBuffers) -> None:
    assert buffers.name.startswith(SEGMENT_PREFIX)
    assert os.path.exists(_shm_path(buffers))
    expected_obs = create_empty_array(dict_obs_space(), N_ENVS)
    got = _leaves(buffers.observations)
    want = _leaves(expected_obs)
    assert [(a.shape, a.dtype) for a in got] == [(a.shape, a.dtype) for a in want]
    assert isinstance(buffers.observations, dict)
    assert isinstance(buffers.observations["nested"], tuple)
    acts = buffers.actions
    assert acts.shape == (N_ENVS, 2) and acts.dtype == np.int64
    assert buffers.rewards.shape == (N_ENVS,) and buffers.rewards.dtype == np.float64
    assert buffers.terminations.dtype == np.bool_ and buffers.truncations.dtype == np.bool_
    for leaf in [*got, acts, buffers.rewards, buffers.terminations, buffers.truncations]:
        assert not leaf.any(), "a new segment starts zeroed"
        # Every array starts on its own cache line.
        assert leaf.ctypes.data % 64 == 0


def test_spaces_that_do_not_fit_have_no_region() -> None:
    b = SharedBuffers.create(spaces.Text(5), spaces.Sequence(spaces.Discrete(2)), 3)
    try:
        assert b.observations is None and b.actions is None
        assert b.rewards.shape == (3,)
    finally:
        b.close()


def test_attach_in_the_same_process_sees_the_same_memory(buffers: SharedBuffers) -> None:
    other = SharedBuffers.attach(buffers.layout)
    try:
        buffers.observations["pos"][2] = [0.25, -0.5, 1.0]
        buffers.rewards[:] = [1.0, 2.0, 3.0, 4.0]
        assert np.array_equal(other.observations["pos"][2], [0.25, -0.5, 1.0])
        assert np.array_equal(other.rewards, [1.0, 2.0, 3.0, 4.0])
        other.observations["nested"][2][3] = [1, 0, 1, 1]
        other.actions[1] = [2, 3]
        other.terminations[3] = True
        assert np.array_equal(buffers.observations["nested"][2][3], [1, 0, 1, 1])
        assert np.array_equal(buffers.actions[1], [2, 3])
        assert buffers.terminations.tolist() == [False, False, False, True]
    finally:
        other.close()
    # Closing an attached view never unlinks: the creator still owns the name.
    assert os.path.exists(_shm_path(buffers))
    assert buffers.rewards[3] == 4.0


def test_slices_are_views_of_one_workers_envs(buffers: SharedBuffers) -> None:
    part = buffers.slice(2, 4)
    part["rewards"][:] = [5.0, 6.0]
    part["observations"]["mode"][:] = [3, 4]
    part["actions"][0] = [1, 1]
    assert buffers.rewards.tolist() == [0.0, 0.0, 5.0, 6.0]
    assert buffers.observations["mode"].tolist() == [0, 0, 3, 4]
    assert buffers.actions[2].tolist() == [1, 1]
    assert part["terminations"].shape == (2,)


def test_layout_pickles(buffers: SharedBuffers) -> None:
    layout = pickle.loads(pickle.dumps(buffers.layout))
    assert layout == buffers.layout
    assert isinstance(layout, SharedLayout) and layout.name == buffers.name


def _child_writes(layout: SharedLayout, start: int, stop: int, value: float) -> None:
    b = SharedBuffers.attach(layout)
    try:
        part = b.slice(start, stop)
        part["rewards"][:] = value
        part["observations"]["pos"][:] = value
        part["terminations"][:] = True
        assert np.all(b.actions[start:stop] == [[1, 2]] * (stop - start))
    finally:
        part = {}
        b.close()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_attach_from_a_child_process(buffers: SharedBuffers, method: str) -> None:
    buffers.actions[:] = [1, 2]
    ctx = mp.get_context(method)
    proc = ctx.Process(target=_child_writes, args=(buffers.layout, 1, 3, 0.75))
    proc.start()
    proc.join(50)
    assert proc.exitcode == 0
    assert buffers.rewards.tolist() == [0.0, 0.75, 0.75, 0.0]
    assert np.all(buffers.observations["pos"][1:3] == np.float32(0.75))
    assert buffers.terminations.tolist() == [False, True, True, False]
    # The child's exit does not take the segment with it.
    assert os.path.exists(_shm_path(buffers))


# ------------------------------------------------------------------ close


def test_close_unlinks_and_is_idempotent() -> None:
    b = SharedBuffers.create(spaces.Box(0, 1, (3,)), spaces.Discrete(2), 2)
    path = _shm_path(b)
    assert os.path.exists(path)
    b.close()
    assert not os.path.exists(path)
    b.close()
    b.close()
    assert not os.path.exists(path)


def test_close_of_an_attached_view_is_idempotent(buffers: SharedBuffers) -> None:
    other = SharedBuffers.attach(buffers.layout)
    other.close()
    other.close()
    assert os.path.exists(_shm_path(buffers))


@pytest.mark.parametrize("side", ["creator", "attached"])
def test_holding_a_view_after_close_does_not_crash(run_python: Any, side: str) -> None:
    # Run in a child interpreter: an unmapped view would crash it with SIGSEGV.
    proc = run_python(
        f"""
        import os
        import numpy as np
        from gymnasium import spaces
        from envmgr.protocol.shared_memory import SharedBuffers

        owner = SharedBuffers.create(spaces.Box(0, 1, (3,)), spaces.Discrete(2), 2)
        owner.observations[:] = 0.5
        b = owner if {side!r} == "creator" else SharedBuffers.attach(owner.layout)
        view = b.observations[1:]
        b.close()
        path = "/dev/shm/" + owner.name
        if b is not owner:
            owner.close()
        assert not os.path.exists(path), "segment not unlinked"
        assert float(view.sum()) == 1.5, view
        view[0, 0] = 0.25  # writes land in the still-mapped memory
        assert view[0, 0] == 0.25
        print("survived")
        """
    )
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{proc.stderr[-3000:]}"
    assert "survived" in proc.stdout


def test_tree_map_keeps_the_structure() -> None:
    tree = {"a": np.zeros(2), "b": (np.ones(1), {"c": np.arange(3)})}
    out = tree_map(lambda a: a.sum(), tree)
    assert out == {"a": 0.0, "b": (1.0, {"c": 3})}


def test_space_helper_sanity() -> None:
    # The gymnasium spaces used above behave as expected in this gymnasium version.
    assert isinstance(gym.vector.utils.batch_space(spaces.Text(3), 2), spaces.Tuple)


@pytest.mark.parametrize("rows", [3, 1024, 5000])
@pytest.mark.parametrize("order", ["C", "F"])
def test_copy_tree_copies_row_and_column_major_batches_exactly(rows: int, order: str) -> None:
    """A vectorized env's batch may be column-major (CartPole's ``state.T``); from 1,024
    rows it is copied a column at a time: the values, dtype cast included, are the same."""
    from envmgr.protocol.trees import copy_tree

    src = np.asarray(np.random.default_rng(0).random((rows, 4)), order=order)  # type: ignore[call-overload]
    dst = np.zeros((rows, 4), dtype=np.float32)
    copy_tree(dst, src)
    np.testing.assert_array_equal(dst, src.astype(np.float32))
    nested = {"a": np.zeros((rows, 4)), "b": (np.zeros(rows, dtype=np.int64),)}
    copy_tree(nested, {"a": src, "b": (np.arange(rows),)})
    np.testing.assert_array_equal(nested["a"], src)
    np.testing.assert_array_equal(nested["b"][0], np.arange(rows))
