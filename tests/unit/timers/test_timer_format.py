"""The views of a timer tree in envmgr.timers.format and envmgr.timers.plot, on hand-built trees
(exact numbers) and on a hand-written ML-Agents-style timers.json (tests/data)."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from envmgr.timers import TimerStack, hierarchical_timer
from envmgr.timers.format import (
    TimerTreeError,
    check_tree,
    folded_stacks,
    format_gauges,
    format_tree,
    load_tree,
    worker_summary,
)

DATA = Path(__file__).resolve().parents[2] / "support" / "data"
MLAGENTS = DATA / "mlagents_timers.json"


def node(
    total: float,
    count: int,
    self_: float | None = None,
    parallel: bool = False,
    **children: dict[str, Any],
) -> dict[str, Any]:
    d: dict[str, Any] = {"total": total, "count": count}
    if parallel:
        d["is_parallel"] = True
    if self_ is not None:
        d["self"] = self_
    if children:
        d["children"] = children
    return d


def worker(
    wait: float,
    env_step: float,
    env_reset: float,
    step_self: float,
    send: float,
    own: float,
    steps: int = 100,
) -> dict[str, Any]:
    """A worker_<i> subtree in the shape the manager merges (all parallel)."""
    step_total = env_step + env_reset + step_self
    return node(
        wait + step_total + send + own,
        1,
        own,
        True,
        wait_command=node(wait, steps + 1, wait, True),
        step=node(
            step_total,
            steps,
            step_self,
            True,
            **{
                "env.step": node(env_step, 4 * steps, env_step, True),
                "env.reset": node(env_reset, 10, env_reset, True),
            },
        ),
        send_response=node(send, steps + 1, send, True),
        reset=node(0.0, 0, 0.0, True, **{"env.reset": node(0.0, 0, 0.0, True)}),
    )


def sum_trees(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(a)
    out["total"] += b["total"]
    out["count"] += b["count"]
    out["self"] += b["self"]
    for k, child in b.get("children", {}).items():
        out["children"][k] = sum_trees(out["children"][k], child)
    return out


W0 = worker(wait=5.0, env_step=2.375, env_reset=0.125, step_self=0.5, send=0.875, own=0.125)
W1 = worker(wait=3.0, env_step=4.25, env_reset=0.25, step_self=0.5, send=0.875, own=0.125)


def hand_tree() -> dict[str, Any]:
    """A parent loop with two workers; worker_1 spends more time in its envs."""
    workers = node(7.0, 100, 0.0, worker_root=sum_trees(W0, W1), worker_0=W0, worker_1=W1)
    return {
        "name": "root",
        "gauges": {"reward": {"value": 1.5, "min": 0.5, "max": 2.0, "count": 4}},
        "metadata": {"timer_format_version": "0.1.0"},
        **node(
            10.0,
            1,
            1.0,
            train=node(
                9.0,
                1,
                0.5,
                policy=node(1.0, 100, 1.0),
                env_step=node(7.5, 100, 0.5, workers=workers),
            ),
        ),
    }


HAND_FOLDED = """\
root 1000000
root;train 500000
root;train;policy 1000000
root;train;env_step 500000
root;train;env_step;workers;worker_0 125000
root;train;env_step;workers;worker_0;wait_command 5000000
root;train;env_step;workers;worker_0;step 500000
root;train;env_step;workers;worker_0;step;env.step 2375000
root;train;env_step;workers;worker_0;step;env.reset 125000
root;train;env_step;workers;worker_0;send_response 875000
root;train;env_step;workers;worker_1 125000
root;train;env_step;workers;worker_1;wait_command 3000000
root;train;env_step;workers;worker_1;step 500000
root;train;env_step;workers;worker_1;step;env.step 4250000
root;train;env_step;workers;worker_1;step;env.reset 250000
root;train;env_step;workers;worker_1;send_response 875000
"""

MLAGENTS_FOLDED = """\
root 300000
root;run_training.setup 20000
root;TrainerController.start_learning 280000
root;TrainerController.start_learning;TrainerController._reset_env 2100000
root;TrainerController.start_learning;TrainerController.advance 3000000
root;TrainerController.start_learning;TrainerController.advance;env_step 5000000
root;TrainerController.start_learning;TrainerController.advance;env_step;\
SubprocessEnvManager._take_step 2000000
root;TrainerController.start_learning;TrainerController.advance;env_step;\
SubprocessEnvManager._take_step;TorchPolicy.evaluate 18000000
root;TrainerController.start_learning;TrainerController.advance;env_step;workers 600000
root;TrainerController.start_learning;TrainerController.advance;env_step;workers;\
worker_root 4400000
root;TrainerController.start_learning;TrainerController.advance;env_step;workers;\
worker_root;UnityEnvironment.step 50000000
root;TrainerController.start_learning;TrainerController.advance;trainer_advance 1000000
root;TrainerController.start_learning;TrainerController.advance;trainer_advance;\
_update_policy 500000
root;TrainerController.start_learning;TrainerController.advance;trainer_advance;\
_update_policy;TorchPPOOptimizer.update 32500000
root;TrainerController.start_learning;TrainerController._save_models 100000
root;TrainerController.start_learning;TrainerController._save_models;\
RLTrainer._checkpoint 700000
"""


def table_row(text: str, name: str) -> list[str]:
    """The cells of the first table line whose name column (stripped of marks) is ``name``."""
    for line in text.splitlines():
        cells = line.split()
        label = [c for c in cells if c != "||"]
        if label and label[0] == name:
            return label
    raise AssertionError(f"no row {name!r} in:\n{text}")


# ------------------------------------------------------------------ folded stacks


def test_folded_stacks_exact() -> None:
    assert folded_stacks(hand_tree()) == HAND_FOLDED


def test_folded_stacks_mlagents_fixture_exact() -> None:
    assert folded_stacks(load_tree(MLAGENTS)) == MLAGENTS_FOLDED


def test_folded_stacks_sum_is_total_time_without_double_counting() -> None:
    total_us = sum(int(line.rsplit(" ", 1)[1]) for line in HAND_FOLDED.splitlines())
    # Parent's own time (root self + train self + policy + env_step self) + both workers.
    assert total_us == 1_000_000 + 500_000 + 1_000_000 + 500_000 + round(
        (W0["total"] + W1["total"]) * 1e6
    )


def test_folded_stacks_keep_worker_root_and_root_name() -> None:
    text = folded_stacks(hand_tree(), root_name="main", keep_worker_root=True)
    lines = text.splitlines()
    assert all(line.startswith("main") for line in lines)
    assert "main;train;env_step;workers;worker_root;wait_command 8000000" in lines
    assert "main;train;env_step;workers;worker_0;wait_command 5000000" in lines
    # The never-entered reset branch has no self time and so no line.
    assert not any(";reset" in line for line in lines)


def test_folded_stacks_computes_missing_self_and_sanitises_names() -> None:
    tree = {"total": 3.0, "children": {"a;b": {"total": 2.0, "children": {"c\nd": {"total": 0.5}}}}}
    assert folded_stacks(tree) == "root 1000000\nroot;a:b 1500000\nroot;a:b;c d 500000\n"


def test_folded_stacks_rounds_to_integer_microseconds_and_skips_zero() -> None:
    tree = {
        "name": "r",
        "total": 1e-6 * 2.6,
        "self": 1e-6 * 2.6,
        "children": {"z": {"total": 0.0, "self": 0.0}, "tiny": {"total": 4e-7}},
    }
    assert folded_stacks(tree) == "r 3\n"


# ------------------------------------------------------------------ text tree


def test_format_tree_columns_and_values() -> None:
    text = format_tree(hand_tree())
    header = text.splitlines()[0].split()
    assert header == ["name", "total", "count", "self", "%parent", "per", "call"]
    assert table_row(text, "root")[:5] == ["root", "10.000", "s", "1", "1.000"]
    # policy: 1 s over 100 calls -> 10 ms per call, 11.1% of train's 9 s.
    assert table_row(text, "policy") == [
        "policy",
        "1.000",
        "s",
        "100",
        "1.000",
        "s",
        "11.1%",
        "10.000",
        "ms",
    ]
    # worker_root: 18 s of worker time under a 7 s wait: marked parallel, and on the workers'
    # clock, so no share of the parent (it would be 257%): total, count, self, per call.
    assert table_row(text, "worker_root") == ["worker_root", "18.000", "s", "2", "250.000", "ms",
                                              "9.000", "s"]  # fmt: skip
    assert "|| worker_0" in text and "|| worker_1" in text
    assert "|| = parallel" in text and "exceed the parent's" in text
    assert "% is of the worker's own wall time" in text


def shares(text: str) -> dict[str, list[float]]:
    """Every row's %parent figure, by name (a name can occur under several workers)."""
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        cells = [c for c in line.split() if c != "||"]
        pct = [c for c in cells if re.fullmatch(r"[\d.]+%", c)]
        if cells and pct:
            out.setdefault(cells[0], []).append(float(pct[0][:-1]))
    return out


