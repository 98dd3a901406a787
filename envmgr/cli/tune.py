"""``envmgr tune ENV_ID``: measure the layouts for an env and print the fastest call."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import (
    EXIT_OK,
    BadUsage,
    CommandError,
    one_line,
    positive_int,
    positive_seconds,
)


def _tune(args: argparse.Namespace) -> int:
    """Measure the layouts for ``args.env_id`` and print the table, the call and why."""
    import gymnasium as gym

    from envmgr.errors import EnvMgrError
    from envmgr.managers.make import resolve_spec
    from envmgr.tune import tune

    try:
        resolve_spec(args.env_id)  # an unknown id is a usage error, found before any process
    except gym.error.NamespaceNotFound as exc:
        # Gymnasium 1.x: a namespace exists once its package is imported (ale_py for ALE);
        # gym.make's "package:id" form imports it, and so does envmgr's.
        package = "ale_py" if args.env_id.startswith("ALE/") else "<package>"
        raise BadUsage(
            f"{args.env_id}: {one_line(exc)} Name the package that registers it, as "
            f"gym.make takes it: envmgr tune {package}:{args.env_id}"
        ) from None
    except (gym.error.Error, ImportError, AttributeError, ValueError) as exc:
        raise BadUsage(f"{args.env_id}: {one_line(exc)}") from None
    try:
        result = tune(
            args.env_id,
            num_envs=args.num_envs,
            seconds=args.seconds,
            rounds=args.rounds,
            log=lambda line: print(f"envmgr tune: {line}", file=sys.stderr, flush=True),
        )
    except EnvMgrError as exc:
        raise CommandError(f"cannot measure {args.env_id}: {one_line(exc)}") from None
    print(result.format())
    return EXIT_OK


def add_tune_parser(sub: Any) -> None:
    """Add the ``tune`` command and its options to the subcommands ``sub``."""
    tune = sub.add_parser(
        "tune",
        help="measure every layout for an env on this machine; print the fastest make() call",
        description="Measure the layouts that apply to ENV_ID on this machine (workers x envs "
        "per worker, step, first-ready send/recv, caller_envs, hosted vector envs) side by "
        "side with the ceiling (one process per core, no communication), in interleaved "
        "rounds. Print the table, the envmgr.make(...) call of the fastest, and why it wins, "
        "read from the merged timer tree.",
    )
    tune.add_argument("env_id", metavar="ENV_ID", help="gymnasium env id, e.g. CartPole-v1")
    tune.add_argument(
        "--num-envs",
        type=positive_int,
        default=8,
        metavar="N",
        help="envs in all (default: %(default)s)",
    )
    tune.add_argument(
        "--seconds",
        type=positive_seconds,
        default=50.0,
        metavar="S",
        help="stepping time in all, shared by every layout; start-up comes on top "
        "(default: %(default)s)",
    )
    tune.add_argument(
        "--rounds",
        type=positive_int,
        default=3,
        metavar="R",
        help="interleaved rounds; figures are medians over them (default: %(default)s)",
    )
    tune.set_defaults(func=_tune, parser=tune)
