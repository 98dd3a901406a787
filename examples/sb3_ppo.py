"""Train Stable-Baselines3's PPO through envmgr (CartPole-v1 or HalfCheetah-v5), then show
where the time went.

The envs run in envmgr's worker processes behind ``EnvmgrVecEnv`` (the drop-in for
SB3's ``SubprocVecEnv``). On CartPole-v1 training stops once the mean return of the last
100 episodes reaches 475, its "solved" mark; HalfCheetah-v5 has no mark PPO reaches in a
short run, so it trains for the whole budget (observations and rewards normalized by
``VecNormalize``, as is usual for MuJoCo) and reports its mean return. The merged timer
tree then shows the learner (``train``: gradient steps; ``collect_rollouts``: the
policy's forward passes and SB3's bookkeeping) against the time the envs took, per worker.

Needs ``pip install "envmgr[sb3]"``, and ``mujoco`` for HalfCheetah.

Run: python examples/sb3_ppo.py [--env CartPole-v1|HalfCheetah-v5] [--max-steps N] [--seed S]
                                [--n-envs 8] [--workers W] [--out timers.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv, VecMonitor, VecNormalize

from envmgr import timers
from envmgr.integrations.sb3 import EnvmgrVecEnv
from envmgr.timers.format import format_tree, worker_summary

WINDOW = 100


class TimeAndStop(BaseCallback):  # type: ignore[misc]
    """Times SB3's two phases as envmgr timer nodes; stops training once solved.

    Args:
        solved_at: Mean return over the last ``WINDOW`` episodes that ends training, or
            ``None`` to train for the whole budget.
    """

    def __init__(self, solved_at: float | None) -> None:
        super().__init__()
        self.solved_at = solved_at
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
        if self.solved_at is not None and self.locals["dones"].any():
            returns = [ep["r"] for ep in self.model.ep_info_buffer]
            self.solved = len(returns) == WINDOW and float(np.mean(returns)) >= self.solved_at
            if self.solved:
                self._phase(None)  # SB3 skips on_rollout_end when a callback stops it
        return not self.solved


def cartpole_model(venv: VecEnv, seed: int) -> PPO:
    """RL Zoo's tuned CartPole-v1 settings (linear schedules written out)."""
    return PPO(
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
        seed=seed,
        device="cpu",
    )


def mujoco_model(venv: VecEnv, seed: int) -> PPO:
    """The PPO paper's MuJoCo settings (SB3's defaults), its 2,048-step rollout split
    over the envs."""
    return PPO("MlpPolicy", venv, n_steps=max(1, 2048 // venv.num_envs), seed=seed, device="cpu")


#: env id -> (mean return that counts as solved or None, model builder, normalize, budget).
SETTINGS: dict[str, tuple[float | None, Any, bool, int]] = {
    "CartPole-v1": (475.0, cartpole_model, False, 300_000),
    "HalfCheetah-v5": (None, mujoco_model, True, 1_000_000),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="CartPole-v1", choices=list(SETTINGS))
    parser.add_argument(
        "--max-steps", type=int, default=None, help="env step budget (CartPole 300k, MuJoCo 1M)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=None, help="default: min(envs, cores)")
    parser.add_argument("--out", default="timers.json", help="where to write the timer tree")
    args = parser.parse_args()

    solved_at, build_model, normalize, budget = SETTINGS[args.env]
    timers.reset_timers()
    start = time.perf_counter()
    # The one envmgr line: SubprocVecEnv(...) -> EnvmgrVecEnv(...). (A partial of gym.make
    # reaches the workers by name.)
    make_env = functools.partial(gym.make, args.env)
    venv: VecEnv = VecMonitor(EnvmgrVecEnv([make_env] * args.n_envs, n_workers=args.workers))
    if normalize:
        venv = VecNormalize(venv)  # outside VecMonitor: episode returns stay unnormalized
    try:
        model = build_model(venv, args.seed)
        callback = TimeAndStop(solved_at)
        with timers.hierarchical_timer("learn"):
            model.learn(budget if args.max_steps is None else args.max_steps, callback=callback)
        tree = timers.get_timer_tree()  # while the workers are alive: pulls in their timings
        manager = venv.unwrapped.manager
        workers = manager.n_workers
    finally:
        venv.close()
    wall = time.perf_counter() - start

    returns = [ep["r"] for ep in model.ep_info_buffer]
    mean100 = float(np.mean(returns)) if returns else float("nan")
    if solved_at is None:
        status, target = "trained for the whole budget", ""
    else:
        status = "SOLVED" if callback.solved else "not solved within the budget"
        target = f" (target {solved_at:g})"
    print(
        f"{status}: {args.env} with PPO, mean return over the last {len(returns)} episodes "
        f"= {mean100:.1f}{target}"
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
