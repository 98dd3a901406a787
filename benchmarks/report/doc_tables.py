"""The performance tables of README.md and docs/**/*.md, generated from benchmarks/results/.

A table sits in a document between a pair of markers::

    <!-- bench:NAME -->
    (generated: never edit by hand)
    <!-- /bench:NAME -->

Run from the repository root::

    python -m benchmarks.report.doc_tables --write    # regenerate every marked table
    python -m benchmarks.report.doc_tables --check    # exit 1 naming each table that differs
    python -m benchmarks.report.doc_tables --replot benchmarks/results/record/throughput.json
    python -m benchmarks.report.doc_tables --replot benchmarks/results/record/realenv/realenv.json

``--check`` (and the docs' tests) fails when a committed table differs from what its results
file gives, names a marker with no table, or a table with no marker. Every ratio is computed
from the recorded samples or rates::

    results file --> tables_*.py (each registers its tables in tables.TABLES on import)
                           |
    README.md, docs/**/*.md --> doc_tables.render: every marked block refilled from TABLES

Adding a table is one function in a ``tables_*`` module imported here and one marker pair::

    @table("atari")
    def atari() -> str:
        report = load_json(newest("atari.json"))
        return caption(...) + rows_as_markdown(...)

The throughput tables read the newest ``throughput.json`` under benchmarks/results/record/ (by its
``started_at``), so a newer full run shows up as a failing check until the docs are rewritten.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks._common.paths import REPO

# Each tables_* module registers its tables in TABLES when imported.
from benchmarks.report import (  # noqa: F401
    realenv_report,
    tables_costs,
    tables_multiagent,
    tables_outputs,
    tables_ray,
    tables_realenv,
    tables_sb3,
    tables_throughput,
    tables_timeline,
    tables_timers,
)
from benchmarks.report.plot import plot, plot_title
from benchmarks.report.tables import TABLES, load_json


def documents(root: Path = REPO) -> list[Path]:
    """README.md and every Markdown page of the docs site (docs/**/*.md, not its build)."""
    pages = (p for p in (root / "docs").rglob("*.md") if "_build" not in p.parts)
    return [root / "README.md", *sorted(pages)]


DOCS = documents()
# A block may be indented (a table inside a list item): its lines keep the opening marker's indent.
_BLOCK = re.compile(
    r"^(?P<indent>[ ]*)(?P<open><!-- bench:(?P<name>[\w-]+) -->\n)(?P<body>.*?)"
    r"^(?P=indent)(?P<close><!-- /bench:(?P=name) -->)",
    re.S | re.M,
)


def blocks(text: str) -> dict[str, str]:
    """The body of every marked block in ``text``, by name."""
    return {m["name"]: m["body"] for m in _BLOCK.finditer(text)}


def render(text: str) -> str:
    """``text`` with every marked block regenerated (``KeyError`` for a name with no table)."""

    def fill(m: re.Match[str]) -> str:
        name, indent = m["name"], m["indent"]
        if name not in TABLES:
            known = ", ".join(sorted(TABLES))
            raise KeyError(f"marker bench:{name} has no table (known: {known})")
        body = "".join(
            f"{indent}{line}" if line.strip() else line
            for line in TABLES[name]().rstrip().splitlines(keepends=True)
        )
        return f"{indent}{m['open']}{body}\n{indent}{m['close']}"

    return _BLOCK.sub(fill, text)


def problems(docs: list[Path], write: bool = False) -> list[str]:
    """What differs between ``docs`` and their generated tables (rewritten when ``write``)."""
    found: list[str] = []
    used: set[str] = set()
    for doc in docs:
        text = doc.read_text(encoding="utf-8")
        try:
            new = render(text)
        except KeyError as exc:
            found.append(f"{doc}: {exc.args[0]}")
            continue
        before, after = blocks(text), blocks(new)
        used |= set(after)
        if new != text:
            if write:
                doc.write_text(new, encoding="utf-8")
            else:
                stale = sorted(n for n in after if before.get(n) != after[n])
                found.append(f"{doc}: stale tables {', '.join(stale)}")
    found += [f"table {n} is in no document" for n in sorted(set(TABLES) - used)]
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """``--write`` or ``--check`` the documents' generated tables; returns the exit code."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the tables in place")
    mode.add_argument("--check", action="store_true", help="exit 1 if any table is stale")
    mode.add_argument(
        "--replot",
        type=Path,
        metavar="JSON",
        help="redraw the PNG beside a throughput.py JSON report from its samples (beside a "
        "realenv.json: realenv.png and the layout chart layouts.png)",
    )
    p.add_argument(
        "--docs",
        nargs="+",
        type=Path,
        default=DOCS,
        help="documents to read (default: README.md and docs/**/*.md)",
    )
    args = p.parse_args(argv)
    if args.replot is not None:
        report = load_json(args.replot)
        png = args.replot.with_suffix(".png")
        if args.replot.name == "realenv.json":
            realenv_report.plot(report, png)
            realenv_report.plot_layouts(report, png.with_name("layouts.png"))
            print(f"wrote {png} and {png.with_name('layouts.png')}")
            return 0
        plot(report["configs"], png, plot_title(report))
        print(f"wrote {png}")
        return 0
    found = problems(args.docs, write=args.write)
    for line in found:
        print(line, file=sys.stderr)
    if found:
        if args.check:
            print("run: python -m benchmarks.report.doc_tables --write", file=sys.stderr)
        return 1
    if args.write:
        print(f"tables regenerated in {len(args.docs)} documents")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
