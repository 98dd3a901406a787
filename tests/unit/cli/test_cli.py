"""The ``envmgr`` command line, run as a user would: ``python -m envmgr ...`` in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from envmgr.timers.format import folded_stacks, load_tree

pytestmark = pytest.mark.timeout(120)

DATA = Path(__file__).resolve().parents[2] / "support" / "data"
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


def assert_one_line_error(
    proc: subprocess.CompletedProcess[str], *fragments: str, code: int = 1, prog: str = "envmgr"
) -> None:
    assert proc.returncode == code, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def assert_usage_error(proc: subprocess.CompletedProcess[str], prog: str, *fragments: str) -> None:
    """Exit code 2 and one line: '<prog>: error: <what> (see '<prog> --help')'."""
    assert_one_line_error(proc, *fragments, f"(see '{prog} --help')", code=2, prog=prog)


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


# ------------------------------------------------------------------ bad files -> exit 1 or 2


@pytest.fixture
def bad_files(tmp_path: Path) -> dict[str, tuple[Path, str, int]]:
    """name -> (path, message, exit code): unreadable is a usage error, unusable content 1."""
    invalid = tmp_path / "invalid.json"
    invalid.write_text('{"total": 1,')
    not_tree = tmp_path / "list.json"
    not_tree.write_text(json.dumps([{"total": 1}]))
    no_total = tmp_path / "no_total.json"
    no_total.write_text(json.dumps({"name": "root", "children": {"a": {"count": 1}}}))
    negative = tmp_path / "negative.json"
    negative.write_text(
        json.dumps({"name": "root", "total": 1.0, "children": {"a": {"total": -389.7}}})
    )
    return {
        "missing": (tmp_path / "missing.json", "cannot read", 2),
        "directory": (tmp_path, "Is a directory", 2),
        "invalid": (invalid, "is not valid JSON", 1),
        "not_tree": (not_tree, "is not a timer tree", 1),
        "no_total": (no_total, "is not a timer tree", 1),
        "negative": (negative, "node 'root/a' has total=-389.7", 1),
    }


@pytest.mark.parametrize("action", ["show", "fold", "plot", "workers"])
def test_bad_files_are_one_line_errors(
    action: str, bad_files: dict[str, tuple[Path, str, int]], tmp_path: Path
) -> None:
    extra = ["-o", str(tmp_path / "out.png")] if action == "plot" else []
    cases = list(bad_files.values())
    with ThreadPoolExecutor(2) as pool:  # the interpreters start faster side by side
        procs = list(pool.map(lambda case: envmgr("timers", action, case[0], *extra), cases))
    for (path, message, code), proc in zip(cases, procs, strict=True):
        if code == 2:
            assert_usage_error(proc, f"envmgr timers {action}", str(path), message)
        else:
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
    ("args", "prog", "message"),
    [
        ([], "envmgr", "choose one of: demo, timers, bench, tune"),
        (["frobnicate"], "envmgr", "invalid choice: 'frobnicate'"),
        (["timers"], "envmgr timers", "choose one of: show, fold, plot, workers"),
        (["timers", "show"], "envmgr timers show", "the following arguments are required: FILE"),
        (["timers", "plot", str(ENVMGR)], "envmgr timers plot", "required: -o/--output"),
        (["timers", "show", str(ENVMGR), "--depth", "-1"], "envmgr timers show", "must be >= 0"),
        (["timers", "show", str(ENVMGR), "--min-share", "5"], "envmgr timers show", "[0, 1)"),
        (["timers", "frobnicate", str(ENVMGR)], "envmgr timers", "invalid choice"),
        (["timers", "show", str(ENVMGR), "--bogus"], "envmgr timers show", "unrecognized"),
        (["demo", "--workers", "0"], "envmgr demo", "argument --workers: must be >= 1, got 0"),
        (["demo", "--workers", "two"], "envmgr demo", "expected a whole number, got 'two'"),
        (["demo", "--envs-per-worker", "-3"], "envmgr demo", "--envs-per-worker: must be >= 1"),
        (["demo", "--seconds", "-1"], "envmgr demo", "--seconds: must be a number of seconds > 0"),
        (["demo", "--seconds", "0"], "envmgr demo", "must be a number of seconds > 0, got 0"),
        (["demo", "--seconds", "nan"], "envmgr demo", "must be a number of seconds > 0, got nan"),
        (["demo", "--env", "NoSuchEnv-v0"], "envmgr demo", "--env NoSuchEnv-v0: Environment"),
        (["demo", "--env", "no_such_module_x:Env-v0"], "envmgr demo", "No module named"),
        (["demo", "--json", "/no/such/dir/t.json"], "envmgr demo", "no such directory /no/such"),
    ],
)
def test_usage_errors_are_one_line_with_exit_code_2(
    args: list[str], prog: str, message: str
) -> None:
    assert_usage_error(envmgr(*args), prog, message)


BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def test_bench_names_itself_and_writes_to_the_current_directory() -> None:
    from envmgr.cli import BENCH_PROG, _bench_argv

    assert BENCH_PROG == "envmgr bench"
    assert _bench_argv(["--quick"]) == ["--prog", "envmgr bench", "--quick"]
    assert _bench_argv(["--out", "x"]) == ["--prog", "envmgr bench", "--out", "x"]


def test_bench_runs_the_suite_in_the_current_directory(tmp_path: Path) -> None:
    results = BENCHMARKS / "results" / "record"
    before = {p: p.stat().st_mtime_ns for p in results.iterdir()}
    typed = [
        "bench", "--envs", "cartpole", "--n-envs", "4", "--impls", "serial,envmgr,envpool",
        "--repeats", "1", "--seconds", "0.2", "--warmup", "0.1", "--skip-extras", "--no-plot",
    ]  # fmt: skip
    proc = envmgr(*typed, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| cartpole | 4 |" in proc.stdout
    # The report echoes what was typed and lists only what the run measured, once.
    assert f"command: envmgr {' '.join(typed)}\n" in proc.stdout
    assert "not measured" not in proc.stdout and "()" not in proc.stdout
    assert "issue" not in proc.stdout.lower()
    # EnvPool is said once: which version ran, or why it was skipped.
    lines = (proc.stdout + proc.stderr).lower().splitlines()
    notices = [line for line in lines if line.startswith(("envpool:", "envpool skipped"))]
    assert len(notices) == 1, notices
    assert not any("envpool unavailable" in line for line in lines)
    written = list(tmp_path.rglob("*.json"))
    assert written, f"no JSON written under {tmp_path}"
    assert "envmgr" in written[0].read_text()
    # Nothing written into the checkout.
    assert {p: p.stat().st_mtime_ns for p in results.iterdir()} == before


def test_bench_help_calls_itself_envmgr_bench() -> None:
    proc = envmgr("bench", "--help-suite")
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: envmgr bench")
    assert "--n-envs" in proc.stdout
    assert "--prog" not in proc.stdout  # hidden


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--quick", "--workers", "0"], "every count of envs or workers must be positive"),
        (["--quick", "--seconds", "-1"], "--seconds must be > 0"),
        (["--quick", "--impls", "bogus"], "unknown implementation 'bogus'"),
    ],
)
def test_bench_bad_suite_argument_is_a_one_line_usage_error(args: list[str], message: str) -> None:
    """The suite's own checks speak as every other command does: one line, exit code 2."""
    assert_usage_error(envmgr("bench", *args), "envmgr bench", message)


