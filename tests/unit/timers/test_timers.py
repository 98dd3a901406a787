"""Behavioural tests for envmgr.timers (no wall-clock thresholds)."""

from __future__ import annotations

import copy
import gc
import json
import multiprocessing
import os
import pickle
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from envmgr import timers
from envmgr.timers import (
    TIMER_FORMAT_VERSION,
    GaugeNode,
    TimerNode,
    TimerStack,
    add_metadata,
    get_default_stack,
    get_timer_root,
    get_timer_tree,
    hierarchical_timer,
    merge_gauges,
    register_flush_hook,
    reset_timers,
    set_gauge,
    timed,
    write_timing_tree,
)

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="requires os.fork")


@pytest.fixture(autouse=True)
def _isolate() -> Iterator[None]:
    # Tests share the main thread's default stack and the global hook list.
    reset_timers()
    saved_hooks = list(timers.tree._flush_hooks)
    yield
    timers.tree._flush_hooks[:] = saved_hooks
    reset_timers()


def _tree(*, total: float, count: int, **children: TimerNode) -> TimerNode:
    node = TimerNode(total, count)
    node.children.update(children)
    return node


# --- timing and nesting -------------------------------------------------------------------


def test_nesting_and_counts() -> None:
    with hierarchical_timer("outer") as outer:
        for _ in range(3):
            with hierarchical_timer("inner"):
                pass
        with hierarchical_timer("other"):
            pass
    with hierarchical_timer("outer"):
        pass

    root = get_timer_root()
    assert root.children["outer"] is outer
    assert outer.count == 2
    assert outer.children["inner"].count == 3
    assert outer.children["other"].count == 1
    assert outer.total >= outer.children["inner"].total + outer.children["other"].total
    assert get_default_stack().stack == [root]


def test_same_name_at_different_paths_is_distinct() -> None:
    with hierarchical_timer("a"):
        with hierarchical_timer("x"):
            pass
    with hierarchical_timer("x"):
        pass
    root = get_timer_root()
    assert root.children["x"] is not root.children["a"].children["x"]
    assert root.children["x"].count == root.children["a"].children["x"].count == 1


def test_exception_records_time_pops_and_propagates() -> None:
    stack = TimerStack()
    with pytest.raises(ValueError, match="boom"):
        with hierarchical_timer("outer", stack):
            with hierarchical_timer("fails", stack):
                time.sleep(0.001)
                raise ValueError("boom")
    fails = stack.root.children["outer"].children["fails"]
    assert fails.count == 1
    assert fails.total > 0.0
    assert stack.stack == [stack.root]
    with hierarchical_timer("after", stack):
        pass
    assert set(stack.root.children) == {"outer", "after"}


def test_explicit_stack_leaves_default_untouched() -> None:
    stack = TimerStack()
    with hierarchical_timer("private", stack) as node:
        assert stack.current() is node
    assert "private" in stack.root.children
    assert get_timer_root().children == {}


def test_stack_push_pop_current() -> None:
    stack = TimerStack()
    assert stack.current() is stack.root
    node = stack.push("a")
    assert stack.current() is node is stack.root.children["a"]
    stack.pop()
    assert stack.current() is stack.root
    with pytest.raises(RuntimeError):
        stack.pop()


def test_timer_instance_reuse_and_reentry() -> None:
    stack = TimerStack()
    timer = hierarchical_timer("t", stack)
    with timer:
        with pytest.raises(RuntimeError):
            with timer:
                pass
    with timer:
        pass
    assert stack.root.children["t"].count == 2
    assert stack.stack == [stack.root]


def test_hierarchical_timer_as_decorator() -> None:
    stack = TimerStack()

    @hierarchical_timer("decorated", stack)
    def work(x: int) -> int:
        return x + 1

    assert work(1) == 2 and work(2) == 3
    assert work.__name__ == "work"
    assert stack.root.children["decorated"].count == 2


def test_reset_inside_open_timer_keeps_new_stack_usable() -> None:
    stack = TimerStack()
    with hierarchical_timer("old", stack):
        stack.reset()
    assert stack.stack == [stack.root]
    assert stack.root.children == {}
    with hierarchical_timer("new", stack):
        pass
    assert list(stack.root.children) == ["new"]


def test_out_of_order_exit_removes_the_right_timer() -> None:
    stack = TimerStack()

    def gen() -> Iterator[int]:
        with hierarchical_timer("in_generator", stack):
            yield 1

    g = gen()
    next(g)  # "in_generator" is now open
    with hierarchical_timer("outer_block", stack) as outer:
        with pytest.raises(StopIteration):
            next(g)  # closes "in_generator" while "outer_block" is innermost
        assert stack.current() is outer
    assert stack.stack == [stack.root]