def test_parallel_rows_are_shares_of_the_worker_own_wall_time() -> None:
    got = shares(format_tree(hand_tree()))
    # worker_0 ran 9 s: 5 s waiting, 3 s in step (2.375 s of it env.step), 0.875 s sending.
    # worker_1 the same 9 s, with 5 s in step.  worker_root sums both (18 s).
    assert got["wait_command"] == [pytest.approx(44.4), pytest.approx(55.6), pytest.approx(33.3)]
    assert got["step"] == [pytest.approx(44.4), pytest.approx(33.3), pytest.approx(55.6)]
    # env.step is a share of the worker's 9 s, not of its parent step: 2.375 / 9, 4.25 / 9.
    assert got["env.step"] == [pytest.approx(36.8), pytest.approx(26.4), pytest.approx(47.2)]
    assert "worker_0" not in got and "worker_root" not in got
    assert got["workers"] == [pytest.approx(93.3)]  # the parent's own clock as before


def test_no_share_is_impossible_when_worker_startup_lands_in_a_reset() -> None:
    # The issue-12 case: 2 workers' start-up (5 s each) shipped with the first reset, which
    # the parent waited 0.96 s for: worker_root was shown as 1,042% of its parent.
    w = node(5.0, 1, 0.1, True, startup=node(4.0, 1, 4.0, True), reset=node(0.9, 1, 0.9, True))
    tree = node(
        1.0,
        1,
        0.04,
        env_reset=node(
            0.96, 1, 0.0, workers=node(0.96, 1, 0.0, worker_root=sum_trees(w, w), worker_0=w,
                                      worker_1=copy.deepcopy(w))
        ),
    )  # fmt: skip
    got = shares(format_tree(tree))
    assert max(v for values in got.values() for v in values) <= 100.0, got
    assert got["startup"] == [80.0, 80.0, 80.0]


