"""The ``envmgr`` command line (also ``python -m envmgr``).

Commands:

* ``envmgr demo`` - step an env in worker processes, print throughput and the merged timers.
* ``envmgr timers show|fold|plot|workers FILE`` - read a ``timers.json`` (ours or ML-Agents')
  and print it as a table, write folded stacks for flame-graph tools, draw an icicle chart,
  or summarise the worker processes (:mod:`envmgr.cli.timers`).
* ``envmgr bench`` - the throughput suite (``benchmarks/suites/throughput.py``, from a checkout).
* ``envmgr tune ENV_ID`` - measure the layouts for an env, print the fastest call
  (:mod:`envmgr.cli.tune`, :mod:`envmgr.tune`).

Exit codes: 0 success; 2 wrong usage - a bad option or value, an unknown env id, a FILE that
cannot be read - with one line on stderr; 1 a file that is not a timer tree, an output that
cannot be written, or a failed run, also with one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import (
    EXIT_BAD_FILE,
    EXIT_OK,
    EXIT_USAGE,
    BadUsage,
    CommandError,
    Parser,
    non_negative_int,
    one_line,
    positive_int,
    positive_seconds,
    usage_error,
)
from .timers import add_timers_parsers
from .tune import add_tune_parser

__all__ = ["main"]


# ------------------------------------------------------------------ demo


def _demo_env_spec(env_id: str) -> Any:
    """The spec of ``env_id``, or a usage error saying why there is none."""
    import gymnasium as gym

    from envmgr.managers.make import resolve_spec

    try:
        return resolve_spec(env_id)
    except (gym.error.Error, ImportError, AttributeError, ValueError) as exc:
        raise BadUsage(f"--env {env_id}: {one_line(exc)}") from None


def _demo(args: argparse.Namespace) -> int:
    from envmgr import timers
    from envmgr.errors import EnvMgrError
    from envmgr.managers.make import make
    from envmgr.timers.format import format_tree, worker_summary

    if args.timers_json:
        folder = os.path.dirname(os.path.abspath(args.timers_json))
        if not os.path.isdir(folder):  # found now, not after the run
            raise BadUsage(f"--json {args.timers_json}: no such directory {folder}")
    spec = _demo_env_spec(args.env)
    env_id = spec.id
    timers.reset_timers()
    try:
        per_worker = args.envs_per_worker or (1024 if args.vector else 16)
        envs = make(
            spec,
            args.workers * per_worker,
            n_workers=args.workers,
            vectorization_mode="vector_entry_point" if args.vector else None,
            vector_kwargs={"context": args.context},
        )
    except EnvMgrError as exc:
        raise CommandError(f"cannot start the workers: {one_line(exc)}") from None
    with envs:
        hosted = " (one batched env per worker)" if args.vector else ""
        print(
            f"{envs!r}: {envs.num_envs} x {env_id} in {envs.n_workers} worker processes"
            f"{hosted} (start method {envs.context}), stepping for {args.seconds:g} s ..."
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
    print(
        f"{steps} batch steps, {env_steps} env steps in {elapsed:.2f} s: "
        f"{env_steps / elapsed:,.0f} env-steps/s ({steps / elapsed:,.0f} batches/s)"
    )
    print()
    print(format_tree(tree, max_depth=args.depth))
    print()
    print(worker_summary(tree))
    if args.timers_json:
        import json

        try:
            with open(args.timers_json, "w", encoding="utf-8") as f:
                json.dump(tree, f, indent=4)
        except OSError as exc:
            raise CommandError(f"cannot write {args.timers_json}: {exc.strerror or exc}") from None
        print(f"\ntimer tree written to {args.timers_json}")
    return EXIT_OK


# ------------------------------------------------------------------ timers FILE


# ------------------------------------------------------------------ bench


BENCH_PROG = "envmgr bench"


def _bench_argv(extra: Sequence[str]) -> list[str]:
    """Return the throughput suite's arguments.

    The suite names itself ``envmgr bench`` (in usage, errors and the command it echoes) and, as
    by its own default, writes to the current directory unless ``--out`` says where, never into
    the checkout it runs from.
    """
    return ["--prog", BENCH_PROG, *extra]


def _bench(args: argparse.Namespace) -> int:
    """Run the source tree's throughput suite in a child interpreter; return its exit code.

    The suite is ``python -m benchmarks.suites.throughput``; the arguments are passed on.
    """
    import subprocess

    root = Path(__file__).resolve().parents[2]
    if not (root / "benchmarks" / "suites" / "throughput.py").is_file():
        raise CommandError(
            "the benchmark suite lives in the source tree (benchmarks/suites/throughput.py); "
            "install envmgr from a checkout (pip install -e .) to run it"
        )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    argv = [sys.executable, "-m", "benchmarks.suites.throughput"]
    suite = subprocess.Popen([*argv, *_bench_argv(getattr(args, "extra", []))], env=env)
    while True:
        try:
            return suite.wait()
        except KeyboardInterrupt:
            # The suite has the same Ctrl-C (one process group) and stops its own way.
            continue


# ------------------------------------------------------------------ tune


# ------------------------------------------------------------------ parser


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="envmgr",
        description="Vectorized gymnasium envs in worker processes, with merged timer trees.",
        epilog="Exit codes: 0 ok, 2 usage error (a bad option, env id or unreadable FILE), "
        "1 a file that is not a timer tree or a failed run; errors are one line on stderr.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="step real envs in worker processes; print throughput and the merged timer tree",
        description="Step an env in worker processes for a few seconds, then print env-steps/s, "
        "the merged timer tree of the parent and every worker, and a per-worker summary.",
    )
    demo.add_argument(
        "--env", default="CartPole-v1", help="gymnasium env id (default: %(default)s)"
    )
    demo.add_argument(
        "--workers", type=positive_int, default=2, help="worker processes (default: %(default)s)"
    )
    demo.add_argument(
        "--envs-per-worker",
        type=positive_int,
        default=None,
        help="envs per worker (default: 16, or 1024 with --vector)",
    )
    demo.add_argument(
        "--vector",
        action="store_true",
        help="host one batched env per worker (the id's vector entry point, e.g. CartPole's "
        "numpy-batched CartPoleVectorEnv) instead of single envs",
    )
    demo.add_argument(
        "--seconds",
        type=positive_seconds,
        default=3.0,
        help="how long to step (default: %(default)s)",
    )
    demo.add_argument(
        "--context",
        choices=["fork", "forkserver", "spawn"],
        default=None,
        help="start method (default: forkserver where available)",
    )
    demo.add_argument(
        "--depth", type=non_negative_int, default=None, help="print the tree only to this depth"
    )
    demo.add_argument(
        "--json",
        "--timers-json",
        dest="timers_json",
        metavar="PATH",
        help="also write the timer tree as JSON here (read it back with 'envmgr timers')",
    )
    demo.set_defaults(func=_demo, parser=demo)

    add_timers_parsers(sub)
    add_tune_parser(sub)

    bench = sub.add_parser(
        "bench",
        help="run the benchmark suite (benchmarks/suites/throughput.py) side by side with peers",
        description="Run benchmarks/suites/throughput.py: envmgr against the serial loop, "
        "Gymnasium's Sync/AsyncVectorEnv and EnvPool, with a progress bar; prints the "
        "table and writes JSON and a plot. Every further argument goes to the script "
        "(see `envmgr bench --help-suite`, or benchmarks/README.md).",
        add_help=False,
    )
    bench.add_argument("--help-suite", action="store_true", help=argparse.SUPPRESS)
    bench.set_defaults(func=_bench, parser=bench)
    return parser


def _shadowing_folder() -> str | None:
    """The folder imported as ``envmgr`` in place of the package, if one was.

    A directory named ``envmgr`` without an ``__init__.py`` (a clone of this repository,
    say) in the directory Python starts from is imported as a namespace package: it has a
    search path but no file of its own, and the package's modules cannot be found in it.
    """
    package = sys.modules.get("envmgr")
    if package is None or getattr(package, "__file__", None) is not None:
        return None
    return next(iter(getattr(package, "__path__", [])), "envmgr")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = _parser()
    try:
        args, extra = parser.parse_known_args(argv)
    except SystemExit as exc:  # --help (0), or a usage error already printed (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    command: argparse.ArgumentParser = getattr(args, "parser", parser)
    func = getattr(args, "func", None)
    if extra and func is not _bench:
        return usage_error(command, f"unrecognized arguments: {' '.join(extra)}")
    if func is None:
        # `envmgr` or `envmgr timers` without an action: name the choices.
        choices = "demo, timers, bench, tune" if command is parser else "show, fold, plot, workers"
        return usage_error(command, f"choose one of: {choices}")
    args.extra = extra
    if func is _bench and getattr(args, "help_suite", False):
        args.extra = ["--help", *extra]
    try:
        return int(func(args))
    except BadUsage as exc:
        return usage_error(command, str(exc))
    except CommandError as exc:
        print(f"envmgr: error: {exc}", file=sys.stderr)
        return EXIT_BAD_FILE
    except ImportError as exc:
        folder = _shadowing_folder()
        if folder is None:
            raise
        print(
            f"envmgr: error: {one_line(exc)}: the folder {folder} shadows the installed envmgr "
            "(Python imports a folder named envmgr in the current directory first); run from "
            "another directory",
            file=sys.stderr,
        )
        return EXIT_BAD_FILE
    except BrokenPipeError:
        # Output piped into `head` and the like: stop quietly, as other command line tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BAD_FILE


if __name__ == "__main__":
    raise SystemExit(main())
