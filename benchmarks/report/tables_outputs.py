"""README.md's passages that quote a command's output, from ``record_outputs``' records.

The demo's printed output, the soak test's summary, what the two examples reached and the
size of a full install are measurements like the Performance tables: each is rendered here
from its record in ``benchmarks/results/record/outputs/`` and never typed by hand. To rerun one,
run the command its note names (e.g. ``python -m benchmarks.report.record_outputs demo``), then
``python -m benchmarks.report.doc_tables --write``.

Registered with ``doc_tables.table``; see that module for the markers and the check. Each
block's text is a function of one record's path, so a record written elsewhere (a test's
scratch directory) renders the same way.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from benchmarks._common.paths import RECORD, REPO
from benchmarks.report.tables import load_json, table

OUTPUTS = RECORD / "outputs"

# ----------------------------------------------------------------- helpers


def _where(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (else as it is)."""
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


def note(path: Path, report: dict[str, Any], load: bool = True, lead: str = "From") -> str:
    """Where a passage's numbers come from, in italics: the record, commit, date, machine.

    Args:
        path: The record (``benchmarks/results/record/outputs/<name>.json``).
        report: Its contents.
        load: Whether to give the machine's load average when the recording started
            (it moves a speed; it does not move a size on disk).
        lead: The words before the record's path.
    """
    m = report.get("machine", {})
    text = f"*{lead} `{_where(path)}`: {str(report.get('started_at', ''))[:10]}"
    if load:
        cpus = m.get("usable_cpus") or m.get("nproc")
        model = f" ({m['cpu_model']})" if m.get("cpu_model") else ""
        loadavg = report.get("load_average_at_start") or [float("nan")]
        text += f", {cpus} CPUs{model}, load average {loadavg[0]:.2f} at the start"
    rerun = report.get("rerun")
    if rerun:
        # The venv measured was a scratch folder of the machine that ran it: name it VENV.
        rerun = re.sub(r"--venv \S+", "--venv VENV", rerun)
    return text + (f"; rerun: `{rerun}`" if rerun else "") + ".*"


def _failed(run: dict[str, Any]) -> str:
    """What a failed run left (it is a finding too): exit code and the end of stderr."""
    tail = run.get("stderr_tail", "").strip().splitlines()[-1:] or [""]
    return f"`{run['command']}` failed (exit code {run['returncode']}: {tail[0]})"


def _kib(kib: int) -> str:
    return f"{kib / 1024**2:.1f} GiB"


def _thousands(n: int) -> str:
    return f"{n / 1000:,.0f}k"


def _seeds(seeds: list[int]) -> str:
    """``1-6`` for a run of consecutive seeds, else ``1, 3, 7``."""
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


# ----------------------------------------------------------------- the demo


def demo_block(path: Path = OUTPUTS / "demo.json") -> str:
    """The demo's whole printed output as a fenced block, after a note on the run.

    Lines lose their trailing spaces (the tree pads its last column), which editors would
    strip from the README and so make the block differ from its record.
    """
    report = load_json(path)
    (run,) = report["runs"]
    if run["returncode"] != 0:
        return _failed(run) + "\n\n" + note(path, report)
    out = "\n".join(line.rstrip() for line in run["stdout"].rstrip().splitlines())
    lead = f"`{run['command']}` as recorded in"
    return f"{note(path, report, lead=lead)}\n\n```text\n{out}\n```"


@table("demo-output")
def demo_output() -> str:
    return demo_block()


# ----------------------------------------------------------------- soak


def _soak_numbers(s: dict[str, Any]) -> str:
    """One soak run's findings: steps, losses, kills against restarts, and what grew."""
    start, end = s.get("start", {}), s.get("end", {})
    text = (
        f"{s['env_steps_returned']:,} env steps, {s['steps_lost']:,} lost, "
        f"{s['kills']} kills / {s['restarts']} restarts, {s['seconds']:.1f} s "
        f"({_thousands(s['env_steps_per_second'])} env-steps/s with the kills)"
    )
    if start.get("parent_rss_kib") and end.get("parent_rss_kib"):
        text += (
            f", parent RSS {start['parent_rss_kib'] / 1024:.1f} -> "
            f"{end['parent_rss_kib'] / 1024:.1f} MiB"
        )
    if start.get("parent_fds") is not None and end.get("parent_fds") is not None:
        text += f", fds {start['parent_fds']} -> {end['parent_fds']}"
    zombies = end.get("zombie_children")
    if zombies is not None:
        text += ", no zombies" if zombies == 0 else f", {zombies} zombie children"
    if s.get("error"):
        text += f"; error: {s['error']}"
    return text


