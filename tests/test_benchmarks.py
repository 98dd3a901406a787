"""The benchmark scripts run end to end at tiny sizes and write where they are told.

They run as a user would, in a subprocess (benchmarks/ is not a package, and its
``envs`` module would clash with the tests' own). Only the structure of the results is
checked, never a speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def run(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH.parent), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=220,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_throughput_ceiling_extras_and_output_in_cwd(tmp_path: Path) -> None:
    proc = run(
        "throughput.py",
        "--envs", "noop,cartpole-vector", "--n-envs", "4", "--vector-n-envs", "8",
        "--impls", "serial,ceiling,envmgr", "--repeats", "1", "--seconds", "0.05",
        "--warmup", "0.01", "--pre-sample-steps", "2", "--setup-repeats", "1",
        "--overhead-layouts", "1x4", "--scaling-workers", "1,2", "--floor-workers", "1",
        "--no-plot", "--prog", "envmgr bench",
        cwd=tmp_path,
    )  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["throughput.json", "throughput.txt"]
    report = json.loads((tmp_path / "throughput.json").read_text())
    assert report["command"].startswith("envmgr bench --envs")
    noop, vector = report["configs"]
    assert set(noop["samples"]) == {"serial", "ceiling", "envmgr"}
    (ceiling,) = noop["samples"]["ceiling"]
    assert [p["n_envs"] for p in ceiling["per_process"]] == [2, 2]
    assert {"envmgr/serial", "envmgr/ceiling", "ceiling/serial"} <= set(noop["ratios"])
    assert {"vector", "ceiling", "lockstep"} <= set(vector["samples"])
    assert {"envmgr-hosted", "envmgr-hosted-caller"} <= set(vector["samples"]), vector["errors"]
    assert {"lockstep/ceiling", "envmgr-hosted-caller/lockstep"} <= set(vector["ratios"])
    assert set(report["scaling"]["median_parent_cpu_us_per_batch"]) == {"1", "2"}
    (floor,) = report["floor"]["layouts"]
    assert set(floor["samples"]) == {"envmgr", "floor"}, floor.get("error")
    assert "| noop | 4 |" in proc.stdout and "envmgr/ceiling" in proc.stdout


def test_throughput_out_directory_and_usage_errors(tmp_path: Path) -> None:
    out = tmp_path / "results"
    run(
        "throughput.py", "--envs", "noop", "--n-envs", "2", "--impls", "serial",
        "--repeats", "1", "--seconds", "0.02", "--warmup", "0.01", "--skip-extras",
        "--quick", "--no-plot", "--out", str(out),
        cwd=tmp_path,
    )  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == ["quick.json", "quick.txt"]
    bad = subprocess.run(
        [sys.executable, str(BENCH / "throughput.py"), "--prog", "envmgr bench", "--envs", "x"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(BENCH.parent)},
    )
    assert bad.returncode == 2
    assert "envmgr bench: error: unknown env 'x'" in bad.stderr


def test_policy_loop_smoke(tmp_path: Path) -> None:
    proc = run("policy_loop.py", "--quick", "--n-envs", "8", "--out", str(tmp_path), cwd=tmp_path)
    report = json.loads((tmp_path / "policy_loop_quick.json").read_text())
    loops = {name.split("/")[0] for name in report["median_steps_per_second"]}
    assert {"serial", "sync", "pool"} <= loops
    assert "caller" in loops or "caller" in report["skipped"]
    assert "| pool | mlp |" in proc.stdout


def test_parent_instructions_child_steps_a_manager(tmp_path: Path) -> None:
    """The script's traced child (valgrind itself is not needed for this) builds and steps
    the manager whose parent it counts."""
    run("parent_instructions.py", "--child", "2x3x5", cwd=tmp_path)


def test_realenv_quick_measures_every_implementation(tmp_path: Path) -> None:
    """Every implementation of the real-env benchmark builds, steps and is reported; the
    optional peers exactly when their package imports."""
    pytest.importorskip("mujoco")
    import importlib.util

    proc = run("realenv.py", "--quick", "--out", str(tmp_path), cwd=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quick.json", "quick.png", "quick.txt"]
    report = json.loads((tmp_path / "quick.json").read_text())
    (config,) = report["configs"]
    assert (config["env"], config["n_envs"]) == ("halfcheetah", 4)
    optional = {"subproc": "stable_baselines3", "puffer-1": "pufferlib", "puffer-2": "pufferlib"}
    optional["envpool"] = "envpool"
    expected = {"serial", "ceiling", "lockstep", "envmgr", "envmgr-firstready", "envmgr-caller"}
    expected |= {"async"} | {i for i, m in optional.items() if importlib.util.find_spec(m)}
    assert set(config["samples"]) == expected, config["errors"]
    for impl in expected - {"ceiling"}:
        assert config["ratios"][f"{impl}/ceiling"]["per_round"][0] > 0
    assert set(config["median_parent_cpu_us_per_batch"]) == {
        "envmgr",
        "envmgr-firstready",
        "envmgr-caller",
    }
    assert "| halfcheetah, n=4 |" in proc.stdout
