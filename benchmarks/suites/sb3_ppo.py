#!/usr/bin/env python
"""PPO.learn through SB3's DummyVecEnv, SubprocVecEnv and envmgr's EnvmgrVecEnv, in one run.

Usage (from the repository root; needs ``pip install "envmgr[sb3]"``, and ``mujoco`` for
HalfCheetah)::

    python -m benchmarks.suites.sb3_ppo [--env CartPole-v1|HalfCheetah-v5] [--rounds 3] [--n-envs 8]
                                 [--steps 16384]
                                 [--configs dummy,subproc,envmgr,envmgr-1x8,...]
                                 [--torch-threads N] [--out PATH.json]

Each round builds every configuration in turn (the order rotates from round to
round), times ``PPO("MlpPolicy", env, seed=0, device="cpu").learn(steps)`` and
closes the env; env and model construction are timed separately and not counted.
A callback splits learn time into the rollout (env steps plus the policy's forward
passes: where the vector envs differ) and the rest (gradient steps: the same work
for every configuration, as the same seed gives the same data). Medians over
rounds are reported with min-max, and the ratios of the medians: of learn, of
rollout, and of "adjusted learn" (own rollout median plus the gradient-step median
over all runs), which keeps a busy machine's noise in the gradient steps out of
the comparison. The per-round learn ratios show how much the machine moved.

Configurations (``--configs``, comma-separated):

* ``dummy``: ``DummyVecEnv`` (all envs in this process).
* ``subproc``: ``SubprocVecEnv`` (one process per env, forkserver).
* ``envmgr``: ``EnvmgrVecEnv`` with its defaults (``min(n_envs, cpu_count)`` workers).
* ``envmgr-WxE``: ``W`` workers (``E`` envs each), e.g. ``envmgr-1x8``, ``envmgr-2x4``.
  Suffixes: ``-nocheck`` (``check_actions=False``), ``-pspin`` (the parent
  busy-polls for the workers: ``parent_spin_seconds=2e-3``), ``-nospin`` (workers
  block at once: ``spin_seconds=0``), ``-callerC`` (this process steps ``C`` of the envs
  itself: ``caller_envs=C``; then ``W x E + C`` is ``--n-envs``), e.g.
  ``envmgr-1x8-nocheck-pspin``, ``envmgr-1x4-caller4``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from time import perf_counter
from typing import Any

import gymnasium as gym
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv

from envmgr.integrations.sb3 import EnvmgrVecEnv

DEFAULT_CONFIGS = "dummy,subproc,envmgr,envmgr-1x8-nocheck"
#: ``--env`` choices: CartPole steps in microseconds and returns no infos; HalfCheetah's
#: MuJoCo step is tens of microseconds and returns four numeric infos every step.
ENV_IDS = ["CartPole-v1", "HalfCheetah-v5"]


def builder(config: str, n_envs: int, env_id: str = "CartPole-v1") -> Callable[[], VecEnv]:
    """A zero-argument constructor of the vector env named ``config``, stepping ``env_id``."""
    # A partial of gym.make pickles by reference: SubprocVecEnv's forkserver workers and
    # envmgr's workers rebuild it from its name.
    fns: list[Callable[[], gym.Env[Any, Any]]] = [functools.partial(gym.make, env_id)] * n_envs
    if config == "dummy":
        return lambda: DummyVecEnv(fns)
    if config == "subproc":
        return lambda: SubprocVecEnv(fns)
    if config == "envmgr":
        return lambda: EnvmgrVecEnv(fns)
    if not config.startswith("envmgr-"):
        raise SystemExit(f"unknown configuration {config!r}: see --help")
    kwargs: dict[str, Any] = {}
    parts = config.split("-")[1:]
    caller = sum(int(p[len("caller") :]) for p in parts if p.startswith("caller"))
    for part in parts:
        if "x" in part and part.replace("x", "").isdigit():
            workers, per = (int(p) for p in part.split("x"))
            if workers * per + caller != n_envs:
                raise SystemExit(
                    f"{config}: {workers} x {per} + {caller} caller envs is not --n-envs {n_envs}"
                )
            kwargs["n_workers"] = workers
        elif part.startswith("caller") and part[len("caller") :].isdigit():
            kwargs["caller_envs"] = caller
        elif part == "nocheck":
            kwargs["check_actions"] = _no_action_check()
        elif part == "pspin":
            kwargs["parent_spin_seconds"] = 2e-3
        elif part == "nospin":
            kwargs["spin_seconds"] = 0.0
        else:
            raise SystemExit(f"{config}: unknown part {part!r}: see --help")
    return lambda: EnvmgrVecEnv(fns, **kwargs)


def _no_action_check() -> Any:
    """``check_actions`` off: ``False``, or ``"off"`` where the manager takes modes."""
    import inspect

    from envmgr import SubprocessEnvManager

    default = inspect.signature(SubprocessEnvManager).parameters["check_actions"].default
    return "off" if isinstance(default, str) else False


class PhaseClock(BaseCallback):  # type: ignore[misc]
    """Seconds spent collecting rollouts (env steps and policy forward passes)."""

    def __init__(self) -> None:
        super().__init__()
        self.rollout = 0.0
        self._t0 = 0.0

    def _on_rollout_start(self) -> None:
        self._t0 = perf_counter()

    def _on_rollout_end(self) -> None:
        self.rollout += perf_counter() - self._t0

    def _on_step(self) -> bool:
        return True


def run_once(config: str, n_envs: int, steps: int, env_id: str) -> dict[str, float]:
    t0 = perf_counter()
    env = builder(config, n_envs, env_id)()
    try:
        model = PPO("MlpPolicy", env, seed=0, device="cpu")
        t1 = perf_counter()
        clock = PhaseClock()
        model.learn(steps, callback=clock)
        t2 = perf_counter()
    finally:
        env.close()
    return {"setup": t1 - t0, "learn": t2 - t1, "rollout": clock.rollout}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="CartPole-v1", choices=ENV_IDS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=16384)
    parser.add_argument("--configs", default=DEFAULT_CONFIGS)
    parser.add_argument(
        "--torch-threads", type=int, default=None, help="torch.set_num_threads (default: torch's)"
    )
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        builder(c, args.n_envs, args.env)  # fail on a bad name before anything runs

    print(
        f"PPO('MlpPolicy', {args.env}, seed=0).learn({args.steps}), {args.n_envs} envs, "
        f"{args.rounds} rounds; {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), Python {platform.python_version()}",
        flush=True,
    )
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    for r in range(args.rounds):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        for c in order:
            result = run_once(c, args.n_envs, args.steps, args.env)
            runs[c].append(result)
            print(
                f"  round {r + 1} {c:<28} learn {result['learn']:6.2f} s "
                f"(rollout {result['rollout']:5.2f} s), setup {result['setup']:5.2f} s",
                file=sys.stderr,
                flush=True,
            )

    def med(c: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[c])

    # The gradient steps are the same work in every configuration (same seed, same
    # data), so their spread is the machine's noise alone; "adjusted" adds their
    # median over all runs to each configuration's own rollout time.
    common_train = statistics.median(x["learn"] - x["rollout"] for c in configs for x in runs[c])

    def adjusted(c: str) -> float:
        return med(c, "rollout") + common_train

    print()
    print(
        "| vec env | learn s (median) | min-max | rollout s (median) | min-max "
        "| adjusted learn s | setup s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for c in configs:
        learn = [x["learn"] for x in runs[c]]
        roll = [x["rollout"] for x in runs[c]]
        print(
            f"| {c} | {med(c, 'learn'):.2f} | {min(learn):.2f}-{max(learn):.2f} | "
            f"{med(c, 'rollout'):.2f} | {min(roll):.2f}-{max(roll):.2f} | "
            f"{adjusted(c):.2f} | {med(c, 'setup'):.2f} |"
        )
    print(f"\n(adjusted learn = rollout median + {common_train:.2f} s, the median gradient-step")
    print(" time over all runs: the same work everywhere, so its spread is noise)")
    ratios: dict[str, dict[str, Any]] = {}
    print()
    for c in configs:
        if not c.startswith("envmgr"):
            continue
        for base in ("subproc", "dummy"):
            if base not in runs:
                continue
            per_round = [b["learn"] / e["learn"] for b, e in zip(runs[base], runs[c], strict=True)]
            entry = {
                "learn": med(base, "learn") / med(c, "learn"),
                "learn_per_round": per_round,
                "rollout": med(base, "rollout") / med(c, "rollout"),
                "adjusted_learn": adjusted(base) / adjusted(c),
            }
            ratios.setdefault(c, {})[base] = entry
            print(
                f"{c} vs {base}: {entry['learn']:.2f}x (learn), {entry['rollout']:.2f}x "
                f"(rollout), {entry['adjusted_learn']:.2f}x (adjusted learn); learn per round "
                + ", ".join(f"{x:.2f}" for x in per_round)
            )
    if args.out:
        from benchmarks._common.run_context import machine_info

        command = " ".join([f"python -m {__spec__.name}", *(argv or sys.argv[1:])])
        with open(args.out, "w") as f:
            payload = {"command": command, "started": started, "args": vars(args)}
            payload |= {"machine": machine_info(envpool_msg=""), "torch": torch.__version__}
            payload |= {"runs": runs, "common_train": common_train, "ratios": ratios}
            json.dump(payload, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