def soak_paragraph(path: Path = OUTPUTS / "soak.json") -> str:
    """The soak test: what it does, what one run found, and the fork run's kill count."""
    report = load_json(path)
    first, *more = report["runs"]
    if "parsed" not in first:
        return _failed(first) + "\n\n" + note(path, report)
    s = first["parsed"]
    cfg = s["config"]
    text = (
        f"`{first['command']}` steps CartPole-v1 ({cfg['workers']} workers x "
        f"{cfg['envs_per_worker']} envs, start method {cfg['context']}) while SIGKILLing a "
        f"random worker every {cfg['kill_every']:g} s, and reports steps lost, restarts, RSS "
        f"and fds. Measured here: {_soak_numbers(s)}" + ("." if s["ok"] else "; the run FAILED.")
    )
    for run in more:
        if "parsed" not in run:
            text += f" {_failed(run)}."
            continue
        f = run["parsed"]
        text += (
            f" Under {f['config']['context']} with a kill every {f['config']['kill_every']:g} s "
            f"(`{run['command']}`): {f['kills']} kills / {f['restarts']} restarts, "
            f"{f['steps_lost']:,} lost" + ("." if f["ok"] else "; the run FAILED.")
        )
    return text + "\n" + note(path, report)


@table("soak")
def soak() -> str:
    return soak_paragraph()


# ----------------------------------------------------------------- examples


def sb3_sentence(path: Path = OUTPUTS / "example_sb3_ppo.json") -> str:
    """examples/sb3_ppo.py on CartPole-v1: when it solved, in env steps and wall time."""
    report = load_json(path)
    (run,) = report["runs"]
    if "parsed" not in run:
        return _failed(run) + "\n" + note(path, report)
    p = run["parsed"]
    outcome = "solved" if p["solved"] else "not solved within its budget"
    return (
        f"Measured here (`{run['command']}`: {p['n_envs']} envs in {p['n_workers']} worker "
        f"processes): {outcome} after {p['env_steps']:,} env steps (mean return "
        f"{p['mean_return']:.1f} over the last {p['episodes_in_mean']} episodes) and "
        f"{p['wall_seconds']:.1f} s of wall time, gradient steps included.\n" + note(path, report)
    )


@table("example-sb3-cartpole")
def example_sb3_cartpole() -> str:
    return sb3_sentence()


def cem_sentence(path: Path = OUTPUTS / "example_train_cartpole.json") -> str:
    """examples/train_cartpole.py: the ``--seed 0`` run, then how the other seeds went."""
    report = load_json(path)
    first, *others = report["runs"]
    if "parsed" not in first:
        return _failed(first) + "\n" + note(path, report)
    p = first["parsed"]
    outcome = "solved" if p["solved"] else "not solved within its budget"
    text = (
        f"Measured here (`{first['command']}`: {p['n_envs']} envs in {p['n_workers']} worker "
        f"processes): {outcome} with a mean return of {p['mean_return']:.1f} over the last "
        f"{p['episodes_in_mean']} episodes after {p['episodes']:,} episodes, "
        f"{p['env_steps']:,} env steps and {p['wall_seconds']:.1f} s of wall time "
        f"({p['env_steps_per_second']:,} env-steps/s including the learner)"
    )
    ran = [r for r in others if "parsed" in r]
    if others:
        seeds = [int(r["argv"][r["argv"].index("--seed") + 1]) for r in others]
        solved = [r["parsed"]["env_steps"] for r in ran if r["parsed"]["solved"]]
        text += f"; seeds {_seeds(seeds)}: {len(solved)} of {len(others)} solved"
        if solved:
            text += f", in {_thousands(min(solved))}-{_thousands(max(solved))} env steps"
    return text + ".\n" + note(path, report)


@table("example-train-cartpole")
def example_train_cartpole() -> str:
    return cem_sentence()


# ----------------------------------------------------------------- install size


def install_size_sentence(path: Path = OUTPUTS / "install_size.json") -> str:
    """How large a virtual environment with the extras is, and how much of it is PyTorch."""
    report = load_json(path)
    (run,) = report["runs"]
    p = run["parsed"]
    held = []
    if p.get("python"):
        held.append(f"Python {p['python']}")
    if p.get("extras_present"):
        held.append("envmgr's extras " + ", ".join(p["extras_present"]))
    if p.get("packages") is not None:
        held.append(f"{len(p['packages'])} packages")
    what = f" ({'; '.join(held)})" if held else ""
    return (
        f"That install is large: the virtual environment measured here{what} takes "
        f"{_kib(p['venv_kib'])} (`du -sh VENV`), "
        f"{_kib(p['torch_kib'] + p['cuda_kib'])} of it PyTorch (torch and triton, "
        f"{_kib(p['torch_kib'])}) and its CUDA libraries (`nvidia-*`, {_kib(p['cuda_kib'])}), "
        "which Stable-Baselines3 pulls in.\n" + note(path, report, load=False)
    )


@table("install-size")
def install_size() -> str:
    return install_size_sentence()
