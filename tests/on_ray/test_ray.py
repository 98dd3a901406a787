"""RayEnvManager on a real local Ray instance (single node).

One Ray instance serves the whole module (starting one takes ~4 s): the
session-scoped fixture below starts it on loopback and shuts it down at the
end. ``tests/test_ray_cluster.py`` needs its own multi-node cluster, and a
driver can be connected to one Ray at a time, so that module shuts this instance
down first; ``ray_ready`` brings it back if a test of this module runs after
(e.g. in a reordered run). No wall-clock thresholds: the machine is shared.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest

from envmgr import timers
from envmgr.errors import (
    AlreadyPendingCallError,
    BrokenManagerError,
    BrokenWorkerError,
    ClosedManagerError,
    NoAsyncCallError,
    WorkerTimeoutError,
)

pytestmark = pytest.mark.timeout(60)

# Ray's worker processes cannot import this test module: send its env factories
# and wrappers by value (a user's own modules must be importable on every node,
# or shipped with Ray's runtime_env). Exceptions that travel back are builtins.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

from conftest import NODE_IP, RAY_REASON, LocalRay  # noqa: E402


def make_cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


@pytest.fixture(scope="module")
def ray(ray_session: LocalRay) -> Any:
    # Module scope: set up before the per-test leak check snapshots our child
    # processes, so a restarted Ray (after test_ray_cluster.py) is not a "leak".
    return ray_session.ensure()


@pytest.fixture(autouse=True)
def _fresh_timers() -> Iterator[None]:
    timers.reset_timers()
    yield
    timers.reset_timers()


def _manager(**kwargs: Any) -> Any:
    from envmgr.managers.ray import RayEnvManager

    kwargs.setdefault("num_cpus_per_actor", 0.5)
    env_fns = kwargs.pop("env_fns", make_cartpole)
    return RayEnvManager(env_fns, **kwargs)


def _actor_states(ray: Any, actor_ids: list[str]) -> dict[str, str]:
    from ray._private import state

    table = state.actors()
    return {a: table[a]["State"] for a in actor_ids if a in table}


def _wait_dead(ray: Any, actor_ids: list[str], seconds: float = 20.0) -> dict[str, str]:
    deadline = time.monotonic() + seconds
    states = _actor_states(ray, actor_ids)
    while time.monotonic() < deadline and any(s != "DEAD" for s in states.values()):
        time.sleep(0.1)
        states = _actor_states(ray, actor_ids)
    return states


def _kill(ray: Any, envs: Any, k: int) -> None:
    """Kill actor ``k`` and wait until Ray reports it dead (ray.kill is asynchronous) and
    its process is gone: the GCS may say DEAD while the process still answers a call
    sent straight to it (a step then succeeds on the "dead" actor)."""
    from support.fault_envs import process_token, wait_gone

    actor_id = envs.actor_info[k].actor_id
    token = process_token(envs.actor_info[k].pid)
    assert token is not None, "the actor's process (on this machine) is not found"
    ray.kill(envs.actor_handles[k], no_restart=True)
    assert _wait_dead(ray, [actor_id]) == {actor_id: "DEAD"}
    assert not wait_gone([token], timeout=20, zombie_ok=True), "the killed actor's process lives"


def _assert_same(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    elif isinstance(a, np.ndarray) and a.dtype == object:
        assert a.shape == b.shape
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- without Ray


@pytest.mark.timeout(60)
def test_import_envmgr_does_not_import_ray() -> None:
    code = (
        "import sys, envmgr, envmgr.backends, envmgr.managers.ray\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.timeout(30)
def test_missing_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from envmgr.managers.ray import RayEnvManager

    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` fail
    with pytest.raises(ImportError, match=r'pip install "envmgr\[ray\]"'):
        RayEnvManager(make_cartpole, 1, 1)


_OWN_RAY_SCRIPT = """
import json, subprocess
import gymnasium as gym
import ray
from envmgr.managers.ray import RayEnvManager

