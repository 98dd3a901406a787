"""Solve CartPole-v1 with the cross-entropy method on envmgr workers, then show the timers.

A linear policy (push right when ``obs @ w + b > 0``) is searched with the cross-entropy
method (CEM): every env plays whole episodes with its own parameter vector drawn from a
Gaussian; after each generation of finished episodes the Gaussian moves to the best fifth.
Numpy only. CartPole-v1 counts as solved when the mean return of the last 100 finished
episodes is >= 475 (the episodes played while learning, exploration noise included).

Run: python examples/train_cartpole.py [--budget-steps N] [--seed S] [--workers W]
                                       [--envs-per-worker E] [--out timers.json]
"""

import argparse
import json
import time
from collections import deque

import numpy as np

from envmgr import make, timers
from envmgr.timers.format import format_tree, worker_summary

try:
    from tqdm import tqdm
except ImportError:  # tqdm is optional: print a line every few seconds instead
    tqdm = None

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--budget-steps", type=int, default=1_000_000, help="max env steps")
parser.add_argument("--seed", type=int, default=0, help="seed for envs and the search")
parser.add_argument("--workers", type=int, default=2, help="worker processes")
parser.add_argument("--envs-per-worker", type=int, default=16, help="envs per worker")
parser.add_argument("--out", default="timers.json", help="where to write the timer tree")
args = parser.parse_args()

SOLVED_AT, WINDOW = 475.0, 100
ELITE_FRAC = 0.2
rng = np.random.default_rng(args.seed)
num_envs = args.workers * args.envs_per_worker
pop_size = max(num_envs, 32)  # finished episodes per CEM generation
n_elite = max(2, int(pop_size * ELITE_FRAC))

mean, std = np.zeros(5), np.ones(5)  # search distribution over (w0..w3, b)
timers.reset_timers()
start = time.perf_counter()
with make("CartPole-v1", num_envs, n_workers=args.workers) as envs:
    obs, _ = envs.reset(seed=args.seed)
    params = mean + std * rng.standard_normal((num_envs, 5))  # one candidate per env
    ep_return = np.zeros(num_envs)
    resetting = np.zeros(num_envs, dtype=bool)  # this step is an autoreset, not a transition
    recent: deque[float] = deque(maxlen=WINDOW)  # returns of the last 100 finished episodes
    gen_params, gen_returns = [], []
    episodes = env_steps = generation = 0
    solved = False
    bar = tqdm(total=args.budget_steps, unit="step", unit_scale=True) if tqdm else None
    last_print = start

    with timers.hierarchical_timer("training"):
        while env_steps < args.budget_steps and not solved:
            with timers.hierarchical_timer("policy"):
                logits = np.einsum("ij,ij->i", obs, params[:, :4]) + params[:, 4]
                actions = (logits > 0).astype(np.int64)
            with timers.hierarchical_timer("env_step"):
                obs, rewards, terminations, truncations, _ = envs.step(actions)

            with timers.hierarchical_timer("bookkeeping"):
                # Next-step autoreset: the step after an episode ends only resets that env
                # (reward 0, its action ignored); it is neither a transition nor an episode.
                real = ~resetting
                n_real = int(real.sum())
                env_steps += n_real
                ep_return += np.where(real, rewards, 0.0)
                finished = (terminations | truncations) & real
                for i in np.flatnonzero(finished):
                    gen_params.append(params[i].copy())
                    gen_returns.append(ep_return[i])
                    recent.append(float(ep_return[i]))
                    episodes += 1
                    ep_return[i] = 0.0
                    params[i] = mean + std * rng.standard_normal(5)  # next episode's candidate
                resetting = finished
                solved = len(recent) == WINDOW and float(np.mean(recent)) >= SOLVED_AT

            if len(gen_returns) >= pop_size:
                with timers.hierarchical_timer("cem_update"):
                    elite = np.argsort(gen_returns)[-n_elite:]
                    elite_params = np.asarray(gen_params)[elite]
                    # Extra noise that fades over the generations keeps the search from
                    # collapsing before it has found a policy that balances for 500 steps.
                    mean = elite_params.mean(axis=0)
                    std = elite_params.std(axis=0) + max(0.02, 0.3 * 0.85**generation)
                    generation += 1
                    timers.set_gauge(
                        "cem.elite_return", float(np.mean(np.asarray(gen_returns)[elite]))
                    )
                    timers.set_gauge("mean_return_last_100", float(np.mean(recent)))
                    gen_params, gen_returns = [], []

            mean100 = float(np.mean(recent)) if recent else 0.0
            if bar is not None:
                if finished.any():
                    bar.set_postfix(
                        gen=generation, episodes=episodes, mean100=f"{mean100:.1f}", refresh=False
                    )
                bar.update(n_real)
            elif time.perf_counter() - last_print > 2.0:
                last_print = time.perf_counter()
                print(
                    f"{env_steps:>9} steps  {episodes:>5} episodes  gen {generation:>3}  "
                    f"mean return (last {len(recent)}) {mean100:6.1f}",
                    flush=True,
                )
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - start
    if recent:
        timers.set_gauge("mean_return_last_100", float(np.mean(recent)))
    tree = timers.get_timer_tree()  # while the workers are alive: pulls in their timings

mean100 = float(np.mean(recent)) if recent else float("nan")
status = "SOLVED" if solved else "not solved within the budget"
print(
    f"\n{status}: CartPole-v1, mean return over the last {len(recent)} episodes = "
    f"{mean100:.1f} (target {SOLVED_AT:g})"
)
print(
    f"{episodes} episodes, {env_steps} env steps, {generation} CEM generations, "
    f"{wall:.1f} s wall, {env_steps / wall:,.0f} env-steps/s (SPS), "
    f"{num_envs} envs in {args.workers} worker processes"
)
print(f"policy: push right when obs @ {np.round(mean[:4], 3).tolist()} + {mean[4]:.3f} > 0\n")
print(format_tree(tree, min_share=0.005))
print()
print(worker_summary(tree))
with open(args.out, "w", encoding="utf-8") as f:
    json.dump(tree, f, indent=4)
print(f"\ntimer tree written to {args.out} (try: envmgr timers plot {args.out} -o timers.png)")
