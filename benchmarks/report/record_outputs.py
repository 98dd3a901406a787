#!/usr/bin/env python
"""Run the commands README.md quotes and record what they printed, for its generated passages.

README.md shows what a few commands print or measure: the demo's output, the soak test's
summary, the two examples' training results, the size of a full install, and three small
costs the prose quotes (the action check, a syscall, a Ray call). None of those numbers is
typed by hand: this script runs each command in a subprocess, exactly as the
README shows it (plus, where a command writes a file, an option sending that file to a
scratch directory), and writes ``benchmarks/results/record/outputs/<name>.json`` with the
command, the date, the machine (``run_context.machine_info``), the load average, the git
commit (and any uncommitted change outside benchmarks/results/) and the captured output
with the numbers parsed from it. ``tables_outputs.py`` renders those records into the
README's marked blocks.

Usage (from the repository root, with this checkout's envmgr importable)::

    python -m benchmarks.report.record_outputs demo        # python -m envmgr demo (3 s)
    python -m benchmarks.report.record_outputs soak        # benchmarks.probes.soak, twice
    python -m benchmarks.report.record_outputs examples    # examples/sb3_ppo.py, train_cartpole.py
    python -m benchmarks.report.record_outputs install-size --venv .ci-venv
    python -m benchmarks.report.record_outputs check-cost  # benchmarks.probes.check_cost
    python -m benchmarks.report.record_outputs syscall     # benchmarks.probes.syscall_cost
    python -m benchmarks.report.record_outputs ray-call    # benchmarks.probes.ray_call (Ray)
    python -m benchmarks.report.record_outputs all         # all of them, minutes on 2 cores
    python -m benchmarks.report.doc_tables --write         # then put them into README.md

``--out DIR`` (before the subcommand) writes the records elsewhere; a smaller run (say
``soak --steps 300000``) records the smaller command, and the README then shows that one.
Every child runs with this checkout first on ``PYTHONPATH``, and PyTorch on one thread
(``OMP_NUM_THREADS=1``, shown in the command where it matters).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks._common.paths import RECORD, REPO, child_env

OUTPUTS = RECORD / "outputs"

#: Seeds ``examples`` runs train_cartpole.py with beyond ``--seed 0`` (how the seed moves it).
CEM_SEEDS = (1, 2, 3, 4, 5, 6)


# ------------------------------------------------------------------ running a command


def command_text(shown: Sequence[str], env: dict[str, str] | None = None) -> str:
    """The command as the README shows it: ``VAR=value python ARGS``."""
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    return prefix + "python " + shlex.join(shown)


def run(
    shown: Sequence[str],
    plumbing: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout: float = 900,
) -> dict[str, Any]:
    """Run ``python SHOWN PLUMBING`` from the repository root and return what happened.

    Args:
        shown: The arguments after ``python`` that the README shows.
        plumbing: Arguments appended to send a file the command writes to a scratch
            directory (recorded in ``argv``, left out of ``command``).
        env: Environment variables that are part of the shown command.
        timeout: Seconds before the run is abandoned (``subprocess.TimeoutExpired``).

    Returns:
        ``command`` (as shown), ``argv`` (as run, ``python`` for this interpreter),
        ``env``, ``returncode``, ``seconds`` (wall), ``stdout`` and the tail of ``stderr``.
    """
    env = env or {}
    print(f"$ {command_text(shown, env)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *shown, *plumbing],
        cwd=REPO,
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        print(f"  exit code {proc.returncode}\n{proc.stderr[-3000:]}", file=sys.stderr)
    return {
        "command": command_text(shown, env),
        "argv": ["python", *shown, *plumbing],
        "env": env,
        "returncode": proc.returncode,
        "seconds": round(seconds, 2),
        "stdout": proc.stdout,
        "stderr_tail": proc.stderr[-2000:],
    }


def envmgr_imported_from() -> str:
    """Where a child process imports envmgr from (this checkout, if all is well)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import envmgr; print(envmgr.__file__)"],
        cwd=REPO,
        env=child_env({}),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout.strip()


def source_changes() -> list[str] | None:
    """``git status --porcelain`` of the checkout outside benchmarks/results/ (``None``: no git).

    ``machine_info``'s ``git_dirty`` counts the records written earlier in the same
    recording as changes; this says whether the code that ran differs from the commit.
    """
    try:
        proc = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", ":(exclude)benchmarks/results"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.splitlines()


