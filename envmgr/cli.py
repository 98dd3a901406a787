"""The ``envmgr`` command line (also ``python -m envmgr``).

Commands:

* ``envmgr demo`` - step an env in worker processes, print throughput and the merged timers.
* ``envmgr timers show|fold|plot|workers FILE`` - read a ``timers.json`` (ours or ML-Agents')
  and print it as a table, write folded stacks for flame-graph tools, draw an icicle chart,
  or summarise the worker processes.

Exit codes: 0 success; 2 wrong usage - a bad option or value, an unknown env id, a FILE that
cannot be read - with one line on stderr; 1 a file that is not a timer tree, an output that
cannot be written, or a failed run, also with one line on stderr.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["main"]

EXIT_OK, EXIT_BAD_FILE, EXIT_USAGE = 0, 1, 2


class _CommandError(Exception):
    """A failure to report as one line on stderr with exit code 1."""


class _UsageError(Exception):
    """A usage error found after parsing (an unknown env id, an unreadable FILE): exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit code 2), without the usage block."""

    def error(self, message: str) -> NoReturn:
        _usage(self, message)
        raise SystemExit(EXIT_USAGE)


def _usage(parser: argparse.ArgumentParser, message: str) -> int:
    """Print a usage error as one line on stderr; returns the exit code for it."""
    print(
        f"{parser.prog}: error: {_one_line_text(message)} (see '{parser.prog} --help')",
        file=sys.stderr,
    )
    return EXIT_USAGE


def _one_line_text(text: str) -> str:
    return " ".join(text.split())


def _one_line(exc: BaseException) -> str:
    return _one_line_text(str(exc)) or type(exc).__name__


# ------------------------------------------------------------------ demo


def _demo_env_spec(env_id: str) -> Any:
    """The spec of ``env_id``, or a usage error saying why there is none."""
    import gymnasium as gym

    from envmgr.managers.make import _resolve_spec

    try:
        return _resolve_spec(env_id)
    except (gym.error.Error, ImportError, AttributeError, ValueError) as exc:
        raise _UsageError(f"--env {env_id}: {_one_line(exc)}") from None


def _demo(args: argparse.Namespace) -> int:
    from envmgr import timers
    from envmgr.errors import EnvMgrError
    from envmgr.managers.make import make
    from envmgr.timers.format import format_tree, worker_summary

    if args.timers_json:
        folder = os.path.dirname(os.path.abspath(args.timers_json))
        if not os.path.isdir(folder):  # found now, not after the run
            raise _UsageError(f"--json {args.timers_json}: no such directory {folder}")
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
        raise _CommandError(f"cannot start the workers: {_one_line(exc)}") from None
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
            raise _CommandError(f"cannot write {args.timers_json}: {exc.strerror or exc}") from None
        print(f"\ntimer tree written to {args.timers_json}")
    return EXIT_OK


# ------------------------------------------------------------------ timers FILE


def _load(path: str) -> dict[str, Any]:
    from envmgr.timers.format import TimerFileError, TimerTreeError, load_tree

    try:
        return load_tree(path)
    except TimerFileError as exc:  # a FILE argument that names nothing readable: usage
        raise _UsageError(_one_line(exc)) from None
    except TimerTreeError as exc:
        raise _CommandError(_one_line(exc)) from None


def _write_text(text: str, out: str | None) -> None:
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise _CommandError(f"cannot write {out}: {exc.strerror or exc}") from None


def _timers_show(args: argparse.Namespace) -> int:
    from envmgr.timers.format import format_tree

    tree = _load(args.file)
    _write_text(
        format_tree(tree, max_depth=args.depth, min_share=args.min_share, show_empty=args.all)
        + "\n",
        None,
    )
    return EXIT_OK


def _timers_fold(args: argparse.Namespace) -> int:
    from envmgr.timers.format import folded_stacks

    tree = _load(args.file)
    text = folded_stacks(tree, root_name=args.root_name, keep_worker_root=args.keep_worker_root)
    _write_text(text, args.output)
    if args.output is not None:
        n = text.count("\n")
        print(
            f"{n} folded stacks written to {args.output} (microseconds of self time); open it in "
            "https://www.speedscope.app or pipe it to flamegraph.pl / inferno-flamegraph"
        )
    return EXIT_OK


def _timers_plot(args: argparse.Namespace) -> int:
    from envmgr.timers.plot import plot_icicle

    tree = _load(args.file)
    try:
        plot_icicle(
            tree,
            args.output,
            title=args.title or f"{os.path.basename(args.file)}",
            max_depth=args.depth,
            keep_worker_root=args.keep_worker_root,
        )
    except ImportError as exc:
        raise _CommandError(_one_line(exc)) from None
    except OSError as exc:
        raise _CommandError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    except ValueError as exc:  # e.g. an unknown image format, or a tree with no time in it
        raise _CommandError(f"cannot plot {args.file} to {args.output}: {_one_line(exc)}") from None
    print(f"icicle chart written to {args.output}")
    return EXIT_OK


def _timers_workers(args: argparse.Namespace) -> int:
    from envmgr.timers.format import worker_summary

    _write_text(worker_summary(_load(args.file)) + "\n", None)
    return EXIT_OK


# ------------------------------------------------------------------ bench


BENCH_PROG = "envmgr bench"


def _bench_argv(extra: Sequence[str]) -> list[str]:
    """The suite's arguments: it names itself ``envmgr bench`` (in usage, errors and the
    command it echoes) and, as by its own default, writes to the current directory unless
    ``--out`` says where, never into the checkout it runs from."""
    return ["--prog", BENCH_PROG, *extra]


def _bench(args: argparse.Namespace) -> int:
    """Run benchmarks/throughput.py from the source tree, passing the arguments on."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "throughput.py"
    if not script.is_file():
        raise _CommandError(
            "the benchmark suite lives in the source tree (benchmarks/throughput.py); "
            "install envmgr from a checkout (pip install -e .) to run it"
        )
    import runpy

    saved = sys.argv
    sys.argv = [str(script), *_bench_argv(getattr(args, "extra", []))]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else EXIT_BAD_FILE)
    finally:
        sys.argv = saved
    return EXIT_OK


