"""The benchmark scripts run end to end at tiny sizes and write where they are told.

They run as a user would, ``python -m benchmarks.<folder>.<name>`` in a subprocess with the
checkout on ``PYTHONPATH``. Only the structure of the results is checked, never a speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def run(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.<module> args`` in ``cwd``; the finished process (exit code 0)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH.parent), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=220,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def run_code(code: str, *args: str, cwd: Path, timeout: float = 120) -> str:
    """``python -c code args`` with the benchmarks package importable; returns its stdout."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(BENCH.parent)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_throughput_ceiling_extras_and_output_in_cwd(tmp_path: Path) -> None:
    proc = run(
        "suites.throughput",
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
    # The report lists what this run measured, in its own words.
    assert "round trip / floor |" in proc.stdout
    for leftover in ("not measured", "()", "issue"):
        assert leftover not in proc.stdout.lower()


def test_throughput_out_directory_and_usage_errors(tmp_path: Path) -> None:
    out = tmp_path / "results"
    run(
        "suites.throughput", "--envs", "noop", "--n-envs", "2", "--impls", "serial",
        "--repeats", "1", "--seconds", "0.02", "--warmup", "0.01", "--skip-extras",
        "--quick", "--no-plot", "--out", str(out),
        cwd=tmp_path,
    )  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == ["quick.json", "quick.txt"]
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.suites.throughput",
            "--prog",
            "envmgr bench",
            "--envs",
            "x",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(BENCH.parent)},
    )
    assert bad.returncode == 2
    assert "envmgr bench: error: unknown env 'x'" in bad.stderr


def test_policy_loop_smoke(tmp_path: Path) -> None:
    proc = run(
        "suites.policy_loop", "--quick", "--n-envs", "8", "--out", str(tmp_path), cwd=tmp_path
    )
    report = json.loads((tmp_path / "policy_loop_quick.json").read_text())
    loops = {name.split("/")[0] for name in report["median_steps_per_second"]}
    assert {"serial", "sync", "pool"} <= loops
    assert "caller" in loops or "caller" in report["skipped"]
    assert "| pool | mlp |" in proc.stdout


def test_timeline_splits_every_batch_into_its_segments(tmp_path: Path) -> None:
    """Every segment of the default layout's batch is measured, in every worker, none
    negative, and the ceiling of the same run is set beside it."""
    out = tmp_path / "timeline.txt"
    args = ["--env", "noop", "--n", "4", "--batches", "300", "--seconds", "0.1"]
    proc = run("probes.timeline", *args, "--out", str(out), cwd=tmp_path)
    assert out.read_text() == proc.stdout
    rows = {
        line[:40].strip(): [float(x) for x in line[40:].split()]
        for line in proc.stdout.splitlines()
        if line[40:].replace(".", "").replace(" ", "").replace("-", "").isdigit()
    }
    segments = ["pick-up", "env steps", "worker's own", "publish"]
    expected = {f"{s}, worker {w}" for s in segments for w in (0, 1)}
    expected |= {
        "wake (last publish -> parent runs)",
        "parent (runs -> next post)",
        "imbalance (last - first finish)",
        "batch (post -> next post)",
    }
    assert set(rows) == expected
    assert all(min(values) >= 0 for values in rows.values()), rows
    assert rows["batch (post -> next post)"][0] > 0
    assert "ceiling, same run:" in proc.stdout and "batches; µs per batch" in proc.stdout


def test_caller_timeline_adds_up_to_the_batch_it_splits(tmp_path: Path) -> None:
    """With caller_envs, the caller's segments are all measured, none negative, and they
    add up to its batch; the caller's own work is their sum without env steps or waiting,
    and the bounds of the same run are reported beside it."""
    out, data = tmp_path / "timeline.txt", tmp_path / "timeline.json"
    args = ["--env", "noop-info", "--n", "4", "--batches", "300", "--seconds", "0.1"]
    proc = run(
        "probes.timeline_caller", *args, "--out", str(out), "--json", str(data), cwd=tmp_path
    )
    assert out.read_text() == proc.stdout
    rep = json.loads(data.read_text())
    medians, per_batch = rep["median_us"], rep["median_us"]["batch (post -> next post)"]
    assert rep["batches"] >= 290 and (rep["env"], rep["n_envs"]) == ("noop-info", 4)
    assert all(value >= 0 for value in medians.values()), medians
    caller = [key for key in medians if key.endswith(", caller") or "(" in key]
    caller.remove("batch (post -> next post)")
    # Medians of parts need not add up exactly to the median of their sum; within a fifth.
    assert abs(sum(medians[key] for key in caller) - per_batch) < 0.2 * per_batch
    own = sum(medians[key] for key in caller if "env steps" not in key and "waiting" not in key)
    assert rep["caller_own_us"] == pytest.approx(own)
    assert set(rep["bounds_us"]) == {"lock-step", "ceiling"}
    assert all(us > 0 for us in rep["bounds_us"].values())
    assert "of lock-step's rate" in proc.stdout and "pick-up, worker" in proc.stdout


