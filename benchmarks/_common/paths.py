"""Where the benchmarks sit in the checkout, and how a child process finds them.

A benchmark that measures in a fresh interpreter starts ``python -m benchmarks...``. The
child finds this package (and this checkout's envmgr) through ``PYTHONPATH``
(:func:`child_env`), or, to measure another checkout's envmgr with this checkout's code,
through a link in the directory it starts in (:func:`envmgr_from`)::

    parent --python -m benchmarks.X--> child
              PYTHONPATH: REPO, ...                      (child_env)
              cwd: TMP/benchmarks -> BENCHMARKS; PYTHONPATH: OTHER, ...   (envmgr_from)
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

#: The ``benchmarks`` package directory.
BENCHMARKS = Path(__file__).resolve().parents[1]
#: The checkout's root: ``python -m benchmarks...`` runs from here.
REPO = BENCHMARKS.parent
#: The committed results: ``record/`` (the runs the documents cite), ``repeats.csv`` and
#: ``experiments.md``.
RESULTS = BENCHMARKS / "results"
#: The runs README.md and docs/*.md cite; the report's tables read them.
RECORD = RESULTS / "record"


def _pythonpath_first(path: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(path), *filter(None, [env.get("PYTHONPATH")])])
    return env | dict(extra or {})


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the checkout first on ``PYTHONPATH`` (and ``extra``).

    A child (``python -m benchmarks...``, or a command a benchmark records) then finds this
    package and this checkout's envmgr from whatever directory it runs in.
    """
    return _pythonpath_first(REPO, extra)


@contextmanager
def envmgr_from(checkout: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """The directory and environment for a ``python -m benchmarks...`` child that imports
    this checkout's benchmarks and ``checkout``'s envmgr.

    ``checkout`` may hold another layout of ``benchmarks/``, or none: the child finds this
    package through a link in its working directory (first on a ``-m`` child's path) and
    envmgr through ``PYTHONPATH``. The directory lasts as long as the ``with`` block.
    """
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "benchmarks").symlink_to(BENCHMARKS, target_is_directory=True)
        yield Path(tmp), _pythonpath_first(checkout)
