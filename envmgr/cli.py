"""The ``envmgr`` command line (also ``python -m envmgr``)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    import gymnasium as gym

    from envmgr import SubprocessEnvManager, timers
    from envmgr.timer_format import format_tree

    env_id = args.env
    timers.reset_timers()
    with SubprocessEnvManager(
        lambda: gym.make(env_id),
        n_workers=args.workers,
        envs_per_worker=args.envs_per_worker,
        context=args.context,
    ) as envs:
        print(
            f"{envs!r}: {envs.num_envs} x {env_id} in {envs.n_workers} worker processes "
            f"(start method {envs.context}), stepping for {args.seconds:g} s ..."
        )
        envs.action_space.seed(0)
        steps = 0
        with timers.hierarchical_timer("training_loop"):
            with timers.hierarchical_timer("env_reset"):
                envs.reset(seed=0)
            start = time.perf_counter()
            while time.perf_counter() - start < args.seconds:
                with timers.hierarchical_timer("sample_actions"):
                    actions = envs.action_space.sample()
                with timers.hierarchical_timer("env_step"):
                    envs.step(actions)
                steps += 1
            elapsed = time.perf_counter() - start
        tree = timers.get_timer_tree()
    env_steps = steps * envs.num_envs
    print(f"{steps} batch steps, {env_steps} env steps in {elapsed:.2f} s: "
          f"{env_steps / elapsed:,.0f} env-steps/s ({steps / elapsed:,.0f} batches/s)")
    print()
    print(format_tree(tree, max_depth=args.depth))
    if args.timers_json:
        import json

        with open(args.timers_json, "w") as f:
            json.dump(tree, f, indent=4)
        print(f"\ntimer tree written to {args.timers_json}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="envmgr",
        description="Vectorized gymnasium envs in worker processes, with merged timer trees.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="step real envs in worker processes; print throughput and the merged timer tree",
        description="Step an env in worker processes for a few seconds, then print env-steps/s "
        "and the merged timer tree of the parent and every worker.",
    )
    demo.add_argument("--env", default="CartPole-v1", help="gymnasium env id (default: %(default)s)")
    demo.add_argument("--workers", type=int, default=2, help="worker processes (default: %(default)s)")
    demo.add_argument(
        "--envs-per-worker", type=int, default=16, help="envs per worker (default: %(default)s)"
    )
    demo.add_argument("--seconds", type=float, default=3.0, help="how long to step (default: %(default)s)")
    demo.add_argument(
        "--context", choices=["fork", "forkserver", "spawn"], default=None,
        help="start method (default: forkserver where available)",
    )
    demo.add_argument("--depth", type=int, default=None, help="print the tree only to this depth")
    demo.add_argument("--timers-json", metavar="PATH", help="also write the timer tree as JSON here")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
