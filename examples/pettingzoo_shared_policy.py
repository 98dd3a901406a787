"""Parameter sharing on a PettingZoo env: every agent is a row, one policy acts for all.

``make_parallel`` steps MPE2's ``simple_spread`` (3 agents) in worker processes and gives
each (env, agent) a row of one batch, so a single policy maps the whole observation array
to the whole action array. ``infos["active"]`` says which rows hold a live agent.
The policy here is a linear one improved by random search on the mean reward, numpy only.

Run: python examples/pettingzoo_shared_policy.py [--iterations N]
ENVMGR_EXAMPLE_TINY=1 runs two short iterations. Needs the multiagent extra.
"""

import argparse
import os

import numpy as np
from mpe2 import simple_spread_v3

import envmgr

TINY = os.environ.get("ENVMGR_EXAMPLE_TINY") == "1"
parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--iterations", type=int, default=2 if TINY else 30)
parser.add_argument("--steps", type=int, default=10 if TINY else 50, help="steps per rollout")
parser.add_argument("--num-envs", type=int, default=4 if TINY else 16)
args = parser.parse_args()


def env_fn():
    return simple_spread_v3.parallel_env(N=3, max_cycles=args.steps)


def rollout(envs, weights: np.ndarray, seed: int) -> float:
    """Mean reward per live agent-step of the shared linear policy ``weights``."""
    obs, infos = envs.reset(seed=seed)
    total, live = 0.0, 0
    for _ in range(args.steps):
        actions = np.argmax(obs @ weights, axis=1)  # one policy, every row
        obs, rewards, terms, truncs, infos = envs.step(actions)
        active = infos["active"]
        total += float(rewards[active].sum())
        live += int(active.sum())
    return total / max(live, 1)


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    with envmgr.make_parallel(env_fn, args.num_envs, n_workers=2) as envs:
        n_obs, n_actions = envs.single_observation_space.shape[0], envs.single_action_space.n
        shape = f"{args.num_envs} envs x 3 agents, {n_obs} obs, {n_actions} actions"
        print(f"{envs.num_envs} rows ({shape})")
        best = np.zeros((n_obs, n_actions))
        best_score = rollout(envs, best, seed=0)
        for i in range(args.iterations):
            candidate = best + 0.1 * rng.normal(size=best.shape)
            score = rollout(envs, candidate, seed=i + 1)
            if score > best_score:
                best, best_score = candidate, score
            print(f"iteration {i}: mean reward per agent-step {best_score:.3f}")
