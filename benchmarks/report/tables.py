"""The registry of the documents' generated tables, and what every table reads with.

A table is a function registered under a marker name with :func:`table`; ``doc_tables``
finds each ``<!-- bench:NAME -->`` block in the documents and fills it from ``TABLES``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common.paths import RECORD, REPO

#: Marker name -> the function writing its Markdown.
TABLES: dict[str, Callable[[], str]] = {}


def table(name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    """Register ``fn`` as the generator of the ``<!-- bench:name -->`` block."""

    def register(fn: Callable[[], str]) -> Callable[[], str]:
        if name in TABLES:
            raise ValueError(f"two tables named {name!r}")
        TABLES[name] = fn
        return fn

    return register


# ----------------------------------------------------------------- results files


def load_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def newest(file_name: str) -> Path:
    """The most recent full run's ``file_name`` under results/record/ (by ``started_at``)."""
    found = sorted(RECORD.rglob(file_name), key=lambda p: load_json(p).get("started_at", ""))
    if not found:
        raise FileNotFoundError(f"no {file_name} under {RECORD}")
    return found[-1]


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def public_command(command: str) -> str:
    """``command`` as a reader reruns it: without the ``--out`` folder of the run that made it.

    A recorded command names the scratch folder its run wrote to, a path on the machine that
    ran it; the caption names the record instead, and a rerun writes where its reader says.
    """
    return re.sub(r" --out \S+", "", command)


def caption(path: Path, report: dict[str, Any] | None = None, more: str = "") -> str:
    """Where a table's numbers come from: the file, and the run's command and date."""
    text = f"*From `{rel(path)}`"
    if report is not None:
        text += f" (`{public_command(report['command'])}`"
        text += f", {str(report.get('started_at', ''))[:10]})"
    return text + (f"; {more}" if more else "") + ".*\n\n"


def markdown(head: list[str], rows: list[list[str]], align: str) -> str:
    """A Markdown table; ``align`` has one letter per column, ``l`` or ``r``."""
    sep = ["---" if a == "l" else "---:" for a in align]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(sep) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
