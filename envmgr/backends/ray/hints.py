"""The fix to name when an actor could not import a module the driver's code needs.

A factory, a wrapper or an env class travels to an actor by reference when it lives in
an importable module: the actor imports that module by name. Code in a file next to a
notebook, or in a directory put on the driver's ``sys.path`` by hand, is importable on
the driver only; a package installed on the driver's machine alone is the same on a
cluster. Both end in the actor's ``ModuleNotFoundError``, and the fix differs::

    actor: ModuleNotFoundError("No module named 'x'")  -> ErrorResponse (type, message)
    driver: import_fix(type, message)
        'x' found on the driver, outside the installed packages
            -> ship it: runtime_env py_modules=[its file or directory], or working_dir
        'x' an installed package, or not found here either
            -> install it on every node

The driver decides, because only the driver knows where it found the module.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import site
import sysconfig

__all__ = ["import_fix"]

_MISSING = re.compile(r"No module named '([^']+)'")


def _installed_roots() -> list[str]:
    """Directories that hold installed distributions (site-packages and the like)."""
    roots = {sysconfig.get_paths().get(key, "") for key in ("purelib", "platlib", "stdlib")}
    try:
        roots.update(site.getsitepackages())
    except AttributeError:  # a virtualenv's old site module
        pass
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else ""
    roots.add(user)
    return [os.path.realpath(r) for r in roots if r]


def _local_path(top: str) -> str | None:
    """Where the driver finds module ``top``, if it is a file or directory of its own.

    ``None`` for an installed distribution, or a module the driver cannot find.
    """
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    path = locations[0] if locations else spec.origin
    if not path or not os.path.exists(path):
        return None  # a builtin, a frozen or namespace module: nothing to ship
    real = os.path.realpath(path)
    if any(real == r or real.startswith(r + os.sep) for r in _installed_roots()):
        return None
    return real


def _distribution(top: str) -> str:
    """``pip install`` argument for module ``top`` (its distribution's name if known)."""
    try:
        names = importlib.metadata.packages_distributions().get(top, [])
    except Exception:
        names = []
    return names[0] if names else top


def import_fix(type_name: str, message: str) -> str:
    """What to do about an exception an actor raised, if a module failed to import there.

    ``""`` for any other exception.

    Args:
        type_name: Qualified name of the exception's type (``builtins.ModuleNotFoundError``).
        message: ``str()`` of the exception (``No module named 'x'``).
    """
    if type_name.rsplit(".", 1)[-1] != "ModuleNotFoundError":
        return ""
    found = _MISSING.search(message)
    if found is None:
        return ""
    name = found.group(1)
    top = name.split(".")[0]
    local = _local_path(top)
    if local is not None:
        return (
            f"module {top!r} is importable on this driver ({local}) but not on the Ray "
            "actor's node: ship it with the actors, e.g. pass "
            f"`ray_init_kwargs={{'runtime_env': {{'py_modules': [{local!r}]}}}}` or "
            "`working_dir` (with Ray already connected: the same `runtime_env` in "
            "`actor_options`, or in your own `ray.init`)"
        )
    return (
        f"package {top!r} is not installed where the Ray actor runs: install it on every "
        f"node of the cluster (`pip install {_distribution(top)}`), or list it in "
        "`runtime_env={'pip': [...]}`"
    )