# ------------------------------------------------------------------ tune


def _tune(args: argparse.Namespace) -> int:
    """Measure the layouts for ``args.env_id`` and print the table, the call and why."""
    import gymnasium as gym

    from envmgr.errors import EnvMgrError
    from envmgr.managers.make import _resolve_spec
    from envmgr.tune import tune

    try:
        _resolve_spec(args.env_id)  # an unknown id is a usage error, found before any process
    except (gym.error.Error, ImportError, AttributeError, ValueError) as exc:
        raise _UsageError(f"{args.env_id}: {_one_line(exc)}") from None
    try:
        result = tune(
            args.env_id,
            num_envs=args.num_envs,
            seconds=args.seconds,
            rounds=args.rounds,
            log=lambda line: print(f"envmgr tune: {line}", file=sys.stderr, flush=True),
        )
    except EnvMgrError as exc:
        raise _CommandError(f"cannot measure {args.env_id}: {_one_line(exc)}") from None
    print(result.format())
    return EXIT_OK


def _add_tune_parser(sub: Any) -> None:
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
        type=_positive_int,
        default=8,
        metavar="N",
        help="envs in all (default: %(default)s)",
    )
    tune.add_argument(
        "--seconds",
        type=_positive_seconds,
        default=50.0,
        metavar="S",
        help="stepping time in all, shared by every layout; start-up comes on top "
        "(default: %(default)s)",
    )
    tune.add_argument(
        "--rounds",
        type=_positive_int,
        default=3,
        metavar="R",
        help="interleaved rounds; figures are medians over them (default: %(default)s)",
    )
    tune.set_defaults(func=_tune, parser=tune)


# ------------------------------------------------------------------ parser


def _whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


_positive_int = _whole_number(1)
_non_negative_int = _whole_number(0)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds like 2.5, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction like 0.01, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, 1), got {value}")
    return value


_FILE_HELP = "a timers.json written by envmgr or ML-Agents ('-' reads standard input)"


