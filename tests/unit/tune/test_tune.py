"""``envmgr tune``: every layout that applies is measured against the ceiling, the winner is one
of them and its printed call builds it; the findings are read from real workers' timers.

Budgets are tiny (a second or two of stepping): these tests check what is measured and said,
never how fast anything is.
"""

from __future__ import annotations

import math
import subprocess
import sys
from time import perf_counter

import gymnasium as gym
import pytest
from support.envs import BigInfoEnv, DictActionEnv

import envmgr
from envmgr import SubprocessEnvManager, timers
from envmgr.tune import Layout, tune
from envmgr.tune.diagnose import explain, findings, read_layout
from envmgr.tune.layouts import LayoutRunner, candidate_layouts
from envmgr.tune.run import usable_cores
from envmgr.tune.targets import EnvIdTarget

pytestmark = pytest.mark.timeout(300)


def _timed_steps(envs: SubprocessEnvManager, batches: int) -> tuple[dict, float]:
    """Steps ``envs`` under a node of a private timer stack; returns that node and the time."""
    stack = timers.TimerStack()

    def run() -> float:
        envs.reset(seed=0)
        envs.action_space.seed(0)
        actions = [envs.action_space.sample() for _ in range(8)]
        with timers.hierarchical_timer("layout"):
            t0 = perf_counter()
            for k in range(batches):
                envs.step(actions[k % len(actions)])
            return perf_counter() - t0

    seconds = timers.run_in_stack(stack, run)
    tree = timers.get_timer_tree(stack)
    return tree["children"]["layout"], seconds


def test_every_layout_is_measured_and_the_call_builds_the_winner() -> None:
    timers.reset_timers()
    with timers.hierarchical_timer("mine"):
        result = tune("CartPole-v1", num_envs=4, seconds=2.0, rounds=2)
    # The caller's timers are untouched: the layouts were timed in a stack of their own.
    mine = timers.get_timer_tree()["children"]
    assert set(mine) == {"mine"} and not mine["mine"].get("children")
    cores = usable_cores()
    expected = candidate_layouts(4, cores, has_vector_entry_point=True)
    assert [m.layout for m in result.measurements] == expected
    assert sum(m.layout.default for m in result.measurements) == 1
    assert len(result.ceiling) == 2 and all(x > 0 for x in result.ceiling)
    assert result.vector_ceiling is not None and len(result.vector_ceiling) == 2
    for m in result.measurements:
        assert len(m.rates) == 2 and all(math.isfinite(x) and x > 0 for x in m.rates), m.label
        assert m.ratios == [x / c for x, c in zip(m.rates, result.ceiling, strict=True)]
        assert m.reading is not None and m.reading.batches > 0, m.label
        node = result.tree["children"][m.label]
        assert "workers" in node["children"], f"{m.label}: no merged worker timers"
        groups = {g.name for g in m.reading.groups}
        assert groups >= {f"worker_{i}" for i in range(m.layout.n_workers)}, (m.label, groups)
        assert ("worker_caller" in groups) == bool(m.layout.caller_envs), (m.label, groups)
    assert result.best in result.measurements
    assert result.best.rate == max(m.rate for m in result.measurements)
    # The call to copy builds the winning layout.
    assert result.call.startswith('envmgr.make("CartPole-v1", num_envs=4, ')
    with eval(result.call, {"envmgr": envmgr}) as envs:  # noqa: S307 - our own output
        assert envs.num_envs == 4
        assert envs.n_workers == result.best.layout.n_workers
        assert envs.caller_envs == result.best.layout.caller_envs
    text = result.format()
    for m in result.measurements:
        assert m.label in text
    assert result.call in text and "Why:" in text and "ceiling" in text


