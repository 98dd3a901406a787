"""``envmgr timers show|fold|plot|workers FILE``: read a timers.json and present it."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .common import (
    EXIT_OK,
    BadUsage,
    CommandError,
    fraction,
    non_negative_int,
    one_line,
)


def _load(path: str) -> dict[str, Any]:
    from envmgr.timers.format import TimerFileError, TimerTreeError, load_tree

    try:
        return load_tree(path)
    except TimerFileError as exc:  # a FILE argument that names nothing readable: usage
        raise BadUsage(one_line(exc)) from None
    except TimerTreeError as exc:
        raise CommandError(one_line(exc)) from None


def _write_text(text: str, out: str | None) -> None:
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise CommandError(f"cannot write {out}: {exc.strerror or exc}") from None


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
        raise CommandError(one_line(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    except ValueError as exc:  # e.g. an unknown image format, or a tree with no time in it
        raise CommandError(f"cannot plot {args.file} to {args.output}: {one_line(exc)}") from None
    print(f"icicle chart written to {args.output}")
    return EXIT_OK


def _timers_workers(args: argparse.Namespace) -> int:
    from envmgr.timers.format import worker_summary

    _write_text(worker_summary(_load(args.file)) + "\n", None)
    return EXIT_OK


_FILE_HELP = "a timers.json written by envmgr or ML-Agents ('-' reads standard input)"


def add_timers_parsers(sub: Any) -> None:
    """Add the ``timers`` command and its actions to the subcommands ``sub``."""
    timers_parser = sub.add_parser(
        "timers",
        help="read a timers.json: show it, fold it for flame graphs, plot it, summarise workers",
        description="Read a timer tree (a timers.json written by envmgr.timers or by Unity "
        "ML-Agents) and present it. Exit codes: 0 ok, 1 a file that is not a timer tree or an "
        "output that cannot be written, 2 usage error (an unreadable FILE included); errors "
        "are one line on stderr.",
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
        type=non_negative_int,
        default=None,
        metavar="N",
        help="print only down to depth N (root = 0)",
    )
    show.add_argument(
        "--min-share",
        type=fraction,
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
        type=non_negative_int,
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
