"""Sequence actions (one choice per entity) through the groups' action stores: each env gets
what SyncVectorEnv hands it, bit for bit, on every backend, with capacities that grow."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
from conftest import Backend, on_backends
from gymnasium.vector import SyncVectorEnv
from support.envs import assert_same, assert_same_results
from support.ragged_envs import OrdersEnv, hosted_orders, orders

N = 4
MODES = ["NextStep", "SameStep", "Disabled"]
#: Capacities under the action space's root, past which the orders jump.
SMALL = {"actions/targets": 2, "actions/picks": 2}


def _run(envs: Any, batches: list[Any], mode: str = "NextStep") -> list[Any]:
    """reset + one step per batch (Disabled: the finished envs reset by mask)."""
    out = [envs.reset(seed=3)]
    for a in batches:
        out.append(envs.step(a))
        if mode == "Disabled":
            done = out[-1][2] | out[-1][3]
            if done.any():
                out.append(envs.reset(options={"reset_mask": done}))
    return out


def _reference(fns: Any, batches: list[Any], mode: str = "NextStep") -> list[Any]:
    sync = SyncVectorEnv(fns, autoreset_mode=mode)
    try:
        return _run(sync, batches, mode)
    finally:
        sync.close()


@on_backends("mode", local=MODES)
def test_nested_sequence_actions_equal_sync_vector_env(backend: Backend, mode: str) -> None:
    """0-3 orders per env against a capacity of 2; env 3 gives 40 more from step 4 on."""
    batches = orders(N, 14, jump=(4, 3))
    want = _reference([OrdersEnv] * N, batches, mode)
    with backend([OrdersEnv] * N, 2, 2, autoreset_mode=mode, capacity=SMALL) as envs:
        assert_same_results(_run(envs, batches, mode), want)


@on_backends()
def test_a_bare_sequence_action_space_grows_from_what_is_seen(backend: Backend) -> None:
    fns = [functools.partial(OrdersEnv, nested=False)] * N
    batches = orders(N, 10, nested=False, jump=(3, 0))
    want = _reference(fns, batches)
    with backend(fns, 2, 2) as envs:  # no hint: every store starts at 0 and grows
        assert_same_results(_run(envs, batches), want)


@on_backends(caller="the caller case's helper splits env_fns (see the next test)")
def test_a_hosted_vector_env_gets_sequence_actions_as_sync_vector_env(backend: Backend) -> None:
    batches = orders(N, 10, jump=(2, 1))
    want = _reference([OrdersEnv] * N, batches)
    with backend(None, 2, num_envs=N, vector_fn=hosted_orders, capacity=SMALL) as envs:
        assert_same_results(_run(envs, batches), want)


def test_a_hosted_vector_env_in_the_caller_gets_sequence_actions() -> None:
    from envmgr import SubprocessEnvManager

    batches = orders(N, 8, jump=(2, 3))
    want = _reference([OrdersEnv] * N, batches)
    hosted = SubprocessEnvManager(None, 1, num_envs=N, vector_fn=hosted_orders, caller_envs=2)
    with hosted as envs:
        assert_same_results(_run(envs, batches), want)


@on_backends()
def test_first_ready_send_carries_sequence_actions(backend: Backend) -> None:
    batches = orders(N, 6, jump=(2, 0))
    want = _reference([OrdersEnv] * N, batches)
    with backend([OrdersEnv] * N, 2, 2, capacity=SMALL) as envs:
        envs.async_reset(seed=3)
        got: dict[int, list[Any]] = {0: [], 1: []}
        steps = [0, 0]
        while min(steps) <= len(batches):
            obs, rewards, *_, ids = envs.recv()
            g = int(ids[0]) // 2
            got[g].append((obs, rewards))
            if steps[g] < len(batches):
                batch = batches[steps[g]]
                rows = {
                    "move": batch["move"][ids],
                    "targets": tuple(batch["targets"][i] for i in ids),
                    "picks": tuple(batch["picks"][i] for i in ids),
                }
                envs.send(rows, ids)
            steps[g] += 1
    for g in range(2):
        for t, (obs, rewards) in enumerate(got[g]):
            assert_same(obs["echo"], want[t][0]["echo"][2 * g : 2 * g + 2], f"step {t}")
            if t:
                assert_same(rewards, want[t][1][2 * g : 2 * g + 2], f"step {t}")


def test_steady_state_steps_pickle_no_actions() -> None:
    """Once the stores have grown, a step's orders cost the workers no bytes read: the
    doorbell alone wakes them (the pickled transport reads each step's orders)."""
    from support.helpers import traffic

    from envmgr import SubprocessEnvManager

    batches = orders(N, 40, jump=(2, 1))
    kw: dict[str, Any] = {"context": "fork", "timer_interval": 1e9}
    read = {}
    for ragged in ("gymnasium", "pickled"):
        with SubprocessEnvManager([OrdersEnv] * N, 2, 2, ragged=ragged, **kw) as envs:
            envs.reset(seed=0)
            for a in batches[:10]:  # the jump (step 2) and the grows it makes
                envs.step(a)
            read[ragged], _ = traffic(envs, batches[10:])
    assert read["gymnasium"] <= 2 * 30 * 8, read  # at most a wake-up word per worker step
    assert read["pickled"] > 2 * 30 * 200, read  # each step's orders, pickled


@on_backends()
def test_an_order_of_the_wrong_shape_names_the_env_and_the_path(backend: Backend) -> None:
    batches = orders(N, 3)
    with backend([OrdersEnv] * N, 2, 2) as envs:
        envs.reset(seed=0)
        envs.step(batches[0])
        bad = dict(batches[1])
        bad["targets"] = (*bad["targets"][:2], np.zeros((2, 3), np.float32), bad["targets"][3])
        with pytest.raises(ValueError) as info:
            envs.step(bad)
        message = str(info.value)
        assert "env 2" in message and "actions['targets']" in message, message
        assert "(2, 3)" in message, message
        # Nothing was sent: the manager steps on.
        obs, *_ = envs.step(batches[2])
        assert_same(obs["echo"], batches[2]["targets"])


@on_backends(
    caller="the caller's group cannot be killed",
    ray="a killed actor is replaced alike; its store travels with each step",
)
def test_a_replaced_worker_maps_the_grown_action_store(backend: Backend) -> None:
    batches = orders(N, 6, jump=(0, 0))
    with backend([OrdersEnv] * N, 2, 2, max_restarts=1, capacity=SMALL) as envs:
        envs.reset(seed=0)
        envs.step(batches[0])  # past the capacity: group 0's action store is re-laid
        backend.kill(envs, 0)
        _, _, _, trunc, _ = envs.step(batches[1])
        assert trunc[:2].all()
        envs.step(batches[2])  # next-step: the replacement's envs reset
        for a in batches[3:]:
            obs, *_ = envs.step(a)
            for i in range(N):
                assert_same(obs["echo"][i], a["targets"][i], f"env {i}")


def test_capacity_hints_name_parts_of_either_space() -> None:
    from envmgr import SubprocessEnvManager

    with pytest.raises(ValueError, match="actions/aim"):
        with SubprocessEnvManager([OrdersEnv] * 2, 1, capacity={"actions/aim": 4}):
            pass
    with SubprocessEnvManager([OrdersEnv] * 2, 1, capacity={"actions": 8, "echo": 5}) as envs:
        buffers = envs._session.buffers
        assert buffers.action_stores.stores[0].layout.capacities == (8, 8)
        assert buffers.ragged[0].layout.capacities == (5,)