def test_infos_pickled_every_step_is_read_from_send_response() -> None:
    # 20,000 float64s of infos per step: each answer is pickled and piped, 160 kB a step.
    with SubprocessEnvManager(lambda: BigInfoEnv(20_000), 2, 1) as envs:
        node, seconds = _timed_steps(envs, 100)
    layout = Layout(2, default=True)
    reading = read_layout(node, 100, seconds)
    said = findings(layout, reading, cores=2, pickled_keys=["frame"])
    assert any(s.startswith("infos pickled every step: ") and "frame" in s for s in said), said
    # Without pickled infos, the same answers say nothing about pickling.
    assert not any("infos pickled" in s for s in findings(layout, reading, 2, pickled_keys=[]))


def test_worker_imbalance_names_the_slow_worker() -> None:
    slow, fast = (lambda: DictActionEnv(0.002)), (lambda: DictActionEnv())
    with SubprocessEnvManager([fast, fast, slow, slow], n_workers=2) as envs:
        node, seconds = _timed_steps(envs, 30)
    reading = read_layout(node, 30, seconds)
    assert [g.name for g in reading.groups] == ["worker_0", "worker_1"]
    said = findings(Layout(2, default=True), reading, cores=2, pickled_keys=[])
    assert any(s.startswith("worker imbalance: worker_1 ") for s in said), said


def test_the_callers_own_work_is_said_where_it_holds_the_layout_back() -> None:
    """Beside CartPole's few-µs steps the caller's own work is many times its env calls,
    and holds the layout back; beside 20 ms steps it is too small to say."""
    layout = Layout(1, caller_envs=2)
    said = {}
    for name, factory, batches in [
        ("cheap", lambda: gym.make("CartPole-v1"), 200),
        ("slow", lambda: DictActionEnv(0.02), 5),
    ]:
        with SubprocessEnvManager([factory] * 4, n_workers=1, caller_envs=2) as envs:
            node, seconds = _timed_steps(envs, batches)
        said[name] = findings(layout, read_layout(node, batches, seconds), 2, pickled_keys=[])
    (line,) = [s for s in said["cheap"] if s.startswith("the caller's own work: ")]
    share = int(line.split(" (")[1].split("%")[0])
    bound = float(line.split("runs at about ")[1].split()[0])
    assert share >= 10 and "beside its 2 envs'" in line, line
    assert bound == pytest.approx(1 / (1 + share / 100), abs=0.011), line
    assert not any(s.startswith("the caller's own work") for s in said["slow"]), said["slow"]


def test_why_a_caller_or_hosted_layout_wins_reads_both_trees() -> None:
    default, caller = Layout(2, default=True), Layout(1, caller_envs=2, hosted=True)
    with envmgr.make("CartPole-v1", 4, n_workers=2) as envs:
        node, seconds = _timed_steps(envs, 50)
    readings = {default: read_layout(node, 50, seconds)}
    with envmgr.make("CartPole-v1", 4, **caller.make_kwargs()) as envs:
        node, seconds = _timed_steps(envs, 50)
    readings[caller] = read_layout(node, 50, seconds)
    assert [g.name for g in readings[caller].groups] == ["worker_0", "worker_caller"]
    why = explain(caller, default, readings, num_envs=4)
    assert why[0].startswith("each worker steps its 2 envs in one batched call: "), why
    assert any(line.startswith("the caller steps 2 envs itself ") for line in why), why
    assert any("runs those envs in your process" in line for line in why), why
    assert explain(default, default, readings, num_envs=4) == []


def _broken_vector_env(num_envs: int, **kwargs: object) -> gym.vector.VectorEnv:
    raise ModuleNotFoundError("No module named 'not_installed_here'")


def test_a_vector_entry_point_that_cannot_be_built_leaves_the_hosted_layouts_out() -> None:
    spec = gym.envs.registration.EnvSpec(
        "TuneBrokenVector-v0",
        entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
        vector_entry_point=_broken_vector_env,
        max_episode_steps=500,
    )
    result = tune(spec, num_envs=2, seconds=1.0, rounds=1)
    assert result.vector_ceiling is None
    assert [m.layout for m in result.measurements] == candidate_layouts(2, usable_cores(), False)
    assert len(result.skipped) == 1 and "not_installed_here" in result.skipped[0]
    assert "Not measured: hosted layouts (ceiling process 0 failed" in " ".join(
        result.format().split()
    )


