"""The ``envmgr`` command line, run as a user would: ``python -m envmgr ...`` in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from envmgr.timer_format import folded_stacks, load_tree

pytestmark = pytest.mark.timeout(120)

DATA = Path(__file__).resolve().parent / "data"
MLAGENTS = DATA / "mlagents_timers.json"
ENVMGR = DATA / "envmgr_timers.json"  # two workers; worker_1 is the straggler


def envmgr(
    *args: str | Path, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envmgr", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("envmgr: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


# ------------------------------------------------------------------ timers commands


def test_timers_show() -> None:
    proc = envmgr("timers", "show", MLAGENTS)
    assert_ok(proc)
    assert proc.stdout.splitlines()[0].split()[:4] == ["name", "total", "count", "self"]
    assert "TrainerController.advance" in proc.stdout
    assert "|| UnityEnvironment.step" in proc.stdout
    assert "3DBall.Policy.Entropy.mean" in proc.stdout  # gauges


def test_timers_show_depth_and_min_share() -> None:
    proc = envmgr("timers", "show", ENVMGR, "--depth", "2", "--min-share", "0.2")
    assert_ok(proc)
    assert "env_step [+1]" in proc.stdout
    assert "(1 below 20%: 1 s)" in proc.stdout
    assert "worker_0" not in proc.stdout


def test_timers_fold_stdout_and_file(tmp_path: Path) -> None:
    proc = envmgr("timers", "fold", ENVMGR)
    assert_ok(proc)
    assert proc.stdout == folded_stacks(load_tree(ENVMGR))
    assert "root;train;env_step;workers;worker_1;step;env.step 4250000\n" in proc.stdout

    out = tmp_path / "stacks.folded"
    proc = envmgr("timers", "fold", MLAGENTS, "-o", out)
    assert_ok(proc)
    assert out.read_text() == folded_stacks(load_tree(MLAGENTS))
    assert str(out) in proc.stdout


def test_timers_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "timers.png"
    proc = envmgr("timers", "plot", ENVMGR, "-o", out)
    assert_ok(proc)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000


def test_timers_plot_without_matplotlib(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from envmgr.cli import main\n"
        f"sys.exit(main(['timers', 'plot', {str(ENVMGR)!r}, '-o', {str(tmp_path / 'x.png')!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert_one_line_error(proc, 'pip install "envmgr[plot]"')


def test_timers_workers() -> None:
    proc = envmgr("timers", "workers", ENVMGR)
    assert_ok(proc)
    assert "worker_0" in proc.stdout and "worker_1" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("straggler: worker_1 ")
    proc = envmgr("timers", "workers", MLAGENTS)
    assert_ok(proc)
    assert "no per-worker timers" in proc.stdout


def test_timers_reads_stdin() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "envmgr", "timers", "fold", "-"],
        input=MLAGENTS.read_text(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_ok(proc)
    assert proc.stdout == folded_stacks(load_tree(MLAGENTS))


# ------------------------------------------------------------------ bad files -> exit 1


@pytest.fixture
def bad_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    invalid = tmp_path / "invalid.json"
    invalid.write_text('{"total": 1,')
    not_tree = tmp_path / "list.json"
    not_tree.write_text(json.dumps([{"total": 1}]))
    no_total = tmp_path / "no_total.json"
    no_total.write_text(json.dumps({"name": "root", "children": {"a": {"count": 1}}}))
    return {
        "missing": (tmp_path / "missing.json", "No such file or directory"),
        "invalid": (invalid, "is not valid JSON"),
        "not_tree": (not_tree, "is not a timer tree"),
        "no_total": (no_total, "is not a timer tree"),
    }


@pytest.mark.parametrize("action", ["show", "fold", "plot", "workers"])
def test_bad_files_exit_1_with_one_line(
    action: str, bad_files: dict[str, tuple[Path, str]], tmp_path: Path
) -> None:
    extra = ["-o", str(tmp_path / "out.png")] if action == "plot" else []
    cases = list(bad_files.values())
    with ThreadPoolExecutor(2) as pool:  # the interpreters start faster side by side
        procs = list(pool.map(lambda case: envmgr("timers", action, case[0], *extra), cases))
    for (path, message), proc in zip(cases, procs, strict=True):
        assert_one_line_error(proc, str(path), message)
    assert not (tmp_path / "out.png").exists()


def test_unwritable_output_exit_1(tmp_path: Path) -> None:
    proc = envmgr("timers", "fold", ENVMGR, "-o", tmp_path / "no" / "such" / "dir.folded")
    assert_one_line_error(proc, "cannot write", "No such file or directory")


# ------------------------------------------------------------------ usage and help


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["demo"],
        ["timers"],
        ["timers", "show"],
        ["timers", "fold"],
        ["timers", "plot"],
        ["timers", "workers"],
    ],
)
def test_help(args: list[str]) -> None:
    proc = envmgr(*args, "--help")
    assert_ok(proc)
    assert proc.stdout.startswith("usage: envmgr")
    assert proc.stderr == ""


def test_help_describes_each_timers_action() -> None:
    out = envmgr("timers", "--help").stdout
    for action in ("show", "fold", "plot", "workers"):
        assert f"    {action}" in out
    assert "timers.json" in out and "ML-" in out  # argparse may wrap "ML-Agents" at the hyphen
    assert "speedscope" in envmgr("timers", "fold", "--help").stdout
    assert "envmgr[plot]" in envmgr("timers", "plot", "--help").stdout


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["timers"],
        ["timers", "show"],  # FILE missing
        ["timers", "plot", str(ENVMGR)],  # -o missing
        ["timers", "show", str(ENVMGR), "--depth", "-1"],
        ["timers", "show", str(ENVMGR), "--min-share", "5"],
        ["timers", "frobnicate", str(ENVMGR)],
        ["timers", "show", str(ENVMGR), "--bogus"],
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    proc = envmgr(*args)
    assert proc.returncode == 2, proc.stderr
    assert "usage:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bench_runs_the_suite_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = envmgr(
        "bench", "--envs", "noop", "--n-envs", "4", "--impls", "serial,envmgr",
        "--repeats", "1", "--seconds", "0.2", "--warmup", "0.1", "--skip-extras",
        "--no-plot", "--out", out, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| noop | 4 |" in proc.stdout
    result = json.loads(out.read_text())
    config = result["configs"][0] if "configs" in result else result
    assert "envmgr" in json.dumps(config)


def test_bench_passes_help_to_the_suite() -> None:
    proc = envmgr("bench", "--help-suite")
    assert proc.returncode == 0
    assert "--n-envs" in proc.stdout


def test_bench_bad_suite_argument_is_a_usage_error() -> None:
    proc = envmgr("bench", "--no-such-flag")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ demo


def test_demo_writes_json_and_prints_worker_summary(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    proc = envmgr("demo", "--seconds", "0.5", "--json", out, cwd=tmp_path, timeout=100)
    assert_ok(proc)
    assert "env-steps/s" in proc.stdout
    assert "|| worker_root" in proc.stdout
    assert "straggler: worker_" in proc.stdout
    tree = load_tree(out)
    assert "training_loop" in tree["children"]

    # What the demo wrote reads back through every timers action.
    for action in ("show", "fold", "workers"):
        assert_ok(envmgr("timers", action, out))
