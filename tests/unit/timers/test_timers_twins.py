"""``hierarchical_timer.__enter__`` inlines ``get_default_stack()`` and ``TimerStack.push``
(it wraps every timed env step); the inlined copies are held to the functions they copy
(docs/architecture.md, "Hand-inlined shortcuts")."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from envmgr import timers


def shape(node: timers.TimerNode) -> Any:
    return {k: shape(v) for k, v in node.children.items()}


def timer_and_push() -> tuple[bool, bool, Any, Any]:
    """The same two nested timers opened through ``hierarchical_timer`` (naming no stack)
    and through ``push`` on a stack of their own, twice each. Whether the timer's node went
    on the stack ``get_default_stack()`` returns, as its innermost, and was found again the
    second time as ``push`` finds its own; whether both closed; both shapes."""
    general = timers.get_default_stack()
    entered = []
    for _ in range(2):  # a second entry finds the node the first one made
        with timers.hierarchical_timer("outer"):
            with timers.hierarchical_timer("inner") as node:
                entered.append((general.current(), node))
    opened = general.root.children["outer"].children["inner"]
    twin = timers.TimerStack()
    pushed = []
    for _ in range(2):
        twin.push("outer")
        pushed.append(twin.push("inner"))
        twin.pop()
        twin.pop()
    reused = pushed[0] is pushed[1] is twin.root.children["outer"].children["inner"]
    closed = general.current() is general.root and twin.current() is twin.root
    return (
        all(inside is node is opened for inside, node in entered) and reused,
        closed,
        shape(general.root.children["outer"]),
        shape(twin.root.children["outer"]),
    )


def in_fresh_thread() -> Any:
    """:func:`timer_and_push` in a thread that has no default stack yet."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(timer_and_push()))
    thread.start()
    thread.join(10.0)
    return out[0]


@pytest.mark.parametrize("where", ["thread default", "fresh thread", "run_in_stack"])
def test_a_timer_opens_the_node_push_opens_on_the_stack_get_default_stack_returns(
    where: str,
) -> None:
    if where == "fresh thread":
        got = in_fresh_thread()
    elif where == "run_in_stack":
        got = timers.run_in_stack(timers.TimerStack(), timer_and_push)
    else:
        got = timer_and_push()
    on_the_default_stack, closed, by_timer, by_push = got
    assert on_the_default_stack, "the timer's node is not the one push opens and finds again"
    assert closed, "a timer or a push left its node open"
    assert by_timer == by_push == {"inner": {}}