# ------------------------------------------------------------------ demo


def test_demo_writes_json_and_prints_worker_summary(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    proc = envmgr("demo", "--seconds", "0.5", "--json", out, cwd=tmp_path, timeout=100)
    assert_ok(proc)
    assert "env-steps/s" in proc.stdout
    assert "|| worker_root" in proc.stdout
    assert "straggler: " in proc.stdout
    assert "transfer = send_response" in proc.stdout  # the columns are explained
    tree = load_tree(out)
    assert "training_loop" in tree["children"]

    # What the demo wrote reads back through every timers action.
    for action in ("show", "fold", "workers"):
        assert_ok(envmgr("timers", action, out))


def test_demo_vector_hosts_one_batched_env_per_worker(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    proc = envmgr(
        "demo", "--vector", "--envs-per-worker", "64", "--seconds", "0.3", "--json", out,
        cwd=tmp_path, timeout=100,
    )  # fmt: skip
    assert_ok(proc)
    assert "128 x CartPole-v1 in 2 worker processes (one batched env per worker)" in proc.stdout
    tree = load_tree(out)
    worker = tree["children"]["training_loop"]["children"]["env_step"]["children"]["workers"]
    step = worker["children"]["worker_0"]["children"]["step"]
    # One env.step call per batch step in a worker hosting a batched env.
    assert step["children"]["env.step"]["count"] == step["count"]


# ------------------------------------------------------------------ a shadowing folder

SHADOWED = """
import importlib.util, os, sys
here, cli_file = sys.argv[1], sys.argv[2]
package_root = os.path.dirname(os.path.dirname(os.path.dirname(cli_file)))
# What a shell in a folder holding a clone named envmgr/ gets when nothing else supplies the
# package: the folder comes first on sys.path, and no installed copy is reachable.
sys.path[:] = [here] + [p for p in sys.path if p and os.path.abspath(p) != package_root]
sys.meta_path[:] = [
    f for f in sys.meta_path if "Editable" not in getattr(f, "__name__", type(f).__name__)
]
# The CLI package alone (it imports its own modules relatively, the rest lazily).
spec = importlib.util.spec_from_file_location(
    "cli_under_test", cli_file, submodule_search_locations=[os.path.dirname(cli_file)]
)
cli = importlib.util.module_from_spec(spec)
sys.modules["cli_under_test"] = cli
spec.loader.exec_module(cli)
import envmgr
assert envmgr.__file__ is None, envmgr
sys.exit(cli.main(["demo", "--seconds", "0.1"]))
"""


def test_a_folder_named_envmgr_that_shadows_the_package_is_named_in_one_line(
    tmp_path: Path,
) -> None:
    clone = tmp_path / "envmgr"
    (clone / "envmgr").mkdir(parents=True)  # a clone: the package one level down
    (clone / "README.md").write_text("# envmgr\n")
    cli_file = Path(__file__).resolve().parents[3] / "envmgr" / "cli" / "__init__.py"
    proc = subprocess.run(
        [sys.executable, "-c", SHADOWED, str(tmp_path), str(cli_file)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("envmgr: error: ") and "envmgr" in line.split(":")[2]
    assert f"the folder {clone} shadows the installed envmgr" in line
