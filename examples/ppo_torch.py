"""PPO on CartPole-v1 with PyTorch, the envs stepped by envmgr workers.

One file, top to bottom, in the style of CleanRL's single-file scripts: a shared-trunk MLP
for the policy and the value, generalized advantage estimation, the clipped objective. It
prints env-steps/s as it trains (rollouts and updates included) and the merged timer tree
at the end, where the workers' own time sits beneath the rollout.

Run: python examples/ppo_torch.py [--total-steps N] [--num-envs N] [--seed S]
ENVMGR_EXAMPLE_TINY=1 runs a few hundred steps (the tests' smoke run).
"""

import argparse
import os
import time

import numpy as np
import torch
from torch import nn

import envmgr
from envmgr import timers
from envmgr.timers.format import format_tree

TINY = os.environ.get("ENVMGR_EXAMPLE_TINY") == "1"
parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--total-steps", type=int, default=256 if TINY else 200_000)
parser.add_argument("--num-envs", type=int, default=8)
parser.add_argument("--rollout", type=int, default=16 if TINY else 128, help="steps per env")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

gamma, lam, clip, epochs, minibatches, lr = 0.99, 0.95, 0.2, 4, 4, 2.5e-4
torch.manual_seed(args.seed)
torch.set_num_threads(1)  # PyTorch's thread pool would spin against the workers


class Agent(nn.Module):
    def __init__(self, n_obs: int, n_actions: int) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(n_obs, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.pi = nn.Linear(64, n_actions)
        self.v = nn.Linear(64, 1)

    def act(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        h = self.trunk(obs)
        dist = torch.distributions.Categorical(logits=self.pi(h))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.v(h).squeeze(-1)


if __name__ == "__main__":
    with envmgr.make("CartPole-v1", num_envs=args.num_envs, n_workers=2) as envs:
        n, steps = args.num_envs, args.rollout
        agent = Agent(envs.single_observation_space.shape[0], envs.single_action_space.n)
        optim = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5)
        obs_buf = torch.zeros((steps, n, envs.single_observation_space.shape[0]))
        act_buf, logp_buf, rew_buf, done_buf, val_buf = (torch.zeros((steps, n)) for _ in range(5))

        obs_np, _ = envs.reset(seed=args.seed)
        obs, done = torch.as_tensor(obs_np), torch.zeros(n)
        returns, finished = np.zeros(n), []
        start, env_steps = time.perf_counter(), 0
        while env_steps < args.total_steps:
            with timers.hierarchical_timer("rollout"):
                for t in range(steps):
                    obs_buf[t], done_buf[t] = obs, done
                    with torch.no_grad():
                        action, logp, _, value = agent.act(obs)
                    act_buf[t], logp_buf[t], val_buf[t] = action, logp, value
                    with timers.hierarchical_timer("env_step"):
                        obs_np, reward, term, trunc, _ = envs.step(action.numpy())
                    # Next-step autoreset: the step after an episode ends is its env's reset,
                    # reward 0; `done` marks where one episode's returns stop.
                    rew_buf[t] = torch.as_tensor(reward, dtype=torch.float32)
                    returns += reward
                    ended = term | trunc
                    finished += list(returns[ended])
                    returns[ended] = 0.0
                    obs, done = torch.as_tensor(obs_np), torch.as_tensor(ended, dtype=torch.float32)
            env_steps += steps * n

            with timers.hierarchical_timer("update"):
                with torch.no_grad():
                    next_value = agent.act(obs)[3]
                adv, last = torch.zeros((steps, n)), torch.zeros(n)
                for t in reversed(range(steps)):
                    nxt = next_value if t == steps - 1 else val_buf[t + 1]
                    not_done = 1.0 - (done if t == steps - 1 else done_buf[t + 1])
                    delta = rew_buf[t] + gamma * nxt * not_done - val_buf[t]
                    last = delta + gamma * lam * not_done * last
                    adv[t] = last
                ret = adv + val_buf
                b_obs, b_act = obs_buf.reshape(steps * n, -1), act_buf.reshape(-1)
                b_logp, b_adv, b_ret = logp_buf.reshape(-1), adv.reshape(-1), ret.reshape(-1)
                for _ in range(epochs):
                    for mb in torch.randperm(steps * n).chunk(minibatches):
                        _, logp, entropy, value = agent.act(b_obs[mb], b_act[mb].long())
                        ratio = (logp - b_logp[mb]).exp()
                        a = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
                        pg = -torch.min(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a).mean()
                        loss = pg + 0.5 * ((value - b_ret[mb]) ** 2).mean() - 0.01 * entropy.mean()
                        optim.zero_grad()
                        loss.backward()
                        nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                        optim.step()

            recent = np.mean(finished[-20:]) if finished else float("nan")
            rate = env_steps / (time.perf_counter() - start)
            print(f"env steps {env_steps:>7}  env-steps/s {rate:>8,.0f}  mean return {recent:.1f}")

    print(format_tree(timers.get_timer_tree(), max_depth=4))
