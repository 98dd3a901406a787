"""The parent's gymnasium registrations, carried to groups that never ran the code making them.

A factory such as ``lambda: gym.make("ALE/Pong-v5")`` names an env by id, and the id is
only known where it was registered: ``gym.register_envs(ale_py)`` or ``gym.register(...)``
in the user's script. A forkserver or spawn worker and a Ray actor never run that script
(workers never import ``__main__``), so without this their ``gym.make`` raised
``NamespaceNotFound``. ``AsyncVectorEnv`` works there by forking, or by re-running
``__main__`` under spawn.

So the parent sends the entries of its registry that gymnasium does not make itself, and a
group adds those its own registry lacks before it builds its envs::

    parent: registrations() -> cloudpickled EnvSpecs (about 2 ms and 46 kB with ALE's 352)
    group:  install(blob)   -> gym.registry.setdefault(id, spec) for each
"""

from __future__ import annotations

from typing import Any

import cloudpickle
import gymnasium as gym
from gymnasium.envs.registration import EnvSpec

__all__ = ["registrations", "install"]


def _gymnasium_own(spec: EnvSpec) -> bool:
    """Whether gymnasium registers ``spec`` itself (every process has it)."""
    entry: Any = spec.entry_point
    module = entry if isinstance(entry, str) else getattr(entry, "__module__", "") or ""
    return module.startswith("gymnasium.") or module.startswith("gymnasium:")


def _pickles(spec: EnvSpec) -> bool:
    try:
        cloudpickle.dumps(spec)
    except Exception:
        return False
    return True


def registrations() -> bytes:
    """This process's registry entries that gymnasium does not make, cloudpickled; an
    entry that does not pickle is left out (a factory naming it fails as it did before)."""
    specs = tuple(s for s in gym.registry.values() if not _gymnasium_own(s))
    if not specs:
        return b""
    try:
        return cloudpickle.dumps(specs)  # type: ignore[no-any-return]
    except Exception:
        return cloudpickle.dumps(tuple(s for s in specs if _pickles(s)))  # type: ignore[no-any-return]


def install(blob: bytes) -> None:
    """Register each spec of ``blob`` (from :func:`registrations`) whose id is not registered
    here; ids this process has keep their own spec."""
    if blob:
        for spec in cloudpickle.loads(blob):
            gym.registry.setdefault(spec.id, spec)