def _add_timers_parsers(sub: Any) -> None:
    timers_parser = sub.add_parser(
        "timers",
        help="read a timers.json: show it, fold it for flame graphs, plot it, summarise workers",
        description="Read a timer tree (a timers.json written by envmgr.timers or by Unity "
        "ML-Agents) and present it. Exit codes: 0 ok, 1 unreadable file or not a timer tree "
        "(one line on stderr), 2 usage error.",
    )
    timers_parser.set_defaults(func=None, parser=timers_parser)
    tsub = timers_parser.add_subparsers(dest="timers_command", metavar="ACTION")

    show = tsub.add_parser(
        "show",
        help="print the tree as a table (total, count, self, %% of parent, per call) and gauges",
        description="Print the timer tree as an indented table: total, call count, self time, "
        "share of the parent and mean per call; parallel (worker) timers are marked ||. The "
        "root's gauges follow.",
    )
    show.add_argument("file", metavar="FILE", help=_FILE_HELP)
    show.add_argument(
        "--depth",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="print only down to depth N (root = 0)",
    )
    show.add_argument(
        "--min-share",
        type=_fraction,
        default=None,
        metavar="F",
        help="fold children below this fraction of their parent (e.g. 0.01) into one line",
    )
    show.add_argument("--all", action="store_true", help="also list timers that were never entered")
    show.set_defaults(func=_timers_show, parser=show)

    fold = tsub.add_parser(
        "fold",
        help="write folded stacks (self time per path, µs) for speedscope / flamegraph.pl",
        description="Write one 'a;b;c <microseconds>' line per timer path with its self time: "
        "the folded-stacks format read by speedscope, flamegraph.pl and inferno. worker_root is "
        "left out where worker_<i> timers exist (it is their sum).",
    )
    fold.add_argument("file", metavar="FILE", help=_FILE_HELP)
    fold.add_argument(
        "-o", "--output", metavar="OUT", default=None, help="write here instead of stdout"
    )
    fold.add_argument(
        "--root-name", metavar="NAME", default=None, help="name of the outermost frame"
    )
    fold.add_argument(
        "--keep-worker-root",
        action="store_true",
        help="also emit worker_root (counts every worker's time twice)",
    )
    fold.set_defaults(func=_timers_fold, parser=fold)

    plot = tsub.add_parser(
        "plot",
        help="draw an icicle (flame) chart as a PNG (needs matplotlib: envmgr[plot])",
        description="Draw the timer tree as an icicle chart: the root spans the width, children "
        "sit below their parent, as wide as their time. Worker timers are blue; where they add "
        "up to more than their parent they are shrunk to fit, labels keep the real totals. "
        'Needs matplotlib: pip install "envmgr[plot]".',
    )
    plot.add_argument("file", metavar="FILE", help=_FILE_HELP)
    plot.add_argument(
        "-o",
        "--output",
        metavar="OUT.png",
        required=True,
        help="image to write; the extension picks the format (.png, .svg, .pdf)",
    )
    plot.add_argument("--title", default=None, help="chart title (default: the file name)")
    plot.add_argument(
        "--depth",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="draw rows down to depth N only",
    )
    plot.add_argument(
        "--keep-worker-root", action="store_true", help="draw worker_root beside worker_<i>"
    )
    plot.set_defaults(func=_timers_plot, parser=plot)

    workers = tsub.add_parser(
        "workers",
        help="per-worker time: env calls vs waiting vs transfer, and the straggler",
        description="Summarise each worker_<i> found in the tree: time in env calls, waiting "
        "for commands, and moving results (send_response plus the self time of step/reset), "
        "then name the worker with the most env time against the median.",
    )
    workers.add_argument("file", metavar="FILE", help=_FILE_HELP)
    workers.set_defaults(func=_timers_workers, parser=workers)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
        "--workers", type=_positive_int, default=2, help="worker processes (default: %(default)s)"
    )
    demo.add_argument(
        "--envs-per-worker",
        type=_positive_int,
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
        type=_positive_seconds,
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
        "--depth", type=_non_negative_int, default=None, help="print the tree only to this depth"
    )
    demo.add_argument(
        "--json",
        "--timers-json",
        dest="timers_json",
        metavar="PATH",
        help="also write the timer tree as JSON here (read it back with 'envmgr timers')",
    )
    demo.set_defaults(func=_demo, parser=demo)

    _add_timers_parsers(sub)
    _add_tune_parser(sub)

    bench = sub.add_parser(
        "bench",
        help="run the benchmark suite (benchmarks/throughput.py) side by side with peers",
        description="Run benchmarks/throughput.py: envmgr against the serial loop, "
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
        return _usage(command, f"unrecognized arguments: {' '.join(extra)}")
    if func is None:
        # `envmgr` or `envmgr timers` without an action: name the choices.
        choices = "demo, timers, bench" if command is parser else "show, fold, plot, workers"
        return _usage(command, f"choose one of: {choices}")
    args.extra = extra
    if func is _bench and getattr(args, "help_suite", False):
        args.extra = ["--help", *extra]
    try:
        return int(func(args))
    except _UsageError as exc:
        return _usage(command, str(exc))
    except _CommandError as exc:
        print(f"envmgr: error: {exc}", file=sys.stderr)
        return EXIT_BAD_FILE
    except ImportError as exc:
        folder = _shadowing_folder()
        if folder is None:
            raise
        print(
            f"envmgr: error: {_one_line(exc)}: the folder {folder} shadows the installed envmgr "
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
