"""CartPole throughput: RayEnvManager on a two-node Ray cluster vs the local SubprocessEnvManager.

Run: python -m benchmarks.suites.ray_throughput [--envs-per-actor 64 256] [--seconds 2] [--rounds 3]

In one run it:

1. times starting a local Ray instance (``ray.init(address="local")``) and stopping it;
2. starts a two-node cluster on this machine (``ray.cluster_utils.Cluster``: a
   head and a worker node, each a full Ray node with 1 CPU and a custom resource
   ``node_a`` / ``node_b``), timing the start, and connects the driver;
3. builds, for each N in ``--envs-per-actor``, the local ``SubprocessEnvManager``
   with 1 and 2 workers of N envs and ``RayEnvManager`` with 1 actor (head node)
   and 2 actors (one per node) of N envs;
4. steps them all in interleaved rounds (each configuration ``--seconds`` per
   round, the order rotating), so a load change on a shared machine hits every
   configuration alike; the 2-actor manager runs with plain batch steps and with
   first-ready ``send``/``recv``;
5. stops the cluster, timing it, and prints env-steps/s (median over rounds) and
   each Ray row's ratio to the local manager with the same number of envs
   (median of the per-round ratios).

With the hosted case it also times, in the same rounds, Ray's round trip alone: two
actors with no envs answering each call with a hosted step's arrays. A Ray batch step
costs at least the local batch plus that round trip, so ``local / (local + round trip)``
estimates the most Ray / local can reach on this machine whatever envmgr does (an
estimate, not a hard bound: the two are timed one after the other, and Ray's round trip
varies from call to call).

The hosted case (issue 11): with ``--hosted-envs-per-actor E`` (default 2048; 0 skips it),
each worker or actor hosts one ``CartPoleVectorEnv`` of ``E`` envs instead of ``E`` single
envs, 2 of them, locally (``SubprocessEnvManager(vector_fn=...)``) and on the two Ray
nodes (``RayEnvManager(vector_fn=...)``); the Ray call per batch is then amortised over
many envs, and "vs local" is Ray / local at 2 x E.

Everything stays on loopback (127.0.0.2: Ray rewrites 127.0.0.1 to the host's
external address) and Ray's usage reporting is off. On a 2-core machine both
"nodes" share the same two cores, so the 2-actor rows show the cost of Ray's
transport, not a second machine's worth of cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import gymnasium as gym
import numpy as np

from envmgr import SubprocessEnvManager

NODE_IP = "127.0.0.2"


def make_cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


def make_cartpole_vector(n: int) -> gym.vector.VectorEnv:
    """One batched CartPole of ``n`` envs, for a worker or actor to host."""
    return gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")


class _Echo:
    """A Ray actor with no envs: answers every call with what a hosted step answers.

    Its round trip with a hosted step's payload is the least a Ray step can cost here.
    """

    def __init__(self, n: int) -> None:
        self.answer = (
            np.zeros((n, 4), np.float32),
            np.zeros(n, np.float32),
            np.zeros(n, np.bool_),
            np.zeros(n, np.bool_),
        )

    def run(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        return self.answer


def round_trip_us(ray: Any, actors: list[Any], n: int, seconds: float) -> float:
    """Median µs of one round trip to every actor at once, with an ``n``-action payload."""
    actions = np.zeros(n, np.int64)
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        ray.get([a.run.remote(actions) for a in actors])
        times.append(time.perf_counter() - t0)
    return statistics.median(times[len(times) // 10 :]) * 1e6


def step_rate(envs: Any, seconds: float) -> float:
    """Env-steps per second of plain batch steps over ``seconds`` (after a short warm-up)."""
    n = envs.num_envs
    actions = np.random.default_rng(0).integers(0, 2, size=(256, n))
    warm = time.perf_counter() + min(0.3, seconds / 4)
    i = 0
    while time.perf_counter() < warm:
        envs.step(actions[i % 256])
        i += 1
    start = time.perf_counter()
    steps = 0
    while time.perf_counter() - start < seconds:
        envs.step(actions[steps % 256])
        steps += 1
    return steps * n / (time.perf_counter() - start)


def send_recv_rate(envs: Any, seconds: float) -> float:
    """Env-steps per second of first-ready stepping: answer whichever actor is done first."""
    actions = np.random.default_rng(0).integers(0, 2, size=(256, envs.num_envs))
    envs.send(actions[0])  # every actor busy
    ids = envs.recv()[5]
    done = i = 0
    warm = time.perf_counter() + min(0.3, seconds / 4)
    start: float | None = None
    while True:
        now = time.perf_counter()
        if start is None and now >= warm:
            start, done = now, 0
        if start is not None and now - start >= seconds:
            break
        envs.send(actions[i % 256][: len(ids)], ids)
        ids = envs.recv()[5]
        done += len(ids)
        i += 1
    rate = done / (time.perf_counter() - start)  # type: ignore[operator]
    while envs.actors_in_flight:
        envs.recv()
    return rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs-per-actor", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--seconds", type=float, default=2.0, help="per configuration and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--hosted-envs-per-actor",
        type=int,
        default=2048,
        help="envs of the vector env each worker/actor hosts (default: 2048; 0: skip)",
    )
    args = parser.parse_args(argv)
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError:
        print('needs Ray: pip install "envmgr[ray]"', file=sys.stderr)
        return 1
    from envmgr.managers.ray import RayEnvManager

    timings: list[tuple[str, float]] = []
    t0 = time.perf_counter()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address=NODE_IP,
        log_to_driver=False,
    )
    timings.append(("local Ray: ray.init(address='local')", time.perf_counter() - t0))
    t0 = time.perf_counter()
    ray.shutdown()
    timings.append(("local Ray: ray.shutdown()", time.perf_counter() - t0))

    t0 = time.perf_counter()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "node_ip_address": NODE_IP,
            "num_cpus": 1,
            "resources": {"node_a": 1},
            "include_dashboard": False,
        },
    )
    timings.append(("cluster: head node up", time.perf_counter() - t0))
    managers: list[Any] = []
    floor: tuple[list[Any], int, str] | None = None  # echo actors, envs each, local row
    floor_name = ""
    # name -> (envs, rate function); "local" rows are the baselines.
    runs: dict[str, tuple[int, Callable[[], float]]] = {}
    baseline: dict[str, str] = {}
    try:
        cluster.add_node(node_ip_address=NODE_IP, num_cpus=1, resources={"node_b": 1})
        cluster.wait_for_nodes()
        timings.append(("cluster: head + worker node up", time.perf_counter() - t0))
        t1 = time.perf_counter()
        ray.init(address=cluster.address, _node_ip_address=NODE_IP, log_to_driver=False)
        timings.append(("cluster: driver connected", time.perf_counter() - t1))

        for e in args.envs_per_actor:
            for k in (1, 2):
                local = SubprocessEnvManager(make_cartpole, k, e)
                local.reset(seed=0)
                managers.append(local)
                name = f"local SubprocessEnvManager {k} x {e}"
                runs[name] = (k * e, lambda m=local: step_rate(m, args.seconds))
                t1 = time.perf_counter()
                remote = RayEnvManager(
                    make_cartpole,
                    k,
                    e,
                    resources_per_actor=[{"node_a": 0.01}, {"node_b": 0.01}][:k],
                    num_cpus_per_actor=0,  # every manager's actors fit at once
                )
                timings.append(
                    (f"RayEnvManager {k} x {e}: actors started", time.perf_counter() - t1)
                )
                remote.reset(seed=0)
                managers.append(remote)
                nodes = "+".join(a.node_id[:6] for a in remote.actor_info)
                name_r = f"RayEnvManager {k} x {e} (step; nodes {nodes})"
                runs[name_r] = (k * e, lambda m=remote: step_rate(m, args.seconds))
                baseline[name_r] = name
                if k == 2:
                    name_f = f"RayEnvManager {k} x {e} (send/recv; nodes {nodes})"
                    runs[name_f] = (k * e, lambda m=remote: send_recv_rate(m, args.seconds))
                    baseline[name_f] = name

        e = args.hosted_envs_per_actor
        if e > 0:
            local = SubprocessEnvManager(
                vector_fn=make_cartpole_vector, num_envs=2 * e, n_workers=2
            )
            local.reset(seed=0)
            managers.append(local)
            name = f"local SubprocessEnvManager hosted 2 x {e}"
            runs[name] = (2 * e, lambda m=local: step_rate(m, args.seconds))
            t1 = time.perf_counter()
            remote = RayEnvManager(
                vector_fn=make_cartpole_vector,
                num_envs=2 * e,
                n_actors=2,
                resources_per_actor=[{"node_a": 0.01}, {"node_b": 0.01}],
                num_cpus_per_actor=0,
            )
            timings.append((f"RayEnvManager hosted 2 x {e}: started", time.perf_counter() - t1))
            remote.reset(seed=0)
            managers.append(remote)
            name_r = f"RayEnvManager hosted 2 x {e} (step)"
            runs[name_r] = (2 * e, lambda m=remote: step_rate(m, args.seconds))
            baseline[name_r] = name
            echo_cls = ray.remote(num_cpus=0)(_Echo)
            echoes = [
                echo_cls.options(resources=r).remote(e)
                for r in ({"node_a": 0.01}, {"node_b": 0.01})
            ]
            ray.get([a.run.remote(np.zeros(1)) for a in echoes])
            floor_name = f"hosted 2 x {e}"
            floor = (echoes, e, name)

        samples: dict[str, list[float]] = {name: [] for name in runs}
        names = list(runs)
        floor_us: list[float] = []
        for r in range(args.rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                samples[name].append(runs[name][1]())
            if floor is not None:
                floor_us.append(round_trip_us(ray, floor[0], floor[1], args.seconds))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        for m in managers:
            m.close()
        t1 = time.perf_counter()
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        timings.append(
            ("cluster: driver disconnected, both nodes stopped", time.perf_counter() - t1)
        )

    print()
    print(
        f"CartPole-v1, {os.cpu_count()} cores, median of {args.rounds} interleaved rounds x "
        f"{args.seconds:g} s; load average now {os.getloadavg()[0]:.1f}"
    )
    print(f"{'configuration':60} {'envs':>5} {'env-steps/s':>12} {'vs local':>9}")
    print("-" * 89)
    for name, (n, _) in runs.items():
        rate = statistics.median(samples[name])
        ratio = ""
        if name in baseline:
            pairs = zip(samples[name], samples[baseline[name]], strict=True)
            ratio = f"{statistics.median([s / b for s, b in pairs]):8.2f}x"
        print(f"{name:60} {n:5d} {rate:12,.0f} {ratio:>9}")
    if floor is not None and floor_us:
        # The least a Ray batch step can cost here is the local batch plus one round trip.
        e, local_name = floor[1], floor[2]
        local_us = [2 * e / s * 1e6 for s in samples[local_name]]
        bound = [lo / (lo + f) for lo, f in zip(local_us, floor_us, strict=True)]
        print(
            f"\nRay round trip alone ({floor_name}: 2 actors with no envs, answering with the "
            f"hosted step's arrays, {e * 8 // 1024} KB of actions in and "
            f"{e * 22 // 1024} KB out each): {statistics.median(floor_us):,.0f} µs; the local "
            f"hosted batch step: {statistics.median(local_us):,.0f} µs; so Ray / local can "
            f"reach about {statistics.median(bound):.2f}x here, whatever envmgr does"
        )
    print()
    print(f"{'Ray start / stop':60} {'seconds':>12}")
    print("-" * 73)
    for name, seconds in timings:
        print(f"{name:60} {seconds:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