def test_a_vector_entry_point_of_other_envs_leaves_the_hosted_layouts_out() -> None:
    """ALE's vector entry point steps stacked 84x84 grey frames, its ``ALE/Pong-v5`` RGB
    screens: faster, but not the env asked for, so never a layout to pick. The id is
    given as gym.make takes it, and the call to copy keeps the package that registers it."""
    pytest.importorskip("ale_py")
    result = tune("ale_py:ALE/Pong-v5", num_envs=2, seconds=1.0, rounds=1)
    assert result.vector_ceiling is None
    assert [m.layout for m in result.measurements] == candidate_layouts(2, usable_cores(), False)
    assert result.skipped == [
        "hosted layouts (the vector entry point's observation space is "
        "Box(0, 255, (4, 84, 84), uint8), the env's Box(0, 255, (210, 160, 3), uint8))"
    ]
    assert result.best.call.startswith('envmgr.make("ale_py:ALE/Pong-v5", num_envs=2'), result.best
    with eval(result.best.call, {"envmgr": envmgr}) as envs:  # noqa: S307 - our own output
        assert envs.single_observation_space.shape == (210, 160, 3)


def test_the_runner_records_the_info_keys_a_step_returns() -> None:
    spec = gym.spec("CartPole-v1")
    runner = LayoutRunner(Layout(1, default=True), EnvIdTarget(spec), 2)
    try:
        assert runner.info_keys == runner.pickled_keys == []
        assert runner.run(0.05) > 0 and runner.batches > 0
    finally:
        runner.close()
    info_spec = gym.envs.registration.EnvSpec("TuneBigInfo-v0", entry_point=BigInfoEnv)
    # Four float64s fit an info column; a thousand (8 kB) pickle.
    for size, pickled in ((4, []), (1000, ["frame"])):
        runner = LayoutRunner(
            Layout(1, first_ready=True), EnvIdTarget(info_spec, {"size": size}), 2
        )
        try:
            assert runner.info_keys == ["frame"] and runner.pickled_keys == pickled, size
            assert runner.run(0.05) > 0 and runner.env_steps % 2 == 0
        finally:
            runner.close()


@pytest.mark.parametrize(
    ("num_envs", "cores", "vector", "expected"),
    [
        (8, 2, True, ["step 2x4", "step 4x2", "first-ready 2x4", "step 1x4 + caller 4",
                      "hosted 2x4", "hosted 1x4 + caller 4"]),
        (8, 2, False, ["step 2x4", "step 4x2", "first-ready 2x4", "step 1x4 + caller 4"]),
        (3, 1, False, ["step 1x3", "step 2 workers, 3 envs"]),
        (1, 4, True, ["step 1x1", "hosted 1x1"]),
    ],
)  # fmt: skip
def test_candidate_layouts(num_envs: int, cores: int, vector: bool, expected: list[str]) -> None:
    layouts = candidate_layouts(num_envs, cores, vector)
    assert [layout.label(num_envs) for layout in layouts] == expected
    assert layouts[0].default and not any(layout.default for layout in layouts[1:])


