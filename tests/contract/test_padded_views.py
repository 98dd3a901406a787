"""``ragged="padded"`` with ``copy=False``: the batch is views of the workers' one block in
shared memory, valid until the next step, and still the default form row by row."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from support.envs import assert_same
from support.ragged_envs import EntityEnv

from envmgr import SubprocessEnvManager

N = 4
KEYS = ("type_a", "type_b")


def _actions(steps: int) -> list[np.ndarray]:
    return [np.array([t % 2, 1, 0, (t // 2) % 2]) for t in range(steps)]


def _fns(jump_at: int | None = None) -> list[Any]:
    """Entity envs; env 3 (worker 1's) jumps past any capacity from step ``jump_at`` on."""
    return [functools.partial(EntityEnv, jump_at=jump_at if i == 3 else None) for i in range(N)]


def _block(envs: Any, key: str) -> dict[str, np.ndarray]:
    """The arrays of leaf ``entities/key`` over the block worker 0's store is part of."""
    store = envs._session.buffers.ragged[0]
    k = [leaf.path for leaf in store.leaves].index(("entities", key))
    return store.block_arrays[k]  # type: ignore[no-any-return]


def _holds(padded: Any, default: Any) -> None:
    """A padded observation holds the default form's rows."""
    assert_same(padded["global"], default["global"])
    for key in KEYS:
        data, lengths = padded["entities"][key]
        for i, row in enumerate(default["entities"][key]):
            assert lengths[i] == len(row)
            assert_same(data[i, : lengths[i]], row, f"{key}[{i}]")


def test_copy_false_gives_views_of_the_block_that_the_next_step_overwrites() -> None:
    with (
        SubprocessEnvManager(_fns(), 2, 2) as default,
        SubprocessEnvManager(_fns(), 2, 2, ragged="padded", copy=False, capacity=8) as padded,
    ):
        want, got = default.reset(seed=4)[0], padded.reset(seed=4)[0]
        _holds(got, want)
        data, lengths = got["entities"]["type_a"]
        block = _block(padded, "type_a")
        assert np.shares_memory(data, block["data"]) and np.shares_memory(lengths, block["lengths"])
        # Every worker's rows are in the one array.
        rows_of_worker_1 = padded._session.buffers.ragged[1].leaves
        k = [leaf.path for leaf in rows_of_worker_1].index(("entities", "type_a"))
        assert np.shares_memory(data, rows_of_worker_1[k].arrays["data"])
        before = data.copy()
        a = _actions(1)[0]
        want, _ = default.step(a)[0], padded.step(a)[0]
        assert not np.array_equal(data, before)
        _holds(got, want)  # the arrays of the reset show the step now


def test_copy_true_gives_fresh_arrays() -> None:
    with SubprocessEnvManager(_fns(), 2, 2, ragged="padded", capacity=8) as envs:
        obs = envs.reset(seed=4)[0]
        data, lengths = obs["entities"]["type_a"]
        block = _block(envs, "type_a")
        assert not np.shares_memory(data, block["data"])
        assert not np.shares_memory(lengths, block["lengths"])
        before = data.copy()
        envs.step(_actions(1)[0])
        assert_same(data, before)


def test_one_worker_growing_re_lays_the_block_for_every_worker() -> None:
    """Env 3 jumps past the capacity mid-episode: that step's rows travel pickled, every
    worker moves to one larger block, and the batch is views of it again from then on."""
    fns = _fns(jump_at=3)
    steps = _actions(10)
    with (
        SubprocessEnvManager(fns, 2, 2) as default,
        SubprocessEnvManager(fns, 2, 2, ragged="padded", copy=False, capacity=8) as padded,
    ):
        pairs = [(default.reset(seed=1)[0], padded.reset(seed=1)[0])]
        names = [padded._session.buffers.ragged[0].block]
        for a in steps:
            want, got = default.step(a)[0], padded.step(a)[0]
            _holds(got, want)  # compared now: a view shows only the latest step
            pairs.append((want, got))
            names.append(padded._session.buffers.ragged[0].block)
        buffers = padded._session.buffers
        stores = buffers.ragged
        assert stores[0].block == stores[1].block, "the workers are in different blocks"
        assert stores[0].layout.capacities[0] == 64, stores[0].layout.capacities
        assert len(buffers._blocks) == 1 and not buffers.pending  # the old block is freed
        data, _ = pairs[-1][1]["entities"]["type_a"]
        assert np.shares_memory(data, _block(padded, "type_a")["data"])
    assert len(set(names)) == 2, names  # one re-lay, for both workers