def test_timed_uses_qualname_and_wraps() -> None:
    class Env:
        @timed
        def step(self, action: int) -> int:
            """Step docstring."""
            return action * 2

    @timed
    def helper() -> str:
        return "ok"

    env = Env()
    assert env.step(3) == 6 and env.step(4) == 8
    assert helper() == "ok"
    assert Env.step.__doc__ == "Step docstring."
    assert Env.step.__name__ == "step"

    children = get_timer_root().children
    step_name = "test_timed_uses_qualname_and_wraps.<locals>.Env.step"
    assert children[step_name].count == 2
    assert children["test_timed_uses_qualname_and_wraps.<locals>.helper"].count == 1


def test_timed_nests_under_open_timer() -> None:
    @timed
    def leaf() -> None:
        pass

    with hierarchical_timer("outer"):
        leaf()
    assert list(get_timer_root().children["outer"].children) == [leaf.__qualname__]


def test_reset_timers() -> None:
    with hierarchical_timer("a"):
        pass
    set_gauge("g", 1.0)
    add_metadata("k", "v")
    old_root = get_default_stack().root
    reset_timers()
    stack = get_default_stack()
    assert stack.root is not old_root
    assert stack.root.children == {}
    assert stack.stack == [stack.root]
    assert stack.gauges == {}
    assert "k" not in stack.metadata
    assert stack.metadata["timer_format_version"] == TIMER_FORMAT_VERSION


def test_root_total_is_wall_time_since_reset() -> None:
    before = time.perf_counter()
    reset_timers()
    with hierarchical_timer("child"):
        time.sleep(0.002)
    root = get_timer_root()
    after = time.perf_counter()
    assert root.count == 1
    assert root.children["child"].total <= root.total <= after - before
    # The root total keeps growing: it is re-read from the clock each time.
    assert get_timer_root().total >= root.total


# --- merging ------------------------------------------------------------------------------


def test_merge_adds_recursively() -> None:
    mine = _tree(total=0.0, count=0, a=_tree(total=1.0, count=2, b=_tree(total=0.5, count=2)))
    other = _tree(
        total=3.0,
        count=1,
        a=_tree(total=2.0, count=3, b=_tree(total=1.0, count=3), c=_tree(total=0.25, count=1)),
    )
    mine.merge(other, is_parallel=False)
    a = mine.children["a"]
    assert (mine.total, mine.count) == (3.0, 1)
    assert (a.total, a.count) == (3.0, 5)
    assert (a.children["b"].total, a.children["b"].count) == (1.5, 5)
    assert (a.children["c"].total, a.children["c"].count) == (0.25, 1)
    assert not any(n.is_parallel for n in (mine, a, a.children["b"], a.children["c"]))
    # The source is left alone and not aliased.
    assert other.children["a"].count == 3
    assert a.children["c"] is not other.children["a"].children["c"]


def test_merge_into_root_name_flags_only_merged_nodes() -> None:
    parent = _tree(total=0.0, count=0, local=_tree(total=1.0, count=1))
    parent.get_child("workers").get_child("untouched").add_time(0.1)
    worker = _tree(total=2.0, count=1, step=_tree(total=1.5, count=10, inner=TimerNode(1.0, 10)))

    parent.merge(worker, root_name="workers")
    parent.merge(worker, root_name="workers")

    workers = parent.children["workers"]
    assert (workers.total, workers.count) == (4.0, 2)
    assert (workers.children["step"].total, workers.children["step"].count) == (3.0, 20)
    assert workers.is_parallel
    assert workers.children["step"].is_parallel
    assert workers.children["step"].children["inner"].is_parallel
    assert not parent.is_parallel
    assert not parent.children["local"].is_parallel
    assert not workers.children["untouched"].is_parallel


def test_merge_keeps_parallel_flags_of_source() -> None:
    mine = TimerNode()
    other = _tree(total=1.0, count=1, sub=TimerNode(1.0, 1, is_parallel=True))
    mine.merge(other, is_parallel=False)
    assert not mine.is_parallel
    assert mine.children["sub"].is_parallel


def test_add_time_with_count() -> None:
    node = TimerNode()
    node.add_time(0.5)
    node.add_time(1.5, count=4)
    assert (node.total, node.count) == (2.0, 5)


# --- JSON ---------------------------------------------------------------------------------


