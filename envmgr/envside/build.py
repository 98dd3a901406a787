"""Building a group from its spec: single envs or one hosted VectorEnv."""

from __future__ import annotations

from envmgr import timers as timer_module
from envmgr.envside.group import EnvGroup, GroupSpec
from envmgr.envside.registrations import install
from envmgr.envside.single_group import SingleEnvGroup
from envmgr.envside.vector_group import VectorEnvGroup

__all__ = ["build_group"]


def build_group(spec: GroupSpec, began: float | None = None) -> EnvGroup:
    """Build the group ``spec`` describes; raises :class:`BuildFailed`.

    The thread's default timer stack is reset and the envs are built under a
    ``make_envs`` timer; :meth:`EnvGroup.ready` ships that start-up tree.

    Args:
        spec: The group.
        began: ``perf_counter()`` when the process (or actor) began starting up:
            the start-up tree's wall clock runs from there. Default: now.
    """
    stack = timer_module.get_default_stack()
    stack.reset()
    if began is not None:
        stack.start_time = began
    with timer_module.hierarchical_timer("make_envs", stack):
        install(spec.registrations)
        if spec.vector_fn is not None:
            return VectorEnvGroup(spec)
        return SingleEnvGroup(spec)
