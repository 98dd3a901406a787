"""Sequence and Graph observations through shared memory: SyncVectorEnv's results bit for
bit, on every backend, with capacities that grow and rows that spill once."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
from conftest import Backend, on_backends
from gymnasium.vector import SyncVectorEnv
from support.envs import assert_same, assert_same_results
from support.ragged_envs import BadEntityEnv, EntityEnv, GraphEnv, hosted_entities

N = 4
MODES = ["NextStep", "SameStep", "Disabled"]


def _actions(steps: int) -> list[np.ndarray]:
    return [np.array([t % 2, 1, 0, (t // 2) % 2]) for t in range(steps)]


def _run(envs: Any, mode: str, steps: int = 12) -> list[Any]:
    """reset + steps (Disabled: the finished envs reset by mask, as a user would)."""
    out = [envs.reset(seed=7)]
    for a in _actions(steps):
        out.append(envs.step(a))
        if mode == "Disabled":
            done = out[-1][2] | out[-1][3]
            if done.any():
                out.append(envs.reset(options={"reset_mask": done}))
    return out


@on_backends("mode", local=MODES)
def test_entity_observations_equal_sync_vector_env(backend: Backend, mode: str) -> None:
    """Lengths 0-5 against a capacity of 2, and one env past it by 40 from step 3 on."""
    fns = [functools.partial(EntityEnv, jump_at=3 if i == 2 else None) for i in range(N)]
    sync = SyncVectorEnv(fns, autoreset_mode=mode)
    want = _run(sync, mode)
    sync.close()
    with backend(fns, 2, 2, autoreset_mode=mode, capacity=2) as envs:
        assert_same_results(_run(envs, mode), want)


@on_backends("mode", local=MODES)
def test_graph_observations_equal_sync_vector_env(backend: Backend, mode: str) -> None:
    sync = SyncVectorEnv([GraphEnv] * N, autoreset_mode=mode)
    want = _run(sync, mode)
    sync.close()
    with backend([GraphEnv] * N, 2, 2, autoreset_mode=mode) as envs:
        assert_same_results(_run(envs, mode), want)


@on_backends(caller="the caller case's helper splits env_fns (see the next test)")
def test_a_hosted_vector_env_of_sequences_equals_sync_vector_env(backend: Backend) -> None:
    """The multi-agent path: each group hosts a VectorEnv whose rows have Sequence parts."""
    sync = SyncVectorEnv([EntityEnv] * N)
    want = _run(sync, "NextStep")
    sync.close()
    with backend(None, 2, num_envs=N, vector_fn=hosted_entities, capacity=1) as envs:
        assert_same_results(_run(envs, "NextStep"), want)


def test_a_hosted_vector_env_of_sequences_in_the_caller_equals_sync_vector_env() -> None:
    from envmgr import SubprocessEnvManager

    sync = SyncVectorEnv([EntityEnv] * N)
    want = _run(sync, "NextStep")
    sync.close()
    hosted = SubprocessEnvManager(None, 1, num_envs=N, vector_fn=hosted_entities, caller_envs=2)
    with hosted as envs:
        assert_same_results(_run(envs, "NextStep"), want)


@on_backends()
def test_the_padded_form_holds_the_default_form_row_by_row(backend: Backend) -> None:
    fns = [functools.partial(EntityEnv, jump_at=2 if i == 1 else None) for i in range(N)]
    with backend(fns, 2, 2) as default, backend(fns, 2, 2, ragged="padded") as padded:
        pairs = [(default.reset(seed=1)[0], padded.reset(seed=1)[0])]
        for a in _actions(6):
            pairs.append((default.step(a)[0], padded.step(a)[0]))
    for want, got in pairs:
        assert_same(got["global"], want["global"])
        for key in ("type_a", "type_b"):
            data, lengths = got["entities"][key]
            assert lengths.dtype == np.int64 and data.shape[0] == N
            for i, row in enumerate(want["entities"][key]):
                assert lengths[i] == len(row)
                assert_same(data[i, : lengths[i]], row, f"{key}[{i}]")


@on_backends()
def test_padded_graphs_hold_the_default_graphs(backend: Backend) -> None:
    with (
        backend([GraphEnv] * N, 2, 2) as default,
        backend([GraphEnv] * N, 2, 2, ragged="padded") as padded,
    ):
        want, got = default.reset(seed=2)[0], padded.reset(seed=2)[0]
    nodes, n_nodes, edges, links, n_edges = got
    for i, g in enumerate(want):
        assert_same(nodes[i, : n_nodes[i]], g.nodes)
        assert_same(edges[i, : n_edges[i]], g.edges)
        assert np.array_equal(links[i, : n_edges[i]], g.edge_links)


def test_after_a_jump_past_the_capacity_later_steps_pickle_nothing() -> None:
    """One worker's env jumps past the capacity mid-episode: that step's rows travel
    pickled, the worker's store is re-laid larger, and from then on the workers write
    nothing per step but the parent's wake-up byte (no answer)."""
    from support.helpers import io_bytes

    from envmgr import SubprocessEnvManager, timers

    timers.reset_timers()

    fns = [functools.partial(EntityEnv, jump_at=4 if i == 3 else None) for i in range(N)]
    sync = SyncVectorEnv(fns)
    actions = _actions(40)
    want = [sync.reset(seed=0)] + [sync.step(a) for a in actions]
    sync.close()
    with SubprocessEnvManager(fns, 2, 2, context="fork", timer_interval=1e9, capacity=8) as envs:
        got = [envs.reset(seed=0)] + [envs.step(a) for a in actions[:10]]
        capacities = [s.layout.capacities for s in envs._session.buffers.ragged]
        before = [io_bytes(p)[1] for p in envs.worker_pids]
        got += [envs.step(a) for a in actions[10:]]
        written = sum(io_bytes(p)[1] - b for p, b in zip(envs.worker_pids, before, strict=True))
        root = timers.get_timer_root()
    assert_same_results(got, want)
    assert capacities[0] == (8, 8) and capacities[1] == (64, 8), capacities
    assert written <= 2 * 30, f"workers wrote {written} bytes in 30 steps"
    overflow = {name: _count(node, "ragged.overflow") for name, node in _workers(root).items()}
    assert overflow == {"worker_0": 0, "worker_1": 1}, overflow