def test_json_shape() -> None:
    stack = TimerStack()
    with hierarchical_timer("leaf", stack):
        pass
    # Concurrent workers: children add up to more than their parallel parent.
    worker = _tree(total=1.0, count=1, w=TimerNode(5.0, 1))
    stack.root.merge(worker, root_name="workers")
    stack.set_gauge("reward", 2.0)
    stack.add_metadata("env", "CartPole-v1")

    tree = stack.get_timing_tree()
    assert tree["name"] == "root"
    assert tree["count"] == 1
    assert isinstance(tree["total"], float)
    assert tree["gauges"] == {"reward": {"value": 2.0, "min": 2.0, "max": 2.0, "count": 1}}
    meta = tree["metadata"]
    assert meta["env"] == "CartPole-v1"
    assert meta["timer_format_version"] == TIMER_FORMAT_VERSION == "0.1.0"
    assert meta["python_version"] == sys.version
    assert meta["command_line_arguments"] == " ".join(sys.argv)
    assert int(meta["start_time_seconds"]) <= int(meta["end_time_seconds"])
    assert all(isinstance(v, str) for v in meta.values())
    assert "is_parallel" not in tree

    leaf = tree["children"]["leaf"]
    assert "children" not in leaf
    assert "is_parallel" not in leaf
    assert leaf["self"] == leaf["total"]

    workers = tree["children"]["workers"]
    assert workers["is_parallel"] is True
    assert workers["self"] == 0.0
    assert workers["children"]["w"]["is_parallel"] is True

    assert tree["self"] >= 0.0
    assert json.loads(json.dumps(tree)) == tree


def test_json_self_is_total_minus_children() -> None:
    node = _tree(total=3.0, count=1, a=TimerNode(1.0, 1), b=TimerNode(0.5, 2))
    d = node.to_dict()
    assert d["self"] == pytest.approx(1.5)
    assert d["children"]["b"] == {"total": 0.5, "count": 2, "self": 0.5}


def test_get_timing_tree_for_subnode() -> None:
    stack = TimerStack()
    with hierarchical_timer("a", stack) as a:
        with hierarchical_timer("b", stack):
            pass
    sub = stack.get_timing_tree(a)
    assert "name" not in sub and "metadata" not in sub
    assert set(sub["children"]) == {"b"}


def test_to_dict_from_dict_round_trip() -> None:
    root = _tree(total=2.0, count=1, a=_tree(total=1.0, count=4, b=TimerNode(0.5, 4)))
    root.merge(_tree(total=1.0, count=1, w=TimerNode(0.75, 3)), root_name="workers")
    d = root.to_dict()
    again = TimerNode.from_dict(d)
    assert again.to_dict() == d
    assert again.children["workers"].is_parallel
    assert not again.children["a"].is_parallel


def test_from_dict_reads_ml_agents_timers_json() -> None:
    ml_agents_doc: dict[str, Any] = {
        "name": "root",
        "gauges": {"Env.Reward.mean": {"value": 1.0, "min": 0.0, "max": 2.0, "count": 3}},
        "metadata": {"timer_format_version": "0.1.0", "start_time_seconds": "1600000000"},
        "total": 10.5,
        "count": 1,
        "self": 0.5,
        "children": {
            "TrainerController.start_learning": {
                "total": 10.0,
                "count": 1,
                "self": 1.0,
                "children": {
                    "env_step": {
                        "total": 9.0,
                        "count": 100,
                        "self": 9.0,
                        "is_parallel": True,
                    }
                },
            }
        },
    }
    root = TimerNode.from_dict(ml_agents_doc)
    assert (root.total, root.count) == (10.5, 1)
    start = root.children["TrainerController.start_learning"]
    assert (start.total, start.count, start.is_parallel) == (10.0, 1, False)
    step = start.children["env_step"]
    assert (step.total, step.count, step.is_parallel) == (9.0, 100, True)
    assert step.children == {}
    expected = {k: v for k, v in ml_agents_doc.items() if k not in ("name", "gauges", "metadata")}
    assert root.to_dict() == expected


def test_write_timing_tree(tmp_path: Any) -> None:
    with hierarchical_timer("written"):
        pass
    path = tmp_path / "timers.json"
    write_timing_tree(path)
    text = path.read_text()
    assert text.startswith('{\n    "name": "root"')
    data = json.loads(text)
    assert data["children"]["written"]["count"] == 1


# --- pickling -----------------------------------------------------------------------------