def test_nested_worker_trees_restart_the_clock() -> None:
    # A Ray actor running its own workers: worker_root under the actor is a new clock.
    inner = node(8.0, 1, 0.0, True, step=node(6.0, 10, 6.0, True))
    actor = node(4.0, 1, 0.0, True, workers=node(2.0, 10, 0.0, True, worker_root=inner))
    tree = node(3.0, 1, 1.0, workers=node(2.0, 10, 0.0, **{"actor_0@10.0.0.1": actor}))
    got = shares(format_tree(tree))
    assert got["workers"] == [pytest.approx(66.7), 50.0]  # parent's; the actor's own clock
    assert got["step"] == [75.0]
    assert "actor_0@10.0.0.1" not in got and "worker_root" not in got


def test_format_tree_order_and_indentation() -> None:
    lines = format_tree(hand_tree()).splitlines()
    names = [
        line.split()[0] for line in lines[2:] if line and not line.startswith(("self", "|", " "))
    ]
    assert names[0] == "root"
    train = next(line for line in lines if line.lstrip().startswith("train "))
    env_step = next(line for line in lines if line.lstrip().startswith("env_step "))
    policy = next(line for line in lines if line.lstrip().startswith("policy "))
    assert train.index("train") == 2 and env_step.index("env_step") == 4
    # Children are sorted by total: env_step (7.5 s) before policy (1 s).
    assert lines.index(env_step) < lines.index(policy)


