"""Quick start: step CartPole in worker processes and print where the time went.

Run: python examples/quickstart.py [--steps N]
"""

import argparse

import gymnasium as gym

from envmgr import SubprocessEnvManager, timers
from envmgr.timers.format import format_tree

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=2000, help="batch steps to take")
args = parser.parse_args()

# One factory, called once per env; 2 worker processes x 8 envs each = 16 envs.
with SubprocessEnvManager(lambda: gym.make("CartPole-v1"), n_workers=2, envs_per_worker=8) as envs:
    obs, infos = envs.reset(seed=0)  # env i is seeded with 0 + i
    envs.action_space.seed(0)
    episodes = 0
    with timers.hierarchical_timer("training_loop"):
        for _ in range(args.steps):
            actions = envs.action_space.sample()  # your policy goes here
            with timers.hierarchical_timer("env_step"):
                obs, rewards, terminations, truncations, infos = envs.step(actions)
            episodes += int((terminations | truncations).sum())

    # Reading the tree pulls in every worker's timings first.
    tree = timers.get_timer_tree()

print(f"{args.steps} batch steps of {envs.num_envs} envs, {episodes} episodes finished")
print(format_tree(tree))