def test_pickle_round_trip() -> None:
    root = _tree(
        total=1.25,
        count=1,
        env_step=_tree(total=0.75, count=1000, step=TimerNode(0.5, 1000)),
        communicate=_tree(total=0.25, count=1000, recv=TimerNode(0.125, 1000, is_parallel=True)),
    )
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        clone = pickle.loads(pickle.dumps(root, protocol=protocol))
        assert type(clone) is TimerNode
        assert clone.to_dict() == root.to_dict()
        assert list(clone.children) == list(root.children)
        assert clone.children["communicate"].children["recv"].is_parallel
    deep = copy.deepcopy(root)
    assert deep.to_dict() == root.to_dict()
    assert deep.children["env_step"] is not root.children["env_step"]


def test_pickle_empty_and_gauge() -> None:
    assert pickle.loads(pickle.dumps(TimerNode())).to_dict() == TimerNode().to_dict()
    gauge = GaugeNode(1.0)
    gauge.update(-2.0)
    assert pickle.loads(pickle.dumps(gauge)).as_dict() == gauge.as_dict()


# --- gauges -------------------------------------------------------------------------------


def test_gauge_update_and_as_dict() -> None:
    gauge = GaugeNode(3.0)
    for value in (1.0, 5.0, 2.0):
        gauge.update(value)
    assert gauge.as_dict() == {"value": 2.0, "min": 1.0, "max": 5.0, "count": 4}
    assert GaugeNode.from_dict(gauge.as_dict()).as_dict() == gauge.as_dict()


def test_gauge_merge() -> None:
    mine = GaugeNode(0.0)
    mine.update(10.0)
    other = GaugeNode(-1.0)
    other.update(4.0)
    mine.merge(other)
    assert mine.as_dict() == {"value": 4.0, "min": -1.0, "max": 10.0, "count": 4}


def test_set_gauge_ignores_nan() -> None:
    set_gauge("loss", 1.0)
    set_gauge("loss", float("nan"))
    set_gauge("loss", 3.0)
    assert get_timer_tree()["gauges"]["loss"] == {"value": 3.0, "min": 1.0, "max": 3.0, "count": 2}


def test_merge_gauges_from_worker_stack() -> None:
    worker = TimerStack()
    worker.set_gauge("shared", 5.0)
    worker.set_gauge("worker_only", 7.0)
    set_gauge("shared", 1.0)

    merge_gauges(worker.gauges)
    get_default_stack().merge_gauges(worker.gauges)

    gauges = get_timer_tree()["gauges"]
    assert gauges["shared"] == {"value": 5.0, "min": 1.0, "max": 5.0, "count": 3}
    assert gauges["worker_only"] == {"value": 7.0, "min": 7.0, "max": 7.0, "count": 2}
    # Merging copies: the worker's gauges are not aliased or modified.
    assert get_default_stack().gauges["worker_only"] is not worker.gauges["worker_only"]
    assert worker.gauges["worker_only"].count == 1


# --- threads ------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_threads_have_separate_default_stacks() -> None:
    barrier = threading.Barrier(2)
    seen: dict[str, set[str]] = {}
    errors: list[BaseException] = []

    def worker(tag: str) -> None:
        try:
            barrier.wait()
            for _ in range(200):
                with hierarchical_timer(f"{tag}_outer"):
                    with hierarchical_timer(f"{tag}_inner"):
                        pass
            barrier.wait()  # both threads finished timing before either reads
            root = get_timer_root()
            seen[tag] = set(root.children)
            assert root.children[f"{tag}_outer"].count == 200
            assert get_default_stack().stack == [root]
        except BaseException as exc:  # surface assertion errors from the thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(tag,)) for tag in ("a", "b")]
    with hierarchical_timer("main_open"):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert seen == {"a": {"a_outer"}, "b": {"b_outer"}}
    assert set(get_timer_root().children) == {"main_open"}


# --- flush hooks --------------------------------------------------------------------------


def test_flush_hooks_run_before_module_reads_in_order() -> None:
    calls: list[tuple[str, TimerStack]] = []

    def first(stack: TimerStack) -> None:
        calls.append(("first", stack))
        # Data pulled in by a hook shows up in the same read.
        stack.root.merge(TimerNode(1.0, 1), root_name="pulled")

    unregister_first = register_flush_hook(first)
    register_flush_hook(lambda stack: calls.append(("second", stack)))

    tree = get_timer_tree()
    assert [name for name, _ in calls] == ["first", "second"]
    assert all(stack is get_default_stack() for _, stack in calls)
    assert tree["children"]["pulled"]["count"] == 1

    other = TimerStack()
    calls.clear()
    assert "pulled" in get_timer_root(other).children
    assert [stack for _, stack in calls] == [other, other]

    # TimerStack methods read directly, without hooks.
    calls.clear()
    get_default_stack().get_timing_tree()
    get_default_stack().get_root()
    assert calls == []

    unregister_first()
    unregister_first()  # idempotent
    get_timer_tree()
    assert [name for name, _ in calls] == ["second"]


