"""``envmgr tune ENV_ID``: measure the layouts for an env and print the fastest call.

``envmgr tune --parallel module:factory`` does the same for a PettingZoo ``ParallelEnv``
factory and ``envmgr.make_parallel``.
"""

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
    from envmgr.errors import EnvMgrError
    from envmgr.tune import tune

    # A bad ENV_ID is a usage error, found before any process starts.
    if args.parallel:
        _check_factory(args.env_id)
    else:
        _check_env_id(args.env_id)
    try:
        result = tune(
            args.env_id,
            num_envs=args.num_envs,
            seconds=args.seconds,
            rounds=args.rounds,
            parallel=args.parallel,
            log=lambda line: print(f"envmgr tune: {line}", file=sys.stderr, flush=True),
        )
    except EnvMgrError as exc:
        raise CommandError(f"cannot measure {args.env_id}: {one_line(exc)}") from None
    print(result.format())
    return EXIT_OK


def _check_env_id(env_id: str) -> None:
    """A usage error unless ``env_id`` is registered."""
    import gymnasium as gym

    from envmgr.managers.make import resolve_spec

    try:
        resolve_spec(env_id)
    except gym.error.NamespaceNotFound as exc:
        # Gymnasium 1.x: a namespace exists once its package is imported (ale_py for ALE);
        # gym.make's "package:id" form imports it, and so does envmgr's.
        package = "ale_py" if env_id.startswith("ALE/") else "<package>"
        raise BadUsage(
            f"{env_id}: {one_line(exc)} Name the package that registers it, as "
            f"gym.make takes it: envmgr tune {package}:{env_id}"
        ) from None
    except (gym.error.Error, ImportError, AttributeError, ValueError) as exc:
        raise BadUsage(f"{env_id}: {one_line(exc)}") from None


def _check_factory(text: str) -> None:
    """A usage error unless ``text`` names a factory of ``ParallelEnv``s (one is built)."""
    from envmgr.tune.targets import ParallelEnvTarget

    try:
        ParallelEnvTarget(text, None)
    except ImportError as exc:
        raise BadUsage(f"--parallel {text}: cannot import it: {one_line(exc)}") from None
    except (ValueError, TypeError) as exc:
        raise BadUsage(f"--parallel {one_line(exc)}") from None


def add_tune_parser(sub: Any) -> None:
    """Add the ``tune`` command and its options to the subcommands ``sub``."""
    tune = sub.add_parser(
        "tune",
        help="measure every layout for an env on this machine; print the fastest make() call",
        description="Measure the layouts that apply to ENV_ID on this machine (workers x envs "
        "per worker, step, first-ready send/recv, caller_envs, hosted vector envs) side by "
        "side with the ceiling (one process per core, no communication), in interleaved "
        "rounds. Print the table, the envmgr.make(...) call of the fastest, and why it wins, "
        "read from the merged timer tree. With --parallel, ENV_ID is a PettingZoo "
        "ParallelEnv factory and the layouts are envmgr.make_parallel's.",
    )
    tune.add_argument(
        "env_id",
        metavar="ENV_ID",
        help="gymnasium env id, e.g. CartPole-v1; with --parallel, module:factory",
    )
    tune.add_argument(
        "--parallel",
        action="store_true",
        help="ENV_ID is a zero-argument factory of a PettingZoo ParallelEnv, as module:factory "
        "(e.g. mpe2.simple_spread_v3:parallel_env): tune envmgr.make_parallel, one batch row "
        "per agent",
    )
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