def test_parent_instructions_child_steps_a_manager(tmp_path: Path) -> None:
    """The script's traced child (valgrind itself is not needed for this) builds and steps
    the manager whose parent it counts."""
    run("probes.parent_instructions", "--child", "2,3,0,5,noop", cwd=tmp_path)
    run("probes.parent_instructions", "--child", "1,2,2,5,noop-info", cwd=tmp_path)  # caller_envs


def test_policy_loop_writes_under_results_by_default(tmp_path: Path) -> None:
    """Without --out a run's record goes to benchmarks/results/record/, not the directory it was
    started from (quick runs once littered the repository root)."""
    code = (
        "from benchmarks.suites import policy_loop; print(policy_loop.parse_args(['--quick']).out)"
    )
    out = run_code(code, cwd=tmp_path)
    assert Path(out.strip()) == BENCH / "results" / "record"
    assert list(tmp_path.iterdir()) == []


def report_tables(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``benchmarks.report.doc_tables`` on the docs' generated tables; the finished process."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.report.doc_tables", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(BENCH.parent)},
    )


def test_committed_doc_tables_match_their_results_files(tmp_path: Path) -> None:
    proc = report_tables("--check", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def copy_docs(tmp_path: Path) -> list[Path]:
    """Copies of README.md and the docs' pages, at their paths under ``tmp_path``."""
    from benchmarks.report.doc_tables import documents

    copies = []
    for doc in documents(BENCH.parent):
        copy = tmp_path / doc.relative_to(BENCH.parent)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(doc.read_text(encoding="utf-8"), encoding="utf-8")
        copies.append(copy)
    return copies


def test_a_table_edited_by_hand_is_found_and_rewritten(tmp_path: Path) -> None:
    copies = copy_docs(tmp_path)
    (readme,) = [c for c in copies if "<!-- bench:single-env -->" in c.read_text("utf-8")]
    original = readme.read_text(encoding="utf-8")
    start = original.index("<!-- bench:single-env -->")
    end = original.index("<!-- /bench:single-env -->")
    block = original[start:end]
    edited = block.replace("x |", "1x |", 1)  # one ratio typed in by hand
    assert edited != block
    readme.write_text(original[:start] + edited + original[end:], encoding="utf-8")
    docs = [str(c) for c in copies]

    stale = report_tables("--check", "--docs", *docs, cwd=tmp_path)
    assert stale.returncode == 1
    assert f"{readme}: stale tables single-env\n" in stale.stderr

    assert report_tables("--write", "--docs", *docs, cwd=tmp_path).returncode == 0
    assert readme.read_text(encoding="utf-8") == original


def test_unknown_marker_and_unused_table_are_named(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- bench:atari -->\n<!-- /bench:atari -->\n", encoding="utf-8")
    proc = report_tables("--check", "--docs", str(doc), cwd=tmp_path)
    assert proc.returncode == 1
    assert "marker bench:atari has no table" in proc.stderr
    assert "table single-env is in no document" in proc.stderr


TARGETS_CHECK = """
import copy, json, sys
from pathlib import Path
from benchmarks.report import repeats, tables_realenv as t
record = json.loads(Path(sys.argv[1]).read_text())
tmp = Path(sys.argv[2])
def run(name, started, step, caller, over_async):
    report = copy.deepcopy(record)
    report["started"] = started
    for c in report["configs"]:
        if (c["env"], c["n_envs"]) == ("halfcheetah", 8):
            for k in ("envmgr", "envmgr-firstready", "envmgr-caller"):
                c["ratios"][f"{k}/ceiling"]["median"] = 0.5
                c["median_steps_per_second"][k] = 1.0
            c["ratios"]["envmgr/ceiling"]["median"] = step
            c["ratios"]["doorbell/ceiling"]["median"] = 0.70
            c["ratios"]["lockstep/ceiling"]["median"] = 0.9
            c["ratios"]["envmgr-caller/ceiling"]["median"] = caller
            rates = c["median_steps_per_second"]
            rates["envmgr-caller"] = over_async * rates["async"]
    path = tmp / name / "realenv.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(report))
    return path
t.REALENV = run("record", "2098-01-01 00:00:00 UTC", 0.72, 0.75, 1.5)
repeat = run("repeat", "2099-01-01 00:00:00 UTC", 0.698, 0.81, 10.0)   # 0.698 rounds to 0.70
t.REPEATS = tmp / "repeats.csv"
repeats.write(t.REPEATS, repeats.rows_of(json.loads(repeat.read_text())))
t.rel = lambda path: path.relative_to(tmp).as_posix()  # the caption names files in the repo
text = t.realenv_targets()
lines = text.splitlines()
assert "2 runs in all" in lines[0], lines[0]
rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in lines[4:]}
step = rows["HalfCheetah-v5, n=8: default `step` / ceiling"]
assert step[2:] == ["0.72 (its bound 0.70)", "0.698-0.72", "1 of 2 |"], step
best = rows["HalfCheetah-v5, n=8: best layout / ceiling"]
assert best[2:] == ["0.75 (caller; lock-step 0.90)", "0.75-0.81", "1 of 2 |"], best
fast = rows["HalfCheetah-v5, n=8: fastest / AsyncVectorEnv"]
assert fast[2:] == ["1.50x (caller)", "1.50-10.00x", "1 of 2 |"], fast
print("ok")
"""


def test_realenv_targets_read_every_run_and_round_without_flipping_a_verdict(
    tmp_path: Path,
) -> None:
    record = BENCH / "results" / "record" / "realenv" / "realenv.json"
    assert run_code(TARGETS_CHECK, str(record), str(tmp_path), cwd=tmp_path).startswith("ok")


PLOT_CHECK = """
import json, sys
from matplotlib.colors import to_hex
from benchmarks.report import plot, text
report = json.loads(open(sys.argv[1]).read())
fig = plot.figure(report["configs"], "t")
assert len(fig.legends) == 1, "one legend, below the panels"
assert sorted(set(plot.COLOURS.values())) == sorted(plot.COLOURS.values())
assert set(plot.COLOURS) == set(text.LABELS)
for ax in fig.axes:
    if not ax.get_visible():
        continue
    assert ax.get_legend() is None and not ax.texts, f"{ax.get_title()}: text over the data"
    colours = [to_hex(line.get_color()) for line in ax.get_lines() if line.get_marker() != "_"]
    assert colours and len(colours) == len(set(colours)), (ax.get_title(), colours)
print("ok", len(fig.axes))
"""


def test_plot_keeps_labels_off_the_data_and_colours_apart(tmp_path: Path) -> None:
    out = run_code(PLOT_CHECK, str(BENCH / "results/record/throughput.json"), cwd=tmp_path)
    assert out.startswith("ok")


def test_replot_redraws_the_png_beside_a_report(tmp_path: Path) -> None:
    report = tmp_path / "throughput.json"
    report.write_bytes((BENCH / "results/record/throughput.json").read_bytes())
    proc = report_tables("--replot", str(report), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_realenv_quick_measures_every_implementation(tmp_path: Path) -> None:
    """Every implementation of the real-env benchmark builds, steps and is reported; the
    optional peers exactly when their package imports."""
    pytest.importorskip("mujoco")
    import importlib.util

    proc = run("suites.realenv", "--quick", "--out", str(tmp_path), cwd=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quick.json", "quick.png", "quick.txt"]
    report = json.loads((tmp_path / "quick.json").read_text())
    (config,) = report["configs"]
    assert (config["env"], config["n_envs"]) == ("halfcheetah", 4)
    optional = {"subproc": "stable_baselines3", "puffer-1": "pufferlib", "puffer-2": "pufferlib"}
    optional["envpool"] = "envpool"
    expected = {"serial", "ceiling", "lockstep", "doorbell", "envmgr", "envmgr-firstready"}
    expected |= {"envmgr-caller"}
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


RENDER_OUTPUTS = """
import json, sys
from pathlib import Path
from benchmarks.report import record_outputs, tables_outputs
out = Path(sys.argv[1])
print(tables_outputs.demo_block(out / "demo.json"))
print(tables_outputs.soak_paragraph(out / "soak.json"))
print(tables_outputs.install_size_sentence(out / "install_size.json"))
# The committed example records: their numbers are what the parsers read from their output.
for name, parse in (("example_sb3_ppo", record_outputs.parse_sb3),
                    ("example_train_cartpole", record_outputs.parse_cem)):
    for run in json.loads((record_outputs.OUTPUTS / f"{name}.json").read_text())["runs"]:
        assert parse(run["stdout"]) == run["parsed"], (name, run["command"])
"""


def test_record_outputs_smoke(tmp_path: Path) -> None:
    """record_outputs.py's demo, soak and install-size, at tiny sizes, write records that
    tables_outputs.py renders. Its ``examples`` is left out: it trains to CartPole's solved
    mark (about a minute); the examples themselves are smoke-run by test_train_example.py
    and test_sb3.py."""
    out = tmp_path / "outputs"
    run("report.record_outputs", "--out", str(out), "demo", "--seconds", "0.3", cwd=tmp_path)
    run(
        "report.record_outputs", "--out", str(out), "soak", "--steps", "3200",
        "--kill-every", "0.05", "--fork-kill-every", "0.05",
        cwd=tmp_path,
    )  # fmt: skip
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "nvidia").mkdir()
    (site / "torch" / "lib.so").write_bytes(b"\0" * 200_000)
    venv = str(tmp_path / "venv")
    run("report.record_outputs", "--out", str(out), "install-size", "--venv", venv, cwd=tmp_path)
    assert sorted(p.name for p in out.iterdir()) == ["demo.json", "install_size.json", "soak.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs", "venv"]

    demo = json.loads((out / "demo.json").read_text())
    (r,) = demo["runs"]
    assert r["command"] == "python -m envmgr demo --seconds 0.3"
    assert demo["rerun"] == "python -m benchmarks.report.record_outputs demo --seconds 0.3"
    assert r["parsed"]["env_steps"] == 32 * r["parsed"]["batch_steps"] > 0
    assert Path(demo["envmgr_imported_from"]).parent.parent == BENCH.parent
    assert {"git_commit", "nproc"} <= set(demo["machine"])
    assert len(demo["load_average_at_start"]) == 3
    soak = json.loads((out / "soak.json").read_text())
    commands = [r["command"] for r in soak["runs"]]
    assert commands == [
        "python -m benchmarks.probes.soak --steps 3200 --kill-every 0.05",
        "python -m benchmarks.probes.soak --steps 3200 --kill-every 0.05 --context fork",
    ]
    assert all(r["parsed"]["ok"] and r["parsed"]["steps_lost"] == 0 for r in soak["runs"])
    (size,) = json.loads((out / "install_size.json").read_text())["runs"]
    assert size["command"] == f"du -sh {venv}"
    assert size["parsed"]["torch_kib"] >= 195 and size["parsed"]["packages"] is None

    rendered = run_code(RENDER_OUTPUTS, str(out), cwd=tmp_path, timeout=60)
    assert "`python -m envmgr demo --seconds 0.3` as recorded in" in rendered
    assert "```text\nSubprocessEnvManager(" in rendered and "worker_root" in rendered
    assert "under fork with a kill every 0.05 s" in rendered.lower()
    # The measured venv was a scratch folder of the machine that ran it: the docs say VENV.
    assert venv not in rendered and "`du -sh VENV`" in rendered and "GiB" in rendered


RENDER_COSTS = """
import sys
from pathlib import Path
from benchmarks.report import tables_costs
out = Path(sys.argv[1])
for arg in sys.argv[2:]:  # renderer:record
    name, record = arg.split(":")
    print(getattr(tables_costs, name)(out / record))
"""


def test_check_cost_and_syscall_recorders_smoke(tmp_path: Path) -> None:
    """record_outputs.py's check-cost and syscall, at tiny sizes, write records (one
    median per space and mode, per call) that tables_costs.py renders."""
    out = tmp_path / "outputs"
    run("report.record_outputs", "--out", str(out), "check-cost", "--rounds", "1", "--number", "20",
        cwd=tmp_path)  # fmt: skip
    run("report.record_outputs", "--out", str(out), "syscall", "--rounds", "2", "--number", "50",
        cwd=tmp_path)  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == ["check_cost.json", "syscall_cost.json"]
    check = json.loads((out / "check_cost.json").read_text())
    (r,) = check["runs"]
    assert r["command"] == "python -m benchmarks.probes.check_cost --rounds 1 --number 20"
    rerun = "python -m benchmarks.report.record_outputs check-cost --rounds 1 --number 20"
    assert check["rerun"] == rerun
    assert {"git_commit", "nproc"} <= set(check["machine"])
    p = r["parsed"]
    assert p["modes"] == ["safe", "strict", "off"] and p["config"]["n_envs"] == 64
    assert len(p["cases"]) == 5 * 3 and all(len(c["rounds_us"]) == 1 for c in p["cases"])
    assert all(c["median_us"] > 0 for c in p["cases"])
    sys_calls = json.loads((out / "syscall_cost.json").read_text())["runs"][0]["parsed"]["calls"]
    assert set(sys_calls) == {"perf_counter_ns", "getppid", "poll", "pipe_write_read"}
    assert all(len(c["rounds_ns"]) == 2 and c["median_ns"] > 0 for c in sys_calls.values())
    rendered = run_code(
        RENDER_COSTS, str(out), "check_cost_table:check_cost.json",
        "syscall_sentence:syscall_cost.json", cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert '| µs per valid batch of 64 | `"safe"` | `"strict"` | `"off"` |' in rendered
    assert "| MultiBinary(8), int64 batch | " in rendered
    assert "A bare syscall (`os.getppid()`) costs " in rendered
    rerun = "python -m benchmarks.report.record_outputs syscall --rounds 2 --number 50"
    assert f"rerun: `{rerun}`" in rendered


def test_ray_call_recorder_smoke(tmp_path: Path) -> None:
    """record_outputs.py ray-call, at a tiny size, records every round trip (Ray started
    and shut down in the script) and tables_costs.py renders them."""
    pytest.importorskip("ray")
    out = tmp_path / "outputs"
    run("report.record_outputs", "--out", str(out), "ray-call", "--rounds", "1", "--calls", "3",
        "--warmup", "0.2", cwd=tmp_path)  # fmt: skip
    report = json.loads((out / "ray_call.json").read_text())
    (r,) = report["runs"]
    assert r["command"] == "python -m benchmarks.probes.ray_call --rounds 1 --calls 3 --warmup 0.2"
    kinds = r["parsed"]["kinds"]
    assert set(kinds) == {"pipe", "ray_bare", "ray_arrays", "ray_packed"}
    assert all(k["median_us"] > 0 and len(k["rounds_us"]) == 1 for k in kinds.values())
    assert len(r["parsed"]["packed_over_arrays"]["per_round"]) == 1
    rendered = run_code(
        RENDER_COSTS, str(out), "ray_call_table:ray_call.json", cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert "| Ray actor call, nothing carried | " in rendered
    assert "x the time of a tuple of arrays (median of the per-round ratios" in rendered


WORKER_NOISE = """
import sys
from pathlib import Path
from benchmarks.report import tables_costs
print(tables_costs.worker_noise_sentence([Path(sys.argv[1])]))
"""


def test_worker_noise_reads_every_recorded_worker_view(tmp_path: Path) -> None:
    """The busiest worker's lead is read from each run's ``straggler:`` line, whichever way
    the line reads; a run that printed no worker view is passed over."""
    quiet = "straggler: none (worker_1 has the most env time, 0.5% above the median 1.14 s: ...)"
    named = (
        "straggler: worker_0 spent 1.50 s in env calls (10 calls, 150 ms each), "
        "31.2% above the median 1.14 s (named from 20%); fastest: worker_1, 1.10 s"
    )
    runs = [{"command": f"python x.py --seed {i}", "stdout": f"...\n{line}\n"}
            for i, line in enumerate((quiet, named, "no worker view"))]  # fmt: skip
    record = tmp_path / "runs.json"
    record.write_text(json.dumps({"runs": runs}), encoding="utf-8")
    rendered = run_code(WORKER_NOISE, str(record), cwd=tmp_path, timeout=60)
    assert "In the 2 recorded runs of the demo and the examples" in rendered
    assert "env time was 0.5-31.2% above the median worker's" in rendered
    assert f"`{record}`" in rendered
