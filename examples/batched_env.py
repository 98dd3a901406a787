"""A batched env of your own, hosted in 2 worker processes (CleanRL-style loop).

``RandomWalk`` steps all of its walkers with numpy at once: a
``gymnasium.vector.VectorEnv``. ``vector_fn`` builds one per worker for that
worker's share of the envs; each batch step is one ``step`` call per worker, and
the results land in shared memory with one copy per field.

Run: python examples/batched_env.py [--steps N] [--num-envs N]
"""

import argparse

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from envmgr import SubprocessEnvManager, timers
from envmgr.timers.format import format_tree


class RandomWalk(VectorEnv):
    """``num_envs`` walkers on a line: +-1 per step, done at +-10 (next-step autoreset)."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        self.single_observation_space = gym.spaces.Box(-10, 10, (1,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.pos = np.zeros(num_envs, np.float32)
        self.done = np.zeros(num_envs, bool)

    def reset(self, *, seed=None, options=None):
        self.pos[:] = 0
        self.done[:] = False
        return self.pos[:, None].copy(), {}

    def step(self, actions):
        self.pos[self.done] = 0  # next-step autoreset: finished walkers start again
        self.pos[~self.done] += np.where(actions[~self.done] == 1, 1.0, -1.0)
        terminated = np.abs(self.pos) >= 10
        reward = terminated.astype(np.float64) * ~self.done
        self.done = terminated & ~self.done
        return self.pos[:, None].copy(), reward, self.done.copy(), np.zeros_like(self.done), {}


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=2000, help="batch steps to take")
parser.add_argument("--num-envs", type=int, default=1024, help="walkers in all")
args = parser.parse_args()

with SubprocessEnvManager(vector_fn=RandomWalk, num_envs=args.num_envs, n_workers=2) as envs:
    obs, infos = envs.reset(seed=0)
    rng = np.random.default_rng(0)
    episodes = 0
    with timers.hierarchical_timer("training_loop"):
        for _ in range(args.steps):
            actions = rng.integers(0, 2, envs.num_envs)  # your policy goes here
            obs, rewards, terminations, truncations, infos = envs.step(actions)
            episodes += int(terminations.sum())
    tree = timers.get_timer_tree()

print(f"{args.steps} batch steps of {args.num_envs} envs, {episodes} episodes finished")
print(format_tree(tree))