def record(name: str, out: Path, runs: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    """Write ``out/<name>.json``: the runs, with when, where and at which commit they ran."""
    from benchmarks._common.run_context import machine_info

    report = {
        "name": name,
        "started_at": more.pop("started_at"),
        "load_average_at_start": more.pop("load_average"),
        "machine": machine_info(envpool_msg="not used"),
        "source_changes": source_changes(),
        "envmgr_imported_from": envmgr_imported_from(),
        "runs": runs,
        **more,
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return report


def start(*rerun: str) -> dict[str, Any]:
    """When a recording starts, how busy the machine was (1, 5, 15 min load average), and
    the command that records it again (``record_outputs.py`` with ``rerun``)."""
    return {
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "rerun": f"python -m {__spec__.name} " + shlex.join(rerun),
    }


def failed(runs: list[dict[str, Any]]) -> bool:
    return any(r["returncode"] != 0 for r in runs)


# ------------------------------------------------------------------ demo


def parse_demo(stdout: str) -> dict[str, Any]:
    """The demo's summary line: batch steps, env steps, seconds and env-steps/s."""
    m = re.search(
        r"^(\d+) batch steps, (\d+) env steps in ([\d.]+) s: ([\d,]+) env-steps/s", stdout, re.M
    )
    if m is None:
        raise ValueError("no summary line in the demo's output")
    return {
        "batch_steps": int(m[1]),
        "env_steps": int(m[2]),
        "seconds": float(m[3]),
        "env_steps_per_second": int(m[4].replace(",", "")),
    }


def cmd_demo(args: argparse.Namespace) -> int:
    """``python -m envmgr demo``: its whole printed output."""
    shown = ["-m", "envmgr", "demo"]
    if args.seconds is not None:
        shown += ["--seconds", f"{args.seconds:g}"]
    when = start("demo", *shown[3:])
    r = run(shown)
    if r["returncode"] == 0:
        r["parsed"] = parse_demo(r["stdout"])
    record("demo", args.out, [r], **when)
    return 1 if failed([r]) else 0


# ------------------------------------------------------------------ soak


def soak_run(steps: int, kill_every: float, context: str | None) -> dict[str, Any]:
    """One ``benchmarks.probes.soak`` run; its JSON summary goes under ``parsed``."""
    shown = ["-m", "benchmarks.probes.soak", "--steps", str(steps)]
    shown += ["--kill-every", f"{kill_every:g}"]
    if context is not None:
        shown += ["--context", context]
    return json_run(shown)


def cmd_soak(args: argparse.Namespace) -> int:
    """``benchmarks.probes.soak`` at the default start method, then under fork with more kills."""
    when = start(
        "soak",
        *("--steps", str(args.steps), "--kill-every", f"{args.kill_every:g}"),
        *("--fork-kill-every", f"{args.fork_kill_every:g}"),
    )
    runs = [soak_run(args.steps, args.kill_every, None)]
    if args.fork_kill_every > 0:
        runs.append(soak_run(args.steps, args.fork_kill_every, "fork"))
    record("soak", args.out, runs, **when)
    return 1 if failed(runs) else 0


# ------------------------------------------------------------------ small costs


def json_run(shown: list[str]) -> dict[str, Any]:
    """Run a benchmark script that writes its result with ``--json``; it goes under ``parsed``."""
    with tempfile.TemporaryDirectory() as scratch:
        result = Path(scratch) / "result.json"
        r = run(shown, plumbing=["--json", str(result)])
        if result.exists():
            r["parsed"] = json.loads(result.read_text(encoding="utf-8"))
    return r


def cmd_cost(args: argparse.Namespace) -> int:
    """One of the small-cost scripts (``COST_SCRIPTS``), recorded under its own name."""
    name, script, names = COST_SCRIPTS[args.what]
    options: list[str] = []
    for k in names:
        if getattr(args, k) is not None:
            options += [f"--{k}", str(getattr(args, k))]
    when = start(args.what, *options)
    r = json_run(["-m", script, *options])
    record(name, args.out, [r], **when)
    return 1 if failed([r]) else 0


#: Subcommand -> (record name, the module it runs, the module's options it passes on).
COST_SCRIPTS = {
    "check-cost": ("check_cost", "benchmarks.probes.check_cost", ("rounds", "number")),
    "syscall": ("syscall_cost", "benchmarks.probes.syscall_cost", ("rounds", "number")),
    "ray-call": ("ray_call", "benchmarks.probes.ray_call", ("rounds", "calls", "warmup")),
}


# ------------------------------------------------------------------ examples

_RESULT = re.compile(
    r"^(?P<status>SOLVED|not solved within the budget|trained for the whole budget): .*?"
    r"mean return over the last (?P<window>\d+) episodes = (?P<mean>[-\d.na]+)",
    re.M,
)


def _result(stdout: str) -> dict[str, Any]:
    m = _RESULT.search(stdout)
    if m is None:
        raise ValueError("no result line in the example's output")
    return {
        "solved": m["status"] == "SOLVED",
        "status": m["status"],
        "episodes_in_mean": int(m["window"]),
        "mean_return": float(m["mean"]),
    }


def _numbers(pattern: str, stdout: str, missing: str) -> dict[str, Any]:
    """The named groups of ``pattern``'s first match (a line) in ``stdout``, as numbers:
    ``wall_seconds`` a float, the rest ints with their thousands separators dropped."""
    m = re.search(pattern, stdout, re.M)
    if m is None:
        raise ValueError(missing)
    return {
        k: float(v) if k == "wall_seconds" else int(v.replace(",", ""))
        for k, v in m.groupdict().items()
    }


def parse_sb3(stdout: str) -> dict[str, Any]:
    """examples/sb3_ppo.py: solved or not, mean return, env steps, wall time, envs, workers."""
    line = (
        r"^(?P<env_steps>\d+) env steps in (?P<wall_seconds>[\d.]+) s wall "
        r"\((?P<env_steps_per_second>[\d,]+) env-steps/s with the learner\), "
        r"(?P<n_envs>\d+) envs in (?P<n_workers>\d+) worker processes"
    )
    return _result(stdout) | _numbers(line, stdout, "no env-steps line in sb3_ppo.py's output")


def parse_cem(stdout: str) -> dict[str, Any]:
    """examples/train_cartpole.py: solved or not, mean return, episodes, env steps, wall."""
    line = (
        r"^(?P<episodes>\d+) episodes, (?P<env_steps>\d+) env steps, "
        r"(?P<generations>\d+) CEM generations, (?P<wall_seconds>[\d.]+) s wall, "
        r"(?P<env_steps_per_second>[\d,]+) env-steps/s \(SPS\), "
        r"(?P<n_envs>\d+) envs in (?P<n_workers>\d+) worker processes"
    )
    missing = "no episodes line in train_cartpole.py's output"
    return _result(stdout) | _numbers(line, stdout, missing)


def example_run(
    shown: list[str], parse: Callable[[str], dict[str, Any]], env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run an example, its timer file sent to a scratch directory, and parse its result."""
    with tempfile.TemporaryDirectory() as scratch:
        r = run(shown, plumbing=["--out", str(Path(scratch) / "timers.json")], env=env)
    if r["returncode"] == 0:
        r["parsed"] = parse(r["stdout"])
    return r


def cmd_examples(args: argparse.Namespace) -> int:
    """examples/sb3_ppo.py and examples/train_cartpole.py, ``--seed 0`` (and more CEM seeds)."""
    seeds = [0, *(s for s in args.cem_seeds if s != 0)]
    rerun = ("examples", "--cem-seeds", ",".join(map(str, seeds[1:])))
    when = start(*rerun)
    one_thread = {"OMP_NUM_THREADS": "1"}  # PyTorch's pool would spin against the workers
    sb3 = [example_run(["examples/sb3_ppo.py", "--seed", "0"], parse_sb3, one_thread)]
    record("example_sb3_ppo", args.out, sb3, **when)
    when = start(*rerun)
    cem = [example_run(["examples/train_cartpole.py", "--seed", str(s)], parse_cem) for s in seeds]
    record("example_train_cartpole", args.out, cem, **when)
    return 1 if failed(sb3 + cem) else 0


# ------------------------------------------------------------------ install size

#: What counts as PyTorch and as its CUDA libraries in a venv's site-packages.
TORCH_GLOBS = ("torch", "torch-*", "torchgen", "triton", "triton-*")
CUDA_GLOBS = ("nvidia", "nvidia_*")


def du_kib(paths: Sequence[Path]) -> int:
    """``du -sck PATHS``: their total size in KiB (0 for no paths)."""
    if not paths:
        return 0
    proc = subprocess.run(
        ["du", "-sck", *map(str, paths)], capture_output=True, text=True, timeout=600, check=True
    )
    return int(proc.stdout.strip().splitlines()[-1].split()[0])


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_packages(venv: Path) -> dict[str, str] | None:
    """``pip list`` in ``venv`` (normalized name -> version), or ``None`` without a python."""
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    proc = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        return None
    return {_norm(p["name"]): p["version"] for p in json.loads(proc.stdout)}


def extras_present(installed: dict[str, str]) -> list[str] | None:
    """The extras of pyproject.toml whose every package is installed (markers ignored)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return None
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras: dict[str, list[str]] = project.get("optional-dependencies", {})
    self_name = _norm(project["name"])

    def present(extra: str) -> bool:
        for req in extras[extra]:
            m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[([^\]]*)\])?", req)
            if m is None:
                return False
            if _norm(m[1]) == self_name:
                if not all(present(e.strip()) for e in (m[2] or "").split(",") if e.strip()):
                    return False
            elif _norm(m[1]) not in installed:
                return False
        return True

    return [e for e in extras if present(e)]


def cmd_install_size(args: argparse.Namespace) -> int:
    """``du`` of a virtual environment, of its PyTorch and of its CUDA libraries."""
    when = start("install-size", "--venv", str(args.venv))
    venv = args.venv.absolute()
    site = sorted(venv.glob("lib/python3*/site-packages"))
    if not venv.is_dir() or not site:
        print(f"{venv}: not a virtual environment (no lib/python3*/site-packages)", file=sys.stderr)
        return 1

    def matching(globs: Sequence[str]) -> list[Path]:
        return sorted({p for s in site for g in globs for p in s.glob(g)})

    torch, cuda = matching(TORCH_GLOBS), matching(CUDA_GLOBS)
    installed = installed_packages(venv)
    cfg = venv / "pyvenv.cfg"
    version = None
    if cfg.exists():
        m = re.search(r"^version(?:_info)?\s*=\s*(\S+)", cfg.read_text(encoding="utf-8"), re.M)
        version = m[1] if m else None
    print(f"$ du -sk {venv}", flush=True)
    size = {
        "venv_kib": du_kib([venv]),
        "torch_kib": du_kib(torch),
        "cuda_kib": du_kib(cuda),
    }
    r = {
        "command": f"du -sh {args.venv}",
        "returncode": 0,
        "parsed": size
        | {
            "venv": str(args.venv),
            "python": version,
            "torch_paths": [p.name for p in torch],
            "cuda_paths": [p.name for p in cuda],
            "packages": installed,
            "extras_present": None if installed is None else extras_present(installed),
        },
    }
    record("install_size", args.out, [r], **when)
    return 0


# ------------------------------------------------------------------ main


def cmd_all(args: argparse.Namespace) -> int:
    """Every recording, one after another; 1 if any failed."""
    codes = [cmd_install_size(args), cmd_demo(args), cmd_soak(args), cmd_examples(args)]
    for what in COST_SCRIPTS:
        codes.append(cmd_cost(argparse.Namespace(**{**vars(args), "what": what})))
    return max(codes)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[2:]),
    )
    p.add_argument(
        "--out", type=Path, default=OUTPUTS, help=f"where the records go (default {OUTPUTS})"
    )
    sub = p.add_subparsers(dest="what", required=True)
    demo = sub.add_parser("demo", help="python -m envmgr demo")
    soak = sub.add_parser("soak", help="benchmarks/probes/soak.py, default start method and fork")
    examples = sub.add_parser("examples", help="examples/sb3_ppo.py and train_cartpole.py")
    size = sub.add_parser("install-size", help="du of a virtual environment")
    costs = {
        what: sub.add_parser(what, help=f"{script} (small costs the prose quotes)")
        for what, (_, script, _) in COST_SCRIPTS.items()
    }
    every = sub.add_parser("all", help="all of the above")
    for s in (demo, every):
        s.add_argument(
            "--seconds", type=float, default=None, help="demo's --seconds (default: its own)"
        )
    for s in (soak, every):
        s.add_argument("--steps", type=int, default=1_000_000, help="soak.py --steps")
        s.add_argument("--kill-every", type=float, default=0.5, help="soak.py --kill-every")
        s.add_argument(
            "--fork-kill-every",
            type=float,
            default=0.1,
            help="--kill-every of the second run, under fork (0: no second run)",
        )
    for s in (examples, every):
        s.add_argument(
            "--cem-seeds",
            type=lambda text: [int(x) for x in text.split(",") if x],
            default=list(CEM_SEEDS),
            help="train_cartpole.py seeds run after --seed 0 (comma-separated; '' for none)",
        )
    for s in (size, every):
        s.add_argument(
            "--venv", type=Path, default=REPO / ".ci-venv", help="the virtual environment"
        )
    for what, s in costs.items():
        for option in COST_SCRIPTS[what][2]:
            kind = float if option == "warmup" else int
            s.add_argument(f"--{option}", type=kind, default=None, help=f"the script's --{option}")
        s.set_defaults(func=cmd_cost)
    for option in ("rounds", "number", "calls", "warmup"):
        every.set_defaults(**{option: None})  # the cost scripts' own defaults
    demo.set_defaults(func=cmd_demo)
    soak.set_defaults(func=cmd_soak)
    examples.set_defaults(func=cmd_examples)
    size.set_defaults(func=cmd_install_size)
    every.set_defaults(func=cmd_all)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
