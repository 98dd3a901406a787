"""What ``suites.ray_floor`` times through Ray on this machine, and how it reads the timers.

One Ray instance on loopback alone (:func:`start_local_ray`), and in it, side by side, the
same number of actors twice over: envs-free :class:`EchoActor` s answering a step's arrays,
and a ``RayEnvManager`` stepping the real envs::

    driver                                      actors (one Ray instance, 127.0.0.2)
    RayRig.bare(a)        ray.get([echo.arrays(a_k)])   -> EchoActor: the answer's arrays
    RayRig.packed(a)      ray.get([echo.packed(bytes)]) -> EchoActor: one pickled bytes
    RayRig.step(a)        envs.step(a)                  -> EnvActor: serve(step) -> envs
    RayRig.first_ready    envs.send(a_ids, ids) / envs.recv(), every actor kept busy

``local_manager`` builds a ``SubprocessEnvManager`` with the same envs and layout, for
the local comparison. :func:`own_times` reads envmgr's own time per step off the timer
tree (the driver's ``step`` node minus its ``workers`` wait; the actors' merged
``worker_root/step`` minus the env calls under it).

Ray is imported only where a function needs it: a local manager's workers, which import
this module for its env factories, never import Ray.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from functools import partial
from time import perf_counter, process_time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space, create_empty_array

from benchmarks._common import envs as bench_envs

__all__ = [
    "ENV_FACTORIES",
    "NODE_IP",
    "EchoActor",
    "PayloadNoopEnv",
    "RayRig",
    "action_batches",
    "factory",
    "local_manager",
    "own_times",
    "start_local_ray",
]

#: Ray rewrites 127.0.0.1 to the host's external address; this stays on loopback.
NODE_IP = "127.0.0.2"
#: Action batches drawn per configuration, walked cyclically.
N_ACTION_BATCHES = 64
#: Steps of a PayloadNoopEnv episode (then truncated).
NOOP_EPISODE = 200


class PayloadNoopEnv(gym.Env[np.ndarray, np.int64]):
    """Does nothing, with an observation of ``nbytes`` uint8 (one preallocated array).

    Discrete(2) actions, reward 1.0 per step, truncated every ``NOOP_EPISODE`` steps: what
    a step costs through a manager is then the manager's and the transport's alone.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, nbytes: int) -> None:
        self.observation_space = gym.spaces.Box(0, 255, shape=(nbytes,), dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self._obs = np.zeros(nbytes, np.uint8)
        self._t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        return self._obs, {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self._t += 1
        return self._obs, 1.0, False, self._t >= NOOP_EPISODE, {}


def make_halfcheetah() -> gym.Env[Any, Any]:
    return gym.make("HalfCheetah-v5")


def make_pong() -> gym.Env[Any, Any]:
    """``ALE/Pong-v5`` as registered (frame skip 4, 210x160x3 RGB observations)."""
    import ale_py

    gym.register_envs(ale_py)
    return gym.make("ALE/Pong-v5")


#: Benchmark env name -> zero-argument factory (``noop`` takes its payload: see
#: :func:`factory`).
ENV_FACTORIES: dict[str, Callable[..., gym.Env[Any, Any]]] = {
    "cartpole": bench_envs.make_cartpole,
    "noop": PayloadNoopEnv,
    "halfcheetah": make_halfcheetah,
    "pong": make_pong,
}


def factory(env: str, noop_bytes: int) -> Callable[[], gym.Env[Any, Any]]:
    """The zero-argument factory of benchmark env ``env``."""
    if env not in ENV_FACTORIES:
        raise ValueError(f"unknown env {env!r}; choose from {', '.join(ENV_FACTORIES)}")
    if env == "noop":
        return partial(PayloadNoopEnv, noop_bytes)
    return ENV_FACTORIES[env]


def action_batches(make: Callable[[], gym.Env[Any, Any]], n: int, seed: int) -> np.ndarray:
    """``(N_ACTION_BATCHES, n, ...)`` actions for ``n`` envs, drawn once per configuration."""
    probe = make()
    space = batch_space(probe.action_space, n)
    probe.close()
    space.seed(seed)
    return np.stack([space.sample() for _ in range(N_ACTION_BATCHES)])


def start_local_ray() -> Any:
    """A new Ray instance of this machine alone: loopback, 2 CPUs, no dashboard, no usage
    reports. Never attaches to another cluster (``address="local"``)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address=NODE_IP,
        log_to_driver=False,
    )
    return ray


def step_answer(
    make: Callable[[], gym.Env[Any, Any]], n: int
) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
    """Arrays the size of ``n`` envs' step answer: observations, rewards, two flags."""
    probe = make()
    obs = create_empty_array(probe.observation_space, n, fn=np.zeros)
    probe.close()
    return obs, np.zeros(n, np.float64), np.zeros(n, np.bool_), np.zeros(n, np.bool_)


class EchoActor:
    """An actor with no envs: takes a step's actions, answers a step's arrays at once."""

    def __init__(self, make: Callable[[], gym.Env[Any, Any]], n: int) -> None:
        self.answer = step_answer(make, n)
        self.answer_bytes = pickle.dumps(self.answer, protocol=pickle.HIGHEST_PROTOCOL)

    def arrays(self, actions: np.ndarray) -> tuple[Any, ...]:
        return self.answer

    def packed(self, payload: bytes) -> bytes:
        pickle.loads(payload)
        return self.answer_bytes

    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.answer)


def _nodes_named(node: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """Every node called ``name`` under ``node`` (not looking inside the ones found)."""
    found = []
    for child_name, child in node.get("children", {}).items():
        if child_name == name:
            found.append(child)
        else:
            found += _nodes_named(child, name)
    return found


def _child(node: dict[str, Any] | None, *path: str) -> dict[str, Any]:
    for name in path:
        node = (node or {}).get("children", {}).get(name)
    return node or {}


def timer_totals(tree: dict[str, Any]) -> dict[str, float]:
    """Seconds and counts of the nodes :func:`own_times` reads, from a timer tree.

    The driver's ``step`` (the benchmark's own node around ``envs.step``) and the
    ``workers`` wait under it; every actor's ``step`` under a merged ``worker_root``
    (wherever it was merged: under ``step/workers`` during the steps, under the root's
    ``workers`` at the flush that reads the tree), and the env calls under it.
    """
    step = _child(tree, "step")
    wait = _child(step, "workers")
    out = {
        "driver_step": float(step.get("total", 0.0)),
        "driver_steps": float(step.get("count", 0)),
        "driver_wait": float(wait.get("total", 0.0)),
        "actor_step": 0.0,
        "actor_calls": 0.0,
        "actor_env": 0.0,
        "actor_env_steps": 0.0,
    }
    for root in _nodes_named(tree, "worker_root"):
        served = _child(root, "step")
        out["actor_step"] += float(served.get("total", 0.0))
        out["actor_calls"] += float(served.get("count", 0))
        for call in ("env.step", "env.reset"):
            node = _child(served, call)
            out["actor_env"] += float(node.get("total", 0.0))
            out["actor_env_steps"] += float(node.get("count", 0))
    return out


def own_times(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """envmgr's own µs per step between two :func:`timer_totals`, both sides.

    ``driver_own_us``: the driver's step minus its wait for the actors (checks, packing
    and posting the actions, reading the answers into the batch); ``driver_wait_us``: the
    wait (Ray's round trip, the actors' work, unpacking the answers); ``actor_own_us``:
    an actor's serving of one step minus its env calls; ``env_us_per_step``: one env call.
    """
    d = {k: after[k] - before[k] for k in after}
    steps, calls, env_steps = d["driver_steps"], d["actor_calls"], d["actor_env_steps"]
    nan = float("nan")
    return {
        "driver_own_us": (d["driver_step"] - d["driver_wait"]) / steps * 1e6 if steps else nan,
        "driver_wait_us": d["driver_wait"] / steps * 1e6 if steps else nan,
        "actor_own_us": (d["actor_step"] - d["actor_env"]) / calls * 1e6 if calls else nan,
        "actor_env_us_per_call": d["actor_env"] / calls * 1e6 if calls else nan,
        "env_us_per_step": d["actor_env"] / env_steps * 1e6 if env_steps else nan,
        "actor_calls": calls,
    }


def timed(step: Callable[[Any], Any], actions: np.ndarray, seconds: float) -> dict[str, float]:
    """``step`` on the action batches in turn for ``seconds``: µs per batch, driver CPU."""
    from benchmarks._common.timing import run_for

    s = run_for(step, actions, 0, seconds)
    return {
        "batches": s["batches"],
        "seconds": s["seconds"],
        "us_per_batch": s["seconds"] / s["batches"] * 1e6,
        "driver_cpu_us_per_batch": s["cpu_seconds"] / s["batches"] * 1e6,
    }


class RayRig:
    """``n_actors`` echo actors and a ``RayEnvManager`` of ``n_actors x envs_per_actor``
    envs, in the running Ray instance.

    Args:
        ray: The ``ray`` module, initialized.
        make: The env factory.
        n_actors: Actors of each kind.
        envs_per_actor: Envs per manager actor; an echo actor answers for as many.
    """

    def __init__(
        self, ray: Any, make: Callable[[], gym.Env[Any, Any]], n_actors: int, envs_per_actor: int
    ) -> None:
        from envmgr import RayEnvManager

        self.ray = ray
        self.n = n_actors * envs_per_actor
        echo = ray.remote(num_cpus=0)(EchoActor)
        rows = [slice(k * envs_per_actor, (k + 1) * envs_per_actor) for k in range(n_actors)]
        self.echoes = [(echo.remote(make, envs_per_actor), r) for r in rows]
        self.answer_bytes = ray.get(self.echoes[0][0].nbytes.remote())
        # num_cpus_per_actor=0: n_actors may exceed the instance's 2 CPUs, as the echoes do.
        self.envs = RayEnvManager(
            make,
            n_actors,
            envs_per_actor,
            num_cpus_per_actor=0,
            shutdown_ray=False,
        )
        self.envs.reset(seed=0)

    def bare(self, actions: np.ndarray) -> Any:
        """One round trip to every echo at once, the actions' rows in, arrays out."""
        return self.ray.get([e.arrays.remote(actions[r]) for e, r in self.echoes])

    def packed(self, actions: np.ndarray) -> Any:
        """The same, each way as one pickled bytes (pickling included)."""
        dump = partial(pickle.dumps, protocol=pickle.HIGHEST_PROTOCOL)
        refs = [e.packed.remote(dump(actions[r])) for e, r in self.echoes]
        return [pickle.loads(b) for b in self.ray.get(refs)]

    def step(self, actions: np.ndarray) -> Any:
        """One envmgr batch step, under the benchmark's ``step`` timer node."""
        from envmgr import timers

        with timers.hierarchical_timer("step"):
            return self.envs.step(actions)

    def first_ready(self, actions: np.ndarray, seconds: float) -> dict[str, float]:
        """First-ready stepping for ``seconds``: every actor's envs sent, then each answer
        that lands first taken and its envs sent their next actions at once, so every actor
        always has a step in flight. Returns µs per ``n`` env-steps (one batch's worth)."""
        envs, m = self.envs, len(actions)
        k = 0
        envs.send(actions[0])
        in_flight = self.n
        env_steps = recvs = 0
        c0 = process_time()
        t0 = perf_counter()
        deadline = t0 + seconds
        while True:
            *_, ids = envs.recv()
            in_flight -= len(ids)
            env_steps += len(ids)
            recvs += 1
            now = perf_counter()
            if now >= deadline:
                break
            k += 1
            envs.send(actions[k % m][ids], ids)
            in_flight += len(ids)
        elapsed, cpu = now - t0, process_time() - c0
        while in_flight:  # the steps still out, outside the window
            *_, ids = envs.recv()
            in_flight -= len(ids)
        batches = env_steps / self.n
        return {
            "batches": batches,
            "recvs": recvs,
            "seconds": elapsed,
            "us_per_batch": elapsed / batches * 1e6,
            "driver_cpu_us_per_batch": cpu / batches * 1e6,
        }

    def close(self) -> None:
        self.envs.close()
        for e, _ in self.echoes:
            self.ray.kill(e)


def local_manager(make: Callable[[], gym.Env[Any, Any]], n_workers: int, per_worker: int) -> Any:
    """``SubprocessEnvManager`` with the same envs and layout as the Ray rig, reset."""
    from envmgr import SubprocessEnvManager

    envs = SubprocessEnvManager(make, n_workers, per_worker)
    envs.reset(seed=0)
    return envs