envs = RayEnvManager(
    lambda: gym.make("CartPole-v1"), 1, 2, num_cpus_per_actor=0.5, address="local",
    ray_init_kwargs=dict(num_cpus=1, include_dashboard=False,
                         _node_ip_address="127.0.0.2", log_to_driver=False),
)
assert ray.is_initialized()
node = ray._private.worker._global_node
pids = {i.process.pid for infos in node.all_processes.values() for i in infos}
table = [line.split() for line in subprocess.run(
    ["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout.splitlines()]
grew = True
while grew:  # and every descendant: the actor's worker process among them
    kids = {int(p) for p, pp in table if int(pp) in pids} - pids
    grew = bool(kids)
    pids |= kids
envs.reset(seed=0)
envs.step([0, 1])
envs.close()
envs.close()
assert not ray.is_initialized(), "the manager started Ray, so close() must stop it"
print(json.dumps(sorted(pids)))
"""


@pytest.mark.timeout(120)
def test_manager_that_started_ray_stops_it_on_close() -> None:
    pytest.importorskip("ray", reason=RAY_REASON)
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    # A fresh interpreter: this one is already connected to the module's Ray.
    out = subprocess.run(
        [sys.executable, "-c", _OWN_RAY_SCRIPT],
        capture_output=True,
        text=True,
        timeout=110,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    pids = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert len(pids) >= 3  # gcs_server, raylet, ... and the actor's process
    deadline = time.monotonic() + 20
    alive = {p for p in pids if os.path.exists(f"/proc/{p}")}
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = {p for p in pids if os.path.exists(f"/proc/{p}")}
    assert not alive, f"Ray processes left after close(): {sorted(alive)}"


# ----------------------------------------------------------------------------- API


@pytest.mark.timeout(60)
def test_api_spaces_and_call_order(ray: Any) -> None:
    from gymnasium.vector.utils import batch_space

    # "strict": the default ("safe") would pass the out-of-range action below to the env.
    envs = _manager(n_actors=2, envs_per_actor=3, check_actions="strict")
    with envs:
        assert envs.num_envs == 6 and envs.n_actors == 2 and envs.envs_per_actor == 3
        single = make_cartpole()
        assert envs.single_observation_space == single.observation_space
        assert envs.single_action_space == single.action_space
        assert envs.observation_space == batch_space(single.observation_space, 6)
        assert envs.action_space == batch_space(single.action_space, 6)
        assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
        assert envs.spec is not None and envs.spec.id == "CartPole-v1"
        assert "RayEnvManager(CartPole-v1" in repr(envs)

        obs, infos = envs.reset(seed=0)
        assert obs.shape == (6, 4) and obs.dtype == np.float32 and infos == {}
        envs.step_async(envs.action_space.sample())
        with pytest.raises(AlreadyPendingCallError):
            envs.step_async(envs.action_space.sample())
        with pytest.raises(AlreadyPendingCallError):
            envs.reset()
        obs, rew, term, trunc, infos = envs.step_wait()
        assert obs.shape == (6, 4) and rew.shape == (6,) and rew.dtype == np.float64
        assert term.dtype == np.bool_ and trunc.dtype == np.bool_
        with pytest.raises(NoAsyncCallError):
            envs.step_wait()
        with pytest.raises(ValueError, match="env 2"):
            bad = np.zeros(6, dtype=np.int64)
            bad[2] = 5
            envs.step(bad)

        # call / get_attr / set_attr reach every env, in env order.
        assert [s.id for s in envs.get_attr("spec")] == ["CartPole-v1"] * 6
        envs.set_attr("tag", list(range(6)))
        assert envs.get_attr("tag") == tuple(range(6))
        envs.set_attr("tag", "same")
        assert envs.call("tag") == ("same",) * 6
        np.testing.assert_array_equal(np.stack(envs.get_attr("state")).astype(np.float32), obs)
    assert envs.closed
    envs.close()  # idempotent
    with pytest.raises(ClosedManagerError):
        envs.step(np.zeros(6, dtype=np.int64))


@pytest.mark.timeout(60)
def test_results_equal_sync_vector_env(ray: Any) -> None:
    n_actors, per_actor = 2, 4
    n = n_actors * per_actor
    sync = gym.vector.SyncVectorEnv([make_cartpole] * n)
    rng = np.random.default_rng(7)
    with _manager(n_actors=n_actors, envs_per_actor=per_actor) as envs:
        _assert_same(envs.reset(seed=123), sync.reset(seed=123))
        dones = 0
        for _ in range(250):
            actions = rng.integers(0, 2, size=n)
            got, want = envs.step(actions), sync.step(actions)
            for g, w in zip(got, want, strict=True):
                _assert_same(g, w)
            dones += int((got[2] | got[3]).sum())
        assert dones > 0, "no episode ended: autoreset was not exercised"

        # Per-env seeds and a masked reset match too.
        mask = np.array([True, False, False, True, False, True, False, False])
        seeds = list(range(50, 50 + n))
        _assert_same(envs.reset(seed=seeds), sync.reset(seed=seeds))
        _assert_same(
            envs.reset(seed=9, options={"reset_mask": mask}),
            sync.reset(seed=9, options={"reset_mask": mask.copy()}),
        )
        for _ in range(20):
            actions = rng.integers(0, 2, size=n)
            for g, w in zip(envs.step(actions), sync.step(actions), strict=True):
                _assert_same(g, w)
    sync.close()


def make_dict_obs() -> gym.Env[Any, Any]:
    env = gym.make("CartPole-v1")
    space = gym.spaces.Dict({"x": env.observation_space, "tag": gym.spaces.Discrete(3)})
    return gym.wrappers.TransformObservation(env, lambda o: {"x": o, "tag": 2}, space)


@pytest.mark.timeout(60)
def test_same_step_autoreset_and_dict_observations_equal_sync_vector_env(ray: Any) -> None:
    n = 4
    sync = gym.vector.SyncVectorEnv([make_dict_obs] * n, autoreset_mode="SameStep")
    rng = np.random.default_rng(5)
    with _manager(
        env_fns=make_dict_obs, n_actors=2, envs_per_actor=2, autoreset_mode="SameStep"
    ) as envs:
        assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
        _assert_same(envs.reset(seed=8), sync.reset(seed=8))
        finals = 0
        for _ in range(120):
            actions = rng.integers(0, 2, size=n)
            got = envs.step(actions)
            for g, w in zip(got, sync.step(actions), strict=True):
                _assert_same(g, w)
            finals += int(got[4].get("_final_obs", np.zeros(n, bool)).sum())
        assert finals > 0, "no episode ended: same-step autoreset was not exercised"
    sync.close()


@pytest.mark.timeout(90)
def test_actor_with_worker_processes_equals_sync_vector_env(ray: Any) -> None:
    # workers_per_actor=2: the actor runs an envmgr SubprocessEnvManager inside.
    n = 4
    sync = gym.vector.SyncVectorEnv([make_cartpole] * n)
    rng = np.random.default_rng(3)
    with timers.hierarchical_timer("loop"):
        with _manager(n_actors=1, envs_per_actor=n, workers_per_actor=2) as envs:
            _assert_same(envs.reset(seed=5), sync.reset(seed=5))
            dones = 0
            for _ in range(120):
                actions = rng.integers(0, 2, size=n)
                got = envs.step(actions)
                for g, w in zip(got, sync.step(actions), strict=True):
                    _assert_same(g, w)
                dones += int((got[2] | got[3]).sum())
            assert dones > 0
            tree = timers.get_timer_tree()
    actor = tree["children"]["loop"]["children"]["workers"]["children"]["actor_0@" + NODE_IP]
    inner = actor["children"]["step"]["children"]["workers"]["children"]
    assert {"worker_root", "worker_0", "worker_1"} <= inner.keys()
    assert inner["worker_0"]["is_parallel"] and inner["worker_1"]["is_parallel"]
    assert inner["worker_root"]["children"]["step"]["count"] == 2 * 120
    sync.close()


@pytest.mark.timeout(60)
def test_timer_tree_has_a_parallel_subtree_per_actor(ray: Any) -> None:
    steps = 40
    with _manager(n_actors=2, envs_per_actor=3) as envs:
        envs.reset(seed=0)
        with timers.hierarchical_timer("rollout"):
            for _ in range(steps):
                envs.step(envs.action_space.sample())
        tree = timers.get_timer_tree()  # pulls in what the actors have not shipped yet
    workers = tree["children"]["rollout"]["children"]["workers"]
    assert workers["count"] == steps
    kids = workers["children"]
    assert set(kids) == {"worker_root", f"actor_0@{NODE_IP}", f"actor_1@{NODE_IP}"}
    actors = [kids[f"actor_{k}@{NODE_IP}"] for k in range(2)]
    for node in [kids["worker_root"], *actors]:
        assert node["is_parallel"] is True
        assert node["children"]["step"]["is_parallel"] is True
    for a in actors:
        assert a["children"]["step"]["count"] == steps
        assert a["children"]["step"]["children"]["env.step"]["count"] > 0
    root = kids["worker_root"]["children"]["step"]
    assert root["count"] == sum(a["children"]["step"]["count"] for a in actors) == 2 * steps
    env_steps = [a["children"]["step"]["children"]["env.step"]["count"] for a in actors]
    resets = [
        a["children"]["step"]["children"].get("env.reset", {"count": 0})["count"] for a in actors
    ]
    assert root["children"]["env.step"]["count"] == sum(env_steps)
    assert sum(env_steps) + sum(resets) == 2 * steps * 3  # each env stepped or autoreset per step
    # The reset went under the caller's timer at the time: the root's "workers".
    assert tree["children"]["workers"]["children"]["worker_root"]["children"]["reset"]["count"] == 2


@pytest.mark.timeout(60)
def test_first_ready_send_recv(ray: Any) -> None:
    n_actors, per_actor = 2, 3
    n = n_actors * per_actor
    # With constant actions each env's trajectory is independent of the others,
    # so env i's k-th answer must equal SyncVectorEnv's step k for env i.
    sync = gym.vector.SyncVectorEnv([make_cartpole] * n)
    ref_obs = [sync.reset(seed=11)[0]]
    ref_rew = [np.zeros(n)]
    for _ in range(40):
        obs, rew, _, _, _ = sync.step(np.ones(n, dtype=np.int64))
        ref_obs.append(obs)
        ref_rew.append(rew)
    sync.close()

    with _manager(n_actors=n_actors, envs_per_actor=per_actor) as envs:
        envs.async_reset(seed=11)
        with pytest.raises(AlreadyPendingCallError):
            envs.step(np.ones(n, dtype=np.int64))
        seen = np.zeros(n, dtype=np.int64)  # answers received per env
        for i in range(30):
            # Mostly one actor's group (the default), sometimes everything in flight.
            obs, rew, term, trunc, infos, ids = envs.recv(batch_size=n if i % 5 == 4 else None)
            assert len(ids) % per_actor == 0 and len(ids) == obs.shape[0] == rew.shape[0]
            assert list(ids) == sorted(ids)
            for row, env in enumerate(ids):
                np.testing.assert_array_equal(obs[row], ref_obs[seen[env]][env])
                assert rew[row] == ref_rew[seen[env]][env]
                seen[env] += 1
            envs.send(np.ones(len(ids), dtype=np.int64), ids)
        busy = envs.actors_in_flight[0]
        with pytest.raises(AlreadyPendingCallError, match="already has a step in flight"):
            envs.send(np.ones(per_actor, dtype=np.int64), envs.actor_info[busy].envs)
        with pytest.raises(ValueError, match="whole actors"):
            envs.send(np.ones(1, dtype=np.int64), [0])
        # Drain, then the batch API works again.
        while envs.actors_in_flight:
            envs.recv()
        with pytest.raises(NoAsyncCallError):
            envs.recv()
        obs, *_ = envs.step(np.ones(n, dtype=np.int64))
        assert obs.shape == (n, 4)
        # send() after a plain reset(), EnvPool-style, with ids in any order.
        envs.reset(seed=11)
        order = np.array([5, 3, 4, 0, 2, 1])
        envs.send(np.ones(n, dtype=np.int64), order)
        obs, rew, *_, ids = envs.recv(batch_size=n)
        np.testing.assert_array_equal(ids, np.arange(n))
        np.testing.assert_array_equal(obs, ref_obs[1])
    assert seen.min() > 0


# ------------------------------------------------------------------------ shutdown and failures


@pytest.mark.timeout(60)
def test_close_leaves_no_actors(ray: Any) -> None:
    envs = _manager(n_actors=2, envs_per_actor=2)
    ids = [a.actor_id for a in envs.actor_info]
    assert len(set(ids)) == 2
    assert set(_actor_states(ray, ids).values()) == {"ALIVE"}
    envs.reset(seed=0)
    envs.close()
    envs.close()
    assert _wait_dead(ray, ids) == {i: "DEAD" for i in ids}
    assert ray.is_initialized(), "a manager must not stop a Ray it did not start"


@pytest.mark.timeout(90)
def test_killed_actor_is_detected_and_restarted(ray: Any) -> None:
    from envmgr.errors import RayActorDiedError
    from envmgr.frontend.results import RESTARTED_INFO_KEY

    per_actor = 3
    with _manager(n_actors=2, envs_per_actor=per_actor, max_restarts=1) as envs:
        envs.reset(seed=0)
        envs.step(np.zeros(6, dtype=np.int64))
        old_id = envs.actor_info[1].actor_id
        _kill(ray, envs, 1)
        obs, rew, term, trunc, infos = envs.step(np.zeros(6, dtype=np.int64))

        victims = np.arange(6) >= per_actor
        np.testing.assert_array_equal(trunc, victims)
        assert not term[victims].any() and (rew[victims] == 0).all()
        np.testing.assert_array_equal(infos[f"_{RESTARTED_INFO_KEY}"], victims)
        reason = infos[RESTARTED_INFO_KEY][per_actor]
        assert "ray actor 1 (envs 3-5)" in reason and f"on node {NODE_IP}" in reason
        assert "ray.kill" in reason
        assert envs.restarts == [0, 1]
        assert envs.actor_info[1].actor_id != old_id
        (failure,) = envs.failures
        assert isinstance(failure, RayActorDiedError)
        assert failure.actor_index == 1 and failure.node_ip == NODE_IP
        assert failure.env_indices == (3, 4, 5) and failure.actor_id == old_id

        # Next step: the truncated envs autoreset (reward 0, no flags, fresh
        # episode); the others go on. Then everything steps normally.
        obs2, rew2, term2, trunc2, infos2 = envs.step(np.zeros(6, dtype=np.int64))
        assert (rew2[victims] == 0).all() and not (term2 | trunc2)[victims].any()
        assert (np.abs(obs2[victims]) <= 0.05).all()  # CartPole's reset range
        assert RESTARTED_INFO_KEY not in infos2
        for _ in range(5):
            _, rew3, _, _, _ = envs.step(np.ones(6, dtype=np.int64))
        assert (rew3 == 1).all()
        assert len(envs.get_attr("spec")) == 6

        # Killed during a reset: the replacement carries out the reset asked for.
        _kill(ray, envs, 0)
        obs_r, infos_r = envs.reset(seed=0)
        expected, _ = gym.vector.SyncVectorEnv([make_cartpole] * 6).reset(seed=0)
        np.testing.assert_array_equal(obs_r, expected)
        np.testing.assert_array_equal(infos_r[f"_{RESTARTED_INFO_KEY}"], ~victims)
        assert envs.restarts == [1, 1]

        # Beyond max_restarts (1 per actor): BrokenWorkerError, manager closed.
        _kill(ray, envs, 1)
        with pytest.raises(BrokenWorkerError, match="max_restarts=1 is spent") as err:
            envs.step(np.zeros(6, dtype=np.int64))
        assert err.value.worker_index == 1 and err.value.env_indices == (3, 4, 5)
        assert isinstance(err.value.__cause__, RayActorDiedError)
        with pytest.raises(BrokenManagerError, match="broken"):
            envs.step(np.zeros(6, dtype=np.int64))


@pytest.mark.timeout(90)
def test_death_without_restarts_raises_and_closes(ray: Any) -> None:
    from envmgr.errors import RayActorDiedError, WorkerDiedError

    envs = _manager(n_actors=2, envs_per_actor=2)  # max_restarts=0, the default
    ids = [a.actor_id for a in envs.actor_info]
    envs.reset(seed=0)
    _kill(ray, envs, 0)
    with pytest.raises(
        WorkerDiedError, match=r"ray actor 0 \(envs 0-1\) on node 127\.0\.0\.2"
    ) as err:
        envs.step(np.zeros(4, dtype=np.int64))
    assert isinstance(err.value, RayActorDiedError)
    assert err.value.worker_index == 0 and err.value.env_indices == (0, 1)
    assert err.value.node_ip == NODE_IP and err.value.node_id == envs.actor_info[0].node_id
    assert "ray.kill" in err.value.reason
    assert envs.closed
    with pytest.raises(BrokenManagerError, match="broken"):
        envs.step(np.zeros(4, dtype=np.int64))
    with pytest.raises(BrokenManagerError):
        envs.reset()
    envs.close()
    assert _wait_dead(ray, ids) == {i: "DEAD" for i in ids}


class _SlowEnv(gym.Wrapper):  # type: ignore[type-arg]
    """CartPole whose step hangs once ``hang`` is set."""

    hang = False

    def step(self, action: Any) -> Any:
        if self.hang:
            time.sleep(3600)
        return self.env.step(action)


def make_slow() -> gym.Env[Any, Any]:
    return _SlowEnv(gym.make("CartPole-v1"))


@pytest.mark.timeout(60)
def test_hung_actor_times_out_instead_of_hanging(ray: Any) -> None:
    # One actor, whose env sleeps for an hour: the timeout is the only way out,
    # whatever the load on the machine (the other calls keep the 60 s default).
    envs = _manager(env_fns=make_slow, n_actors=1, envs_per_actor=2)
    assert envs.step_timeout == 60.0  # the default: finite
    ids = [a.actor_id for a in envs.actor_info]
    envs.reset(seed=0)
    envs.set_attr("hang", [False, True])
    envs.step_async(np.zeros(2, dtype=np.int64))
    with pytest.raises(WorkerTimeoutError, match="did not answer step within 2.0 s") as err:
        envs.step_wait(timeout=2.0)
    assert err.value.worker_index == 0 and err.value.env_indices == (0, 1)
    assert envs.closed
    assert _wait_dead(ray, ids) == {i: "DEAD" for i in ids}


def make_failing_step() -> gym.Env[Any, Any]:
    class Failing(gym.Wrapper):  # type: ignore[type-arg]
        def step(self, action: Any) -> Any:
            if action == 1:
                raise LookupError("bad action")
            return self.env.step(action)

    return Failing(gym.make("CartPole-v1"))


@pytest.mark.timeout(60)
def test_env_errors_come_back_as_their_own_type(ray: Any) -> None:
    with _manager(env_fns=make_failing_step, n_actors=2, envs_per_actor=2) as envs:
        envs.reset(seed=0)
        with pytest.raises(LookupError, match="bad action") as err:
            envs.step(np.array([0, 0, 1, 0]))
        notes = " ".join(getattr(err.value, "__notes__", []))
        assert "ray actor 1" in notes and "env 2" in notes
        # An env error does not break the manager.
        assert envs.step(np.zeros(4, dtype=np.int64))[0].shape == (4, 4)


def make_broken_factory() -> gym.Env[Any, Any]:
    raise ArithmeticError("factory failed")


@pytest.mark.timeout(60)
def test_factory_error_is_raised_and_leaves_nothing(ray: Any) -> None:
    from ray._private import state

    before = set(state.actors())
    with pytest.raises(ArithmeticError, match="factory failed") as caught:
        _manager(env_fns=make_broken_factory, n_actors=2, envs_per_actor=1)
    # Its note names the actor's process, which had built nothing yet.
    notes = " ".join(getattr(caught.value, "__notes__", []))
    pid = re.search(r"pid (\d+)", notes)
    assert pid is not None and int(pid.group(1)) > 0, notes
    new = [a for a in state.actors() if a not in before]
    assert len(new) == 2
    assert _wait_dead(ray, new) == {a: "DEAD" for a in new}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("part", ["build", "reset"])
def test_a_restart_cut_off_by_ctrl_c_is_redone_at_the_next_call(
    ray: Any, part: str, tmp_path: Any
) -> None:
    """Ctrl-C while a lost actor is replaced (its replacement building its envs, or
    resetting them): the interrupt reaches the caller, the replacement is killed, and
    the next step replaces the actor again and goes on, as the local backend does."""
    import signal
    import threading

    from support.fault_envs import process_token, slow_to_restart, wait_gone

    from envmgr.frontend.results import RESTARTED_INFO_KEY

    flag = str(tmp_path / "slow")
    pids = flag + ".pids"
    envs = _manager(
        env_fns=slow_to_restart(flag, part), n_actors=2, envs_per_actor=1, max_restarts=3
    )
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    with envs:
        actions = np.zeros(2, dtype=np.int64)
        envs.reset(seed=0)
        lost_id = envs.actor_info[1].actor_id
        open(flag, "w").close()
        _kill(ray, envs, 1)

        def interrupt_once_stalled() -> None:  # Ctrl-C once the replacement is stuck
            deadline = time.monotonic() + 60.0
            while not os.path.exists(pids) and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)

        ring = threading.Thread(target=interrupt_once_stalled, daemon=True)
        ring.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                envs.step(actions)
        finally:
            ring.join(70.0)
            signal.signal(signal.SIGINT, old_handler)
        assert not envs.closed
        (cut_pid,) = (int(p) for p in open(pids).read().split())
        assert not wait_gone([process_token(cut_pid)], timeout=20.0), "replacement left running"
        os.unlink(flag)

        _, rewards, _, truncs, infos = envs.step(actions)
        assert rewards.shape == (2,)
        assert truncs[1] and not truncs[0]  # the replaced actor's env starts afresh
        assert "cut off by an interrupt" in infos[RESTARTED_INFO_KEY][1]
        assert envs.actor_info[1].actor_id != lost_id
        assert envs.actor_info[1].pid != cut_pid
        envs.step(actions)  # next-step autoreset of the replaced actor's env
        _, rewards, _, truncs, _ = envs.step(actions)
        assert rewards.tolist() == [1.0, 1.0] and not truncs.any()
