"""Every cross-process message is a frozen dataclass that survives pickling."""

from __future__ import annotations

import dataclasses
import inspect
import multiprocessing as mp
import pickle
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from envmgr.protocol import messages
from envmgr.protocol.ragged_layout import RaggedLayout
from envmgr.protocol.shared_memory import SharedLayout
from envmgr.timers import GaugeNode, TimerNode


def _timer_tree() -> TimerNode:
    root = TimerNode(2.5, 1)
    step = root.get_child("step")
    step.add_time(1.25, 40)
    step.get_child("env.step").add_time(1.0, 160)
    step.get_child("env.reset").add_time(0.125, 7)
    root.get_child("wait_command").add_time(0.5, 41)
    par = root.get_child("merged")
    par.is_parallel = True
    par.add_time(0.25, 2)
    return root


def _gauges() -> dict[str, GaugeNode]:
    g = GaugeNode(3.0)
    g.update(1.0)
    g.update(5.0)
    return {"queue": g, "single": GaugeNode(-2.0)}


_LAYOUT = SharedLayout(
    "envmgr_0123456789ab",
    gym.spaces.Dict({"a": gym.spaces.Box(0, 1, (2,)), "b": gym.spaces.Discrete(3)}),
    gym.spaces.MultiDiscrete([2, 3]),
    4,
)


def _samples() -> dict[str, Any]:
    """One instance of every message class, with non-default values where possible."""
    return {
        "WorkerConfig": messages.WorkerConfig(
            worker_index=1,
            group=b"\x80\x05payload",
            spin_seconds=2e-4,
            manager_pid=1234,
            fds_to_close=(7, 9),
            layout=_LAYOUT,
        ),
        "Attach": messages.Attach(3, _LAYOUT),
        "AttachRagged": messages.AttachRagged(
            4, RaggedLayout("envmgr_x", 2, gym.spaces.Sequence(gym.spaces.Discrete(3)), 2, (8,))
        ),
        "Step": messages.Step(5, True, (np.int64(1), "text-action")),
        "Reset": messages.Reset(6, (1, None, 3), {"note": 1}, (True, False, True), False),
        "Call": messages.Call(7, "scaled", (2,), {"offset": 1}, (0, 2)),
        "Apply": messages.Apply(7, b"\x80\x05fn", (2,), {"offset": 1}, (1,)),
        "SetAttr": messages.SetAttr(8, "tag", (1, 2), (0, 1)),
        "FlushTimers": messages.FlushTimers(9),
        "Close": messages.Close(10),
        "Ready": messages.Ready(
            0,
            4321,
            gym.spaces.Box(-1, 1, (3,)),
            gym.spaces.Discrete(2),
            {"render_fps": 30},
            "rgb_array",
            gym.spec("CartPole-v1"),
        ),
        "Ack": messages.Ack(1, 11),
        "StepResponse": messages.StepResponse(
            1,
            12,
            ((0, {"t": 2, "vec": np.arange(3.0)}), (1, {"final_obs": "x"})),
            ("obs0", "obs1"),
            _timer_tree(),
            _gauges(),
            (None, [0.0, 1.0], [False, True], [True, False], None, None),
        ),
        "CallResponse": messages.CallResponse(0, 13, (1, "two", None)),
        "ErrorResponse": messages.ErrorResponse(
            worker_index=1,
            seq=14,
            env_index=3,
            phase="step",
            exception=pickle.dumps(ValueError("bad")),
            type_name="builtins.ValueError",
            message="bad",
            traceback='Traceback (most recent call last):\n  File "x.py"\nValueError: bad\n',
        ),
    }


def _message_classes() -> dict[str, type]:
    return {
        name: cls
        for name, cls in inspect.getmembers(messages, inspect.isclass)
        if dataclasses.is_dataclass(cls) and cls.__module__ == messages.__name__
    }


SAMPLES = _samples()


def test_every_message_class_has_a_sample() -> None:
    missing = set(_message_classes()) - set(SAMPLES)
    assert not missing, f"add a sample for new message classes: {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(_message_classes()))
def test_message_class_is_a_frozen_dataclass(name: str) -> None:
    cls = _message_classes()[name]
    assert cls.__dataclass_params__.frozen, f"{name} is not frozen"  # type: ignore[attr-defined]


def _assert_equal_fields(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, TimerNode):
            assert isinstance(y, TimerNode) and x.to_dict() == y.to_dict()
        elif isinstance(x, dict) and any(isinstance(v, GaugeNode) for v in x.values()):
            assert {k: g.as_dict() for k, g in x.items()} == {k: g.as_dict() for k, g in y.items()}
        elif f.name == "infos":
            assert len(x) == len(y)
            for (i, info_x), (j, info_y) in zip(x, y, strict=True):
                assert i == j and info_x.keys() == info_y.keys()
                for k in info_x:
                    assert np.array_equal(info_x[k], info_y[k])
        elif f.name == "actions" and x is not None:
            assert list(x) == list(y) and [type(v) for v in x] == [type(v) for v in y]
        else:
            assert x == y, f.name


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_assignment_raises(name: str) -> None:
    msg = SAMPLES[name]
    for f in dataclasses.fields(msg):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(msg, f.name, None)
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(msg, f.name)
    with pytest.raises((AttributeError, TypeError)):
        msg.not_a_field = 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("protocol", sorted({2, pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL}))
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_pickle_round_trip(name: str, protocol: int) -> None:
    msg = SAMPLES[name]
    copy = pickle.loads(pickle.dumps(msg, protocol=protocol))
    _assert_equal_fields(copy, msg)
    with pytest.raises(dataclasses.FrozenInstanceError):  # still frozen after loading
        setattr(copy, dataclasses.fields(copy)[0].name, None)


def test_step_response_carries_a_timer_tree_through_a_pipe() -> None:
    msg = SAMPLES["StepResponse"]
    expected = msg.timer_root.to_dict()
    a, b = mp.Pipe()
    try:
        a.send(msg)
        got = b.recv()
    finally:
        a.close()
        b.close()
    assert isinstance(got.timer_root, TimerNode)
    assert got.timer_root.to_dict() == expected
    assert got.timer_root.children["step"].children["env.step"].count == 160
    assert got.timer_root.children["merged"].is_parallel is True
    assert got.gauges["queue"].as_dict() == {"value": 5.0, "min": 1.0, "max": 5.0, "count": 3}
    # The received tree merges like a local one.
    target = TimerNode()
    target.merge(got.timer_root, root_name="worker_root", is_parallel=True)
    assert target.children["worker_root"].children["step"].count == 40
    assert target.children["worker_root"].is_parallel


def test_step_response_defaults() -> None:
    msg = messages.StepResponse(0, 1)
    assert msg.infos == () and msg.observations is None
    assert msg.timer_root is None and msg.gauges is None
    copy = pickle.loads(pickle.dumps(msg))
    assert copy == msg
