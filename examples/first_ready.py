"""First-ready stepping: each worker gets its next actions as soon as its own envs are read.

``send(actions, env_ids)`` hands actions to the workers that own ``env_ids``; ``recv()``
returns the first workers to finish, with the ids of their envs. The policy below runs on
those rows only, while the other worker is still stepping.

Run: python examples/first_ready.py [--steps N]   (ENVMGR_EXAMPLE_TINY=1: a few steps)
"""

import argparse
import os
import time

import gymnasium as gym
import numpy as np

from envmgr import SubprocessEnvManager

TINY = os.environ.get("ENVMGR_EXAMPLE_TINY") == "1"
parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--steps", type=int, default=50 if TINY else 20_000, help="recv calls")
args = parser.parse_args()

weights = np.array([0.0, 0.0, 1.0, 1.0])  # push toward the way the pole falls


def policy(obs: np.ndarray) -> np.ndarray:
    return (obs @ weights > 0).astype(np.int64)


if __name__ == "__main__":
    with SubprocessEnvManager(
        lambda: gym.make("CartPole-v1"), n_workers=2, envs_per_worker=8
    ) as envs:
        obs, _ = envs.reset(seed=0)
        envs.send(policy(obs))  # every env at once
        rows, start = 0, time.perf_counter()
        for _ in range(args.steps):
            obs, rewards, terms, truncs, infos, env_ids = envs.recv()
            envs.send(policy(obs), env_ids)  # only the envs that just finished
            rows += len(env_ids)
        envs.recv()  # what is still in flight, before closing
        seconds = time.perf_counter() - start
    print(
        f"{rows} env steps through send/recv in {seconds:.2f} s: {rows / seconds:,.0f} env-steps/s"
    )