def test_flush_hooks_run_for_write_timing_tree(tmp_path: Any) -> None:
    calls: list[TimerStack] = []
    register_flush_hook(calls.append)
    write_timing_tree(tmp_path / "t.json")
    assert calls == [get_default_stack()]


def test_bound_method_hook_is_held_weakly() -> None:
    class Manager:
        def __init__(self) -> None:
            self.flushes = 0

        def flush(self, stack: TimerStack) -> None:
            self.flushes += 1

    baseline = len(timers.tree._flush_hooks)
    manager = Manager()
    register_flush_hook(manager.flush)
    get_timer_tree()
    assert manager.flushes == 1

    manager_ref = weakref.ref(manager)
    del manager
    gc.collect()
    assert manager_ref() is None
    get_timer_tree()  # must not fail, and prunes the dead entry
    assert len(timers.tree._flush_hooks) == baseline


def test_plain_function_hook_is_held_strongly() -> None:
    calls: list[int] = []

    def make_hook() -> None:
        register_flush_hook(lambda stack: calls.append(1))

    make_hook()
    gc.collect()
    get_timer_tree()
    assert calls == [1]


def test_raising_hook_warns_once_and_does_not_break_read() -> None:
    after: list[int] = []

    def broken(stack: TimerStack) -> None:
        raise OSError("worker pipe closed")

    register_flush_hook(broken)
    register_flush_hook(lambda stack: after.append(1))
    with hierarchical_timer("x"):
        pass

    with pytest.warns(RuntimeWarning, match="worker pipe closed"):
        tree = get_timer_tree()
    assert tree["children"]["x"]["count"] == 1
    assert after == [1]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        get_timer_root()
    assert caught == []
    assert after == [1, 1]


def test_hook_reading_timers_does_not_recurse() -> None:
    calls: list[int] = []

    def reentrant(stack: TimerStack) -> None:
        calls.append(1)
        get_timer_tree(stack)

    register_flush_hook(reentrant)
    get_timer_tree()
    assert calls == [1]


# --- fork ---------------------------------------------------------------------------------


def _child_report() -> dict[str, Any]:
    stack = get_default_stack()
    report = {
        "children": sorted(stack.root.children),
        "depth": len(stack.stack),
        "gauges": sorted(stack.gauges),
        "hooks": len(timers.tree._flush_hooks),
    }
    with hierarchical_timer("in_child"):
        pass
    report["after"] = sorted(get_timer_tree()["children"])
    return report


@needs_fork
@pytest.mark.timeout(30)
def test_forked_child_starts_with_empty_stack_and_no_hooks() -> None:
    hook_calls: list[int] = []
    register_flush_hook(lambda stack: hook_calls.append(1))
    set_gauge("parent_gauge", 1.0)
    read_fd, write_fd = os.pipe()
    with hierarchical_timer("parent_open"):
        pid = os.fork()
        if pid == 0:  # child: never return into pytest
            code = 1
            try:
                os.close(read_fd)
                with os.fdopen(write_fd, "w") as out:
                    json.dump(_child_report(), out)
                code = 0
            finally:
                os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as inp:
        report = json.load(inp)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert report == {
        "children": [],
        "depth": 1,
        "gauges": [],
        "hooks": 0,
        "after": ["in_child"],
    }
    # The parent is unaffected.
    get_timer_tree()
    assert hook_calls == [1]
    assert "parent_open" in get_timer_root().children


def _mp_worker(conn: Any) -> None:
    with hierarchical_timer("worker_step"):
        pass
    conn.send((sorted(get_timer_root().children), len(timers.tree._flush_hooks), get_timer_root()))
    conn.close()


@needs_fork
@pytest.mark.timeout(30)
def test_multiprocessing_fork_worker_ships_root_to_parent() -> None:
    register_flush_hook(lambda stack: None)
    ctx = multiprocessing.get_context("fork")
    with hierarchical_timer("create_workers"):
        parent_conn, child_conn = ctx.Pipe()
        proc = ctx.Process(target=_mp_worker, args=(child_conn,))
        proc.start()
        child_conn.close()
        names, hooks, worker_root = parent_conn.recv()
        proc.join()
    assert proc.exitcode == 0
    assert names == ["worker_step"]
    assert hooks == 0

    get_timer_root().merge(worker_root, root_name="workers")
    tree = get_timer_tree()
    workers = tree["children"]["workers"]
    assert workers["is_parallel"] is True
    assert workers["children"]["worker_step"]["count"] == 1
