"""One measurement in a fresh interpreter: the suite's module run again with ``--child``.

Nothing one measurement leaves behind (threads, forkservers, a warm allocator, a Ray
instance) can slow or speed the next. The parent hands the child its spec as JSON and
reads the sample back from a file::

    parent: run_child(module, spec, limit)
      -> python -m MODULE --child SPEC --child-out TMP/sample.json   (own process group,
                                                                      cwd TMP, child_env)
    child:  child_main(measure, spec, out) -> measure(spec) -> sample.json
      <- the sample, or {"error": why} (an exception, a signal, the time limit)

The child leads its own process group, so whatever it leaves behind (a peer's workers
after a crash, a Ray it started) is killed with it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from time import perf_counter
from typing import Any

from benchmarks._common.paths import child_env

__all__ = ["child_main", "describe_exit", "parse_suite_args", "run_child", "suite_main"]


def describe_exit(code: int) -> str:
    """``exit 1`` or ``killed by SIGSEGV``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def run_child(module: str, spec: dict[str, Any], limit: float) -> dict[str, Any]:
    """``python -m module --child SPEC`` in a fresh interpreter; its sample (with
    ``child_wall_seconds``), or ``{"error": why}``.

    Args:
        module: The suite's module name (``__spec__.name``).
        spec: What to measure, as JSON; the child's ``measure`` reads it.
        limit: Seconds the child may take before it and its process group are killed.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sample.json"
        cmd = [sys.executable, "-m", module, "--child", json.dumps(spec), "--child-out", str(out)]
        # cwd: whatever a child writes into its working directory (MuJoCo's log, say)
        # goes with tmp.
        proc = subprocess.Popen(
            cmd,
            cwd=tmp,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        t0 = perf_counter()
        try:
            _, stderr = proc.communicate(timeout=limit)
            error = None
        except subprocess.TimeoutExpired:
            error = f"no result within {limit:.0f} s"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if proc.returncode is None:
                _, stderr = proc.communicate()
        wall = perf_counter() - t0
        if error is not None:
            return {"error": error}
        if not out.exists():
            tail = " | ".join((stderr or "").strip().splitlines()[-2:])
            return {"error": f"{describe_exit(proc.returncode)}: {tail}".rstrip(": ")}
        sample: dict[str, Any] = json.loads(out.read_text())
    sample["child_wall_seconds"] = wall
    return sample


def child_main(
    measure: Callable[[dict[str, Any]], dict[str, Any]], spec: dict[str, Any], out: Path
) -> int:
    """``measure(spec)`` into ``out``; an exception is the sample's ``error`` (its first
    line) and ``traceback``."""
    try:
        sample = measure(spec)
    except Exception as exc:
        text = traceback.format_exc()
        sample = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300], "traceback": text}
    out.write_text(json.dumps(sample, default=float))
    return 0


def suite_main(
    args: Any,
    stem: str,
    measure: Callable[[dict[str, Any]], dict[str, Any]],
    run: Callable[[Any, Callable[[dict[str, Any]], None]], dict[str, Any]],
    tables: Callable[[dict[str, Any]], str],
) -> int:
    """A suite's command: one measurement when run as a child, else the run and its report.

    ``args`` has ``child``, ``child_out``, ``quick`` and ``out``; the report is saved as it
    grows (``<out>/<stem>.json``, or ``quick.json``), then as text beside it.
    """
    if args.child is not None:
        return child_main(measure, json.loads(args.child), args.child_out)
    args.out.mkdir(parents=True, exist_ok=True)
    out_json = args.out / f"{'quick' if args.quick else stem}.json"

    def save(report: dict[str, Any]) -> None:
        out_json.write_text(json.dumps(report, indent=1, default=str))

    text = tables(run(args, save))
    out_json.with_suffix(".txt").write_text(text)
    print(text)
    print(f"wrote {out_json} and {out_json.with_suffix('.txt')}")
    return 0


def parse_suite_args(
    p: argparse.ArgumentParser, argv: Sequence[str] | None, quick: dict[str, Any]
) -> argparse.Namespace:
    """Parse a suite's command line, with the flags :func:`run_child` passes a child.

    ``args.argv`` keeps the words given (for the report's command); ``--quick`` sets the
    options in ``quick`` that were not given.
    """
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-out", type=Path, default=None, help=argparse.SUPPRESS)
    raw = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(raw)
    args.argv = raw
    if args.child is None and args.quick:
        given = {a.split("=")[0] for a in raw}
        for name, value in quick.items():
            if "--" + name not in given:
                setattr(args, name, value)
    return args