def test_format_tree_hides_never_entered_timers_unless_asked() -> None:
    text = format_tree(hand_tree())
    assert "reset " not in text.replace("env.reset", "")
    assert "timers never entered are hidden" in text
    # ... and says why a run has them and how to see them.
    assert "holds a timer for every command" in text and "--all" in text
    full = format_tree(hand_tree(), show_empty=True)
    assert "|| reset" in full and "hidden" not in full


def test_format_tree_max_depth_is_compatible_and_marks_cut_nodes() -> None:
    text = format_tree(hand_tree(), max_depth=2)  # the keyword the demo has always used
    assert "env_step [+1]" in text
    assert "workers" not in text.replace("[+N] = N child timers", "")
    assert "[+N] = N child timers below the depth limit" in text
    assert format_tree(hand_tree(), 0).splitlines()[2].startswith("root [+1]")


def test_format_tree_min_share_folds_small_children() -> None:
    text = format_tree(hand_tree(), min_share=0.2)
    assert "(1 below 20%: 1 s)" in text  # policy is 11% of train
    assert "policy" not in text
    with pytest.raises(ValueError, match="fraction"):
        format_tree(hand_tree(), min_share=5)
    with pytest.raises(ValueError, match="max_depth"):
        format_tree(hand_tree(), max_depth=-1)


def test_format_tree_gauges() -> None:
    text = format_tree(hand_tree())
    gauges = text[text.index("gauge") :].splitlines()
    assert gauges[0].split() == ["gauge", "value", "min", "max", "count"]
    assert gauges[2].split() == ["reward", "1.5", "0.5", "2", "4"]
    assert format_gauges({"total": 1.0}) == ""


def test_format_tree_mlagents_fixture() -> None:
    tree = load_tree(MLAGENTS)
    text = format_tree(tree)
    assert table_row(text, "TrainerController.advance")[:5] == [
        "TrainerController.advance",
        "117.000",
        "s",
        "6000",
        "3.000",
    ]
    assert "|| UnityEnvironment.step" in text
    assert table_row(text, "3DBall.Policy.Entropy.mean") == [
        "3DBall.Policy.Entropy.mean",
        "1.25",
        "1.25",
        "1.4375",
        "12",
    ]


def test_format_tree_of_a_live_timer_stack() -> None:
    stack = TimerStack()
    with hierarchical_timer("outer", stack):
        for _ in range(3):
            with hierarchical_timer("inner", stack):
                pass
    stack.set_gauge("g", 2.0)
    text = format_tree(stack.get_timing_tree())
    assert table_row(text, "inner")[3] == "3"  # name, total, unit, count
    assert "outer" in text and table_row(text, "g")[1] == "2"
    # A bare TimerNode works too.
    assert "inner" in format_tree(stack.root)


# ------------------------------------------------------------------ worker summary


