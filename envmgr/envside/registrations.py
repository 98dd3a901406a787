"""The parent's gymnasium registrations, carried to groups that never ran the code making them.

A factory such as ``lambda: gym.make("ALE/Pong-v5")`` names an env by id, and the id is
only known where it was registered: ``gym.register_envs(ale_py)`` or ``gym.register(...)``
in the user's script. A forkserver or spawn worker and a Ray actor never run that script
(workers never import ``__main__``), so without this their ``gym.make`` raised
``NamespaceNotFound``. ``AsyncVectorEnv`` works there by forking, or by re-running
``__main__`` under spawn.

So the parent sends the entries of its registry that gymnasium does not make itself, and a
group adds those its own registry lacks before it builds its envs::

    parent: registrations() -> cloudpickled (packages, EnvSpecs), once per manager
    group:  install(blob)   -> import the packages, then gym.registry.setdefault(id, spec)

*Packages* are the top-level packages of the entries' entry points that the parent has
imported. Some register their ids when imported (``ale_py`` does, in its ``__init__``);
imported after the entries were installed, when the factory's ``gym.make`` loads the
entry point, each of their registrations met an entry of ours and gymnasium warned once
per id: 700 lines per worker for ALE. Imported first, they register their own entries
and ``setdefault`` leaves them be. The parent has imported them already, so a worker
imports nothing the parent did not.
"""

from __future__ import annotations

import importlib
import sys
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


def _package(entry: Any) -> str | None:
    """The top-level package an entry point (``"pkg.mod:attr"`` or a callable) lives in."""
    if entry is None:
        return None
    module = entry if isinstance(entry, str) else getattr(entry, "__module__", None)
    if not isinstance(module, str):
        return None
    return module.split(":")[0].split(".")[0] or None


def registrations() -> bytes:
    """Return this process's registry entries that gymnasium does not make, cloudpickled.

    The entries travel with the imported packages they come from; an entry that does not pickle
    is left out (a factory naming it fails as it did before).
    """
    specs = tuple(s for s in gym.registry.values() if not _gymnasium_own(s))
    if not specs:
        return b""
    entries = [e for s in specs for e in (s.entry_point, s.vector_entry_point)]
    named = {_package(e) for e in entries} - {None, "__main__"}
    packages = sorted(p for p in named if p in sys.modules)
    try:
        return cloudpickle.dumps((packages, specs))  # type: ignore[no-any-return]
    except Exception:
        kept = tuple(s for s in specs if _pickles(s))
        return cloudpickle.dumps((packages, kept))  # type: ignore[no-any-return]


def install(blob: bytes) -> None:
    """Import the packages of ``blob`` (from :func:`registrations`), then register its specs.

    Only specs whose id is not registered here are registered; ids this process has keep their
    own spec.
    """
    if not blob:
        return
    packages, specs = cloudpickle.loads(blob)
    for name in packages:
        try:
            importlib.import_module(name)
        except Exception:
            pass  # not importable here (another Ray node): the spec alone still names the env
    for spec in specs:
        gym.registry.setdefault(spec.id, spec)
