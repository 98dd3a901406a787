"""Train Stable-Baselines3's PPO on CartPole-v1 through envmgr, then show where the time went.

The envs run in envmgr's worker processes behind ``EnvmgrVecEnv`` (the drop-in for
SB3's ``SubprocVecEnv``); training stops once the mean return of the last 100
episodes reaches 475, CartPole-v1's "solved" mark. The merged timer tree then shows
the learner (``train``: gradient steps; ``collect_rollouts``: the policy's forward
passes and SB3's bookkeeping) against the time the envs took, per worker.

Needs ``pip install "envmgr[sb3]"``.

Run: python examples/sb3_ppo.py [--max-steps N] [--seed S] [--n-envs 8] [--workers W]
                                [--out timers.json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecMonitor

from envmgr import timers
from envmgr.integrations.sb3 import EnvmgrVecEnv
from envmgr.timers.format import format_tree, worker_summary

SOLVED_AT, WINDOW = 475.0, 100


class TimeAndStop(BaseCallback):  # type: ignore[misc]
    """Times SB3's two phases as envmgr timer nodes; stops training once solved."""

    def __init__(self) -> None:
        super().__init__()
        self.solved = False
        self._open: timers.hierarchical_timer | None = None

    def _phase(self, name: str | None) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None
        if name is not None:
            self._open = timers.hierarchical_timer(name)
            self._open.__enter__()

    def _on_rollout_start(self) -> None:
        self._phase("collect_rollouts")

    def _on_rollout_end(self) -> None:
        self._phase("train")  # PPO's gradient steps follow each rollout

    def _on_training_end(self) -> None:
        self._phase(None)

    def _on_step(self) -> bool:
        if self.locals["dones"].any():
            returns = [ep["r"] for ep in self.model.ep_info_buffer]
            self.solved = len(returns) == WINDOW and float(np.mean(returns)) >= SOLVED_AT
            if self.solved:
                self._phase(None)  # SB3 skips on_rollout_end when a callback stops it
        return not self.solved


def make_env() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-steps", type=int, default=300_000, help="env step budget")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=None, help="default: min(envs, cores)")
    parser.add_argument("--out", default="timers.json", help="where to write the timer tree")
    args = parser.parse_args()

    timers.reset_timers()
    start = time.perf_counter()
    # The one envmgr line: SubprocVecEnv(...) -> EnvmgrVecEnv(...).
    venv = VecMonitor(EnvmgrVecEnv([make_env] * args.n_envs, n_workers=args.workers))
    try:
        # RL Zoo's tuned CartPole-v1 settings (linear schedules written out).
        model = PPO(
            "MlpPolicy",
            venv,
            n_steps=32,
            batch_size=256,
            gae_lambda=0.8,
            gamma=0.98,
            n_epochs=20,
            ent_coef=0.0,
            learning_rate=lambda progress: 1e-3 * progress,
            clip_range=lambda progress: 0.2 * progress,
            seed=args.seed,
            device="cpu",
        )
        callback = TimeAndStop()
        with timers.hierarchical_timer("learn"):
            model.learn(args.max_steps, callback=callback)
        tree = timers.get_timer_tree()  # while the workers are alive: pulls in their timings
        manager = venv.unwrapped.manager
        workers = manager.n_workers
    finally:
        venv.close()
    wall = time.perf_counter() - start

    returns = [ep["r"] for ep in model.ep_info_buffer]
    mean100 = float(np.mean(returns)) if returns else float("nan")
    status = "SOLVED" if callback.solved else "not solved within the budget"
    print(
        f"{status}: CartPole-v1 with PPO, mean return over the last {len(returns)} episodes "
        f"= {mean100:.1f} (target {SOLVED_AT:g})"
    )
    print(
        f"{model.num_timesteps} env steps in {wall:.1f} s wall "
        f"({model.num_timesteps / wall:,.0f} env-steps/s with the learner), "
        f"{args.n_envs} envs in {workers} worker processes\n"
    )
    print(format_tree(tree, min_share=0.005))
    print()
    print(worker_summary(tree))
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(tree, f, indent=4)
    print(f"\ntimer tree written to {args.out} (try: envmgr timers show {args.out})")


if __name__ == "__main__":
    main()