def test_worker_summary_splits_time_and_names_the_straggler() -> None:
    text = worker_summary(hand_tree())
    lines = text.splitlines()
    assert lines[0] == "per-worker time, summed over 1 merge point(s): train/env_step/workers"
    assert "parent waited in train/env_step/workers: 7 s over 100 call(s)" in text
    w0 = table_row(text, "worker_0")
    # total 9 s; env 2.5 s (27.8%); waiting 5 s (55.6%); transfer 0.875 + 0.5 = 1.375 s.
    assert w0[:10] == [
        "worker_0",
        "9.000",
        "s",
        "2.500",
        "s",
        "27.8%",
        "5.000",
        "s",
        "55.6%",
        "1.375",
    ]
    assert w0[-3:] == ["410", "6.098", "ms"]  # 400 env.step + 10 env.reset calls
    w1 = table_row(text, "worker_1")
    assert w1[3:6] == ["4.500", "s", "50.0%"]
    assert table_row(text, "all")[1:3] == ["18.000", "s"]
    assert "verdict: parent-bound" in text
    # Median env time of (2.5, 4.5) is 3.5: worker_1 is 28.6% above it.
    assert lines[-1].startswith("straggler: worker_1 spent 4.5 s in env calls")
    assert "28.6% above the median 3.5 s" in lines[-1]
    assert "fastest: worker_0, 2.5 s" in lines[-1]


def test_worker_summary_sums_every_merge_point() -> None:
    tree = hand_tree()
    # A reset before the loop merges the workers a second time, elsewhere in the tree.
    reset_w = node(
        0.5, 1, 0.0, True, reset=node(0.5, 1, 0.0, True, **{"env.reset": node(0.5, 8, 0.5, True)})
    )
    tree["children"]["env_reset"] = node(
        0.5, 1, 0.0, workers=node(0.5, 1, 0.0, worker_0=reset_w, worker_1=copy.deepcopy(reset_w))
    )
    text = worker_summary(tree)
    assert "summed over 2 merge point(s)" in text
    assert table_row(text, "worker_0")[1:5] == ["9.500", "s", "3.000", "s"]
    assert table_row(text, "worker_0")[-3] == "418"


def test_worker_summary_three_workers_median() -> None:
    w2 = worker(wait=1.0, env_step=9.0, env_reset=0.0, step_self=0.5, send=0.5, own=0.0)
    tree = {
        "total": 10.0,
        "children": {"workers": node(10.0, 1, 0.0, worker_0=W0, worker_1=W1, worker_2=w2)},
    }
    last = worker_summary(tree).splitlines()[-1]
    # env: 2.5, 4.5, 9.0 -> median 4.5; worker_2 is 100% above it.
    assert (
        last.startswith("straggler: worker_2 spent 9 s") and "100.0% above the median 4.5 s" in last
    )


def test_worker_summary_names_no_straggler_within_noise() -> None:
    """The busiest worker is a straggler only from 20% above the median (STRAGGLER_EXCESS):
    below that, identical workers differ by as much from scheduling noise alone."""
    near = worker(wait=5.0, env_step=2.7, env_reset=0.125, step_self=0.5, send=0.875, own=0.125)
    tree = {"total": 10.0, "children": {"workers": node(10.0, 1, 0.0, worker_0=W0, worker_1=near)}}
    last = worker_summary(tree).splitlines()[-1]
    # env 2.5 and 2.825: median 2.6625, worker_1 6.1% above it.
    assert last.startswith("straggler: none (worker_1 has the most env time, 6.1% above")
    assert "20%" in last


def test_worker_summary_explains_its_columns() -> None:
    text = worker_summary(hand_tree())
    assert "transfer = send_response plus the step/reset timers' own time" in text
    assert "waiting = wait_command" in text


def test_calls_outside_any_timer_are_labelled_not_a_bare_workers_node() -> None:
    """A reset before the loop, outside any timer, merges the workers under the root."""
    tree = hand_tree()
    tree["children"]["workers"] = node(
        0.5, 1, 0.0, worker_0=copy.deepcopy(W0), worker_1=copy.deepcopy(W1)
    )
    lines = format_tree(tree).splitlines()
    assert any(line.startswith("  workers (calls made outside any timer) ") for line in lines)
    # The one under train/env_step keeps its plain name.
    nested = [line for line in lines if line.lstrip().startswith("workers")]
    assert len(nested) == 2 and sum("outside any timer" in line for line in nested) == 1
    assert "parent waited in workers (calls made outside any timer):" in worker_summary(tree)