def _workers(root: Any) -> dict[str, Any]:
    """The workers' nodes of the parent's timer tree, wherever ``workers`` nodes are."""
    found: dict[str, Any] = {}
    for name, child in root.children.items():
        if name.startswith("worker_") and name[7:].isdigit():
            found.setdefault(name, []).append(child)
        for k, v in _workers(child).items():
            found.setdefault(k, []).extend(v)
    return found


def _count(nodes: list[Any], name: str) -> int:
    """Calls of node ``name`` below ``nodes``."""
    total = 0
    for node in nodes:
        for k, child in node.children.items():
            total += child.count if k == name else 0
            total += _count([child], name)
    return total


@on_backends()
def test_first_ready_send_recv_carries_sequences(backend: Backend) -> None:
    fns = [functools.partial(EntityEnv, jump_at=2 if i == 0 else None) for i in range(N)]
    sync = SyncVectorEnv(fns)
    want = [sync.reset(seed=5)[0]] + [sync.step(a)[0] for a in _actions(5)]
    sync.close()
    with backend(fns, 2, 2) as envs:
        envs.async_reset(seed=5)
        rows: dict[int, list[Any]] = {g: [] for g in range(2)}
        steps = [0, 0]
        while min(steps) <= 5:
            obs, _, _, _, _, ids = envs.recv()
            g = int(ids[0]) // 2
            rows[g].append(obs)
            if steps[g] < 5:
                envs.send(_actions(5)[steps[g]][ids], ids)
            steps[g] += 1
    for g in range(2):
        for t, obs in enumerate(rows[g]):
            for key in ("type_a", "type_b"):
                assert_same(obs["entities"][key], want[t]["entities"][key][2 * g : 2 * g + 2])


@on_backends(ray="a killed actor is replaced alike; the local case covers the re-laid store")
def test_a_replaced_worker_maps_the_store_the_parent_reads(backend: Backend) -> None:
    fns = [functools.partial(EntityEnv, jump_at=1) for _ in range(N)]
    with backend(fns, 2, 2, max_restarts=1) as envs:
        envs.reset(seed=0)
        envs.step(_actions(1)[0])  # past the capacity: group 0's store is re-laid
        backend.kill(envs, 0)
        obs, _, _, trunc, _ = envs.step(_actions(1)[0])
        assert trunc[:2].all()
        obs, *_ = envs.step(_actions(1)[0])  # next-step: the replacement's envs reset
        for a in _actions(3):
            obs, *_ = envs.step(a)
        assert all(len(x) >= 40 for x in obs["entities"]["type_a"])


@on_backends()
def test_an_element_of_the_wrong_shape_names_the_env_and_the_path(backend: Backend) -> None:
    fns = [EntityEnv, EntityEnv, EntityEnv, BadEntityEnv]
    with backend(fns, 2, 2) as envs:
        envs.reset(seed=0)
        envs.step(_actions(1)[0])
        with pytest.raises(ValueError) as info:
            envs.step(_actions(1)[0])
    message = str(info.value)
    assert "env 3" in message
    assert "observations['entities']['type_b']" in message
    assert "(3, 3)" not in message and "(2, 3)" in message


def test_capacity_hints_name_parts_of_the_space() -> None:
    from envmgr import SubprocessEnvManager

    with pytest.raises(ValueError, match="entities/type_c"):
        with SubprocessEnvManager([EntityEnv] * 2, 1, capacity={"entities/type_c": 4}):
            pass
    with pytest.raises(ValueError, match="ragged must be one of"):
        SubprocessEnvManager([EntityEnv] * 2, 1, ragged="ragged")
    with SubprocessEnvManager(
        [EntityEnv] * 2, 1, capacity={"entities": 16, "entities/type_b": 3}
    ) as envs:
        envs.reset(seed=0)
        assert envs._session.buffers.ragged[0].layout.capacities == (16, 3)


def test_ragged_pickled_keeps_the_pickled_transport() -> None:
    from envmgr import SubprocessEnvManager

    sync = SyncVectorEnv([EntityEnv] * N)
    want = _run(sync, "NextStep", steps=6)
    sync.close()
    with SubprocessEnvManager([EntityEnv] * N, 2, ragged="pickled") as envs:
        assert_same_results(_run(envs, "NextStep", steps=6), want)
        assert envs._session.buffers.ragged is None  # no store: every observation pickles