def test_calls_are_python_with_double_quotes() -> None:
    layout = Layout(1, caller_envs=4, hosted=True)
    assert layout.call("CartPole-v1", 8, {"max_episode_steps": 100}) == (
        'envmgr.make("CartPole-v1", num_envs=8, n_workers=1, '
        'vectorization_mode="vector_entry_point", vector_kwargs={"caller_envs": 4}, '
        "max_episode_steps=100)"
    )
    assert "recv(batch_size=4)" in Layout(2, first_ready=True).usage(4)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"num_envs": 0}, "num_envs"),
        ({"seconds": 0.0}, "seconds"),
        ({"seconds": math.inf}, "seconds"),
        ({"rounds": 0}, "rounds"),
        ({"env_kwargs": {"copy": False}}, "vector_kwargs"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(kwargs: dict, fragment: str) -> None:
    with pytest.raises((ValueError, TypeError), match=fragment):
        tune("CartPole-v1", **kwargs)


def test_cli_prints_the_table_the_call_and_why() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "envmgr", "tune", "CartPole-v1", "--num-envs", "2"]
        + ["--seconds", "1", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("envmgr tune CartPole-v1: 2 envs on "), out
    for label in [layout.label(2) for layout in candidate_layouts(2, usable_cores(), True)]:
        assert label in out, (label, out)
    assert "ceiling (" in out and "env-steps/s" in out
    assert '    envmgr.make("CartPole-v1", num_envs=2, ' in out
    assert "\nWhy:\n  - " in out
    assert "Traceback" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr
    assert all(line.startswith("envmgr tune: ") for line in proc.stderr.splitlines())


@pytest.mark.parametrize(
    ("env_id", "says"),
    [
        ("NoSuchEnv-v0", ""),
        # Gymnasium 1.x knows ALE/... only once ale_py is imported: the usage error gives
        # the form that imports it.
        ("ALE/NoSuchGame-v5", "envmgr tune ale_py:ALE/NoSuchGame-v5"),
    ],
)
def test_cli_unknown_env_is_a_usage_error(env_id: str, says: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "envmgr", "tune", env_id],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith(f"envmgr tune: error: {env_id}: "), proc.stderr
    assert says in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1


def test_first_ready_collects_every_env_at_the_deadline() -> None:
    # A worker left in flight would make the next run's send() refuse (already pending).
    spec = gym.spec("CartPole-v1")
    runner = LayoutRunner(Layout(2, first_ready=True), EnvIdTarget(spec), 4)
    try:
        for _ in range(3):
            assert runner.run(0.05) > 0
        envs = runner.envs
        envs.reset(seed=1)  # a reset is refused while any worker still has a step in flight
        assert envs.step(runner.actions[0])[0].shape == (4, 4)
    finally:
        runner.close()


# ------------------------------------------------------------ the ceiling's process shell


def test_block_processes_call_each_block_and_answer_in_order() -> None:
    """Each process builds its own block and calls what it is told; answers come in order."""
    import io
    import multiprocessing as mp

    from envmgr.tune.ceiling import BlockProcesses

    procs = BlockProcesses(mp.get_context("fork"), [io.StringIO, io.StringIO], name="t")
    try:
        pids = [p.pid for p in procs.procs]
        procs.send(0, "write", "ab")
        procs.send(1, "write", "cde")
        assert procs.gather(30.0, "write") == [2, 3]
        procs.post("getvalue")
        assert procs.gather(30.0, "read") == ["ab", "cde"]
    finally:
        procs.close()
    assert procs.procs == [] and all(not _alive(pid) for pid in pids)


@pytest.mark.parametrize(
    ("builder", "said"),
    [
        (lambda: int("x"), "ceiling process 1 failed to build its envs: ValueError"),
        (lambda: __import__("os")._exit(3), "ceiling process 1 exited while trying to build"),
        (lambda: __import__("time").sleep(30), "ceiling process 1 did not build its envs within"),
    ],
    ids=["raises", "exits", "hangs"],
)
def test_block_processes_name_the_process_that_failed_to_build(builder, said) -> None:  # type: ignore[no-untyped-def]
    """A failed, dead or silent process is a TuneError naming it, and none is left behind."""
    import io
    import multiprocessing as mp

    from envmgr.errors import RemoteTraceback
    from envmgr.tune.ceiling import BlockProcesses, TuneError

    before = {p.pid for p in mp.active_children()}
    with pytest.raises(TuneError, match=said) as info:
        BlockProcesses(mp.get_context("fork"), [io.StringIO, builder], start_timeout=1.0)
    if "failed" in said:  # the whole remote traceback is the cause
        assert isinstance(info.value.__cause__, RemoteTraceback)
        assert "in _child" in str(info.value.__cause__)
    assert {p.pid for p in mp.active_children()} <= before


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