def test_worker_summary_edge_cases() -> None:
    assert worker_summary(load_tree(MLAGENTS)) == (
        "no per-worker timers in this tree (no worker_<i> nodes)"
    )
    one = {"total": 1.0, "children": {"workers": node(1.0, 1, 0.0, worker_0=W0)}}
    assert worker_summary(one).splitlines()[-1] == "straggler: n/a (only one worker)"


# ------------------------------------------------------------------ reading and checking


def test_load_tree_reads_what_check_tree_accepts(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(hand_tree()))
    assert load_tree(path) == hand_tree()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "is not valid JSON"),
        ("[1, 2]", "expected a JSON object at the top, got list"),
        ('{"name": "root"}', "node 'root' has no 'total'"),
        ('{"total": "x"}', "has total='x'"),
        ('{"total": 1, "children": [1]}', "'children' that is not an object"),
        ('{"total": 1, "children": {"a": {"total": 1, "count": "many"}}}', "root/a"),
        ('{"total": 1, "children": {"a": 3}}', "node 'root/a' is a int"),
        ('{"total": NaN}', "has total=nan"),
        ('{"total": Infinity}', "has total=inf"),
        ('{"total": -389.7}', "node 'root' has total=-389.7; a timer node needs a finite, non-"),
        ('{"total": 1, "children": {"a": {"total": -1e-3}}}', "node 'root/a' has total=-0.001"),
        ('{"total": 1, "count": -2}', "node 'root' has count=-2; a count cannot be negative"),
    ],
)
def test_load_tree_errors_are_one_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(TimerTreeError) as info:
        load_tree(path)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_load_tree_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TimerTreeError, match=r"cannot read .*nope\.json: No such file"):
        load_tree(tmp_path / "nope.json")


def test_check_tree_rejects_non_trees() -> None:
    with pytest.raises(TimerTreeError):
        check_tree(None)
    with pytest.raises(TimerTreeError):
        format_tree({"children": {}})


# ------------------------------------------------------------------ icicle plot


def test_plot_icicle_writes_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from envmgr.timers.plot import plot_icicle

    for name, tree in (("hand", hand_tree()), ("mlagents", load_tree(MLAGENTS))):
        out = tmp_path / f"{name}.png"
        plot_icicle(tree, out, title=name)
        data = out.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_icicle_parallel_children_fit_their_parent() -> None:
    from envmgr.timers.plot import _layout

    boxes = _layout(hand_tree(), None, 0.0, keep_worker_root=False)
    by_name = {b.name: b for b in boxes if b.name in ("workers", "worker_0", "worker_1")}
    assert "worker_root" not in {b.name for b in boxes}
    parent = by_name["workers"]
    w0, w1 = by_name["worker_0"], by_name["worker_1"]
    # 18 s of worker time drawn inside the 7 s wait: shrunk by 7/18, side by side.
    assert w0.scale == pytest.approx(7 / 18) and w0.shrunk and not parent.shrunk
    assert w0.width + w1.width == pytest.approx(parent.width)
    assert (
        parent.x <= min(w0.x, w1.x)
        and max(w0.x + w0.width, w1.x + w1.width) <= parent.x + parent.width + 1e-9
    )
    # Every box lies within the root's width.
    assert all(0.0 <= b.x and b.x + b.width <= 10.0 + 1e-9 for b in boxes)


def test_plot_icicle_without_matplotlib_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from envmgr.timers.plot import plot_icicle

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r'pip install "envmgr\[plot\]"'):
        plot_icicle(hand_tree(), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_envmgr_fixture_is_the_hand_built_tree() -> None:
    # tests/data/envmgr_timers.json (used by the CLI tests) is hand_tree() written out.
    assert load_tree(DATA / "envmgr_timers.json") == hand_tree()
