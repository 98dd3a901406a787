"""The same batched stepping on Ray actors: RayEnvManager.

Without ``--address`` this starts a small local Ray (and stops it on close); with
``--address auto`` it joins the cluster ``ray start`` made. Each actor steps its share of
the envs; a batch step is one Ray call per actor.

Run: python examples/ray_cartpole.py [--address auto] [--steps N]
ENVMGR_EXAMPLE_TINY=1 runs a few steps. Needs the ray extra (pip install "envmgr[ray]").
"""

import argparse
import os
import time

import gymnasium as gym

from envmgr import RayEnvManager

TINY = os.environ.get("ENVMGR_EXAMPLE_TINY") == "1"
parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--address", default="local", help="a Ray address, or 'local'")
parser.add_argument("--steps", type=int, default=10 if TINY else 2_000)
parser.add_argument("--envs-per-actor", type=int, default=8 if TINY else 64)
args = parser.parse_args()

# A throw-away local Ray stays on this machine: a loopback address Ray keeps as it is,
# no dashboard, one CPU.
local = {"num_cpus": 1, "include_dashboard": False, "_node_ip_address": "127.0.0.2"}

if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with RayEnvManager(
        lambda: gym.make("CartPole-v1"),
        n_actors=1,
        envs_per_actor=args.envs_per_actor,
        num_cpus_per_actor=0.5,
        address=args.address,
        ray_init_kwargs={**local, "log_to_driver": False} if args.address == "local" else None,
    ) as envs:
        envs.reset(seed=0)
        start = time.perf_counter()
        for _ in range(args.steps):
            envs.step(envs.action_space.sample())
        rate = args.steps * envs.num_envs / (time.perf_counter() - start)
        print(f"{envs.num_envs} envs on Ray: {rate:,.0f} env-steps/s")
