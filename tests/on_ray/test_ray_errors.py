"""Errors an actor raises reach the driver as their own type, with the fix where there is one.

A module written into the test's ``tmp_path`` and put on this driver's ``sys.path`` alone
(as a notebook's neighbouring file is) cannot be imported by the actors: Ray gives its
workers the driver's script directory and working directory at ``ray.init``, and the
environment (``PYTHONPATH``) the session's Ray was started with, none of which holds
``tmp_path``; ``sys.path`` changed later never reaches them. Every test shares the
session's Ray instance (the ``ray_session`` fixture) and starts one or two actors.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
from support.backend_cases import LocalRay
from support.fault_cases import wait_until

from envmgr.errors import RemoteTraceback

pytestmark = pytest.mark.timeout(120)

# This module's factories travel by value (the actors cannot import tests/); the module
# written into tmp_path travels by reference, as a user's own module does.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

_SOURCE = '''
import gymnasium as gym


def make():
    return gym.make("CartPole-v1")


class Marker:
    """An argument whose class lives in this module only."""
'''


@pytest.fixture(scope="module")
def ray(ray_session: LocalRay) -> Any:
    return ray_session.ensure()


@pytest.fixture
def driver_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A module importable on the driver only: its file is in ``tmp_path``."""
    name = f"envmgr_driver_only_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    module = importlib.import_module(name)
    yield module
    sys.modules.pop(name, None)


def _manager(env_fns: Any, n_actors: int = 1, envs_per_actor: int = 2, **kw: Any) -> Any:
    from envmgr import RayEnvManager

    return RayEnvManager(env_fns, n_actors, envs_per_actor, num_cpus_per_actor=0.25, **kw)


def _notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


def _assert_remote_cause(exc: BaseException, says: str) -> None:
    """The actor's traceback is chained as ``__cause__``, ending in the root cause."""
    cause = exc.__cause__
    assert isinstance(cause, RemoteTraceback), repr(cause)
    assert says in cause.tb.strip().splitlines()[-1], cause.tb
    assert "^^^" not in str(exc) and "RayTaskError" not in cause.tb


def _assert_ships_module(exc: BaseException, module: Any) -> None:
    notes = _notes(exc)
    assert "py_modules" in notes and "working_dir" in notes, notes
    assert repr(str(Path(module.__file__).resolve())) in notes, notes


def _assert_actors_gone(ray: Any, before: set[str]) -> None:
    from ray._private import state

    def gone() -> bool:
        table = state.actors()
        return all(table[a]["State"] == "DEAD" for a in set(table) - before)

    wait_until(gone, "every actor of the failed manager gone")


def _importer(name: str) -> Callable[[], gym.Env[Any, Any]]:
    def make() -> gym.Env[Any, Any]:
        return importlib.import_module(name).make()  # type: ignore[no-any-return]

    return make


def _raising() -> gym.Env[Any, Any]:
    raise RuntimeError("level 'castle' is not in this build")


def test_a_factory_from_a_module_the_actor_cannot_import_names_the_module_and_the_fix(
    ray: Any, driver_only: Any
) -> None:
    from ray._private import state

    before = set(state.actors())
    with pytest.raises(ModuleNotFoundError) as caught:
        _manager(driver_only.make)
    exc = caught.value
    assert str(exc) == f"No module named {driver_only.__name__!r}"
    notes = _notes(exc)
    assert "ray actor 0 (envs 0-1)" in notes and "unpickling the env factories" in notes, notes
    _assert_ships_module(exc, driver_only)
    _assert_remote_cause(exc, f"ModuleNotFoundError: No module named {driver_only.__name__!r}")
    _assert_actors_gone(ray, before)


@pytest.mark.parametrize("what", ["driver-only module", "package", "plain error"])
def test_a_factory_that_fails_to_build_says_the_root_cause_first(
    ray: Any, driver_only: Any, what: str
) -> None:
    """The factory itself arrives (by value); importing, or building the env, fails."""
    missing = "envmgr_test_package_installed_nowhere"
    factory = {
        "driver-only module": _importer(driver_only.__name__),
        "package": _importer(missing),
        "plain error": _raising,
    }[what]
    expected: type[Exception] = RuntimeError if what == "plain error" else ModuleNotFoundError
    with pytest.raises(expected) as caught:
        _manager(factory)
    exc = caught.value
    notes = _notes(exc)
    assert "ray actor 0 (envs 0-1)" in notes and "env 0, during make" in notes, notes
    if what == "driver-only module":
        _assert_ships_module(exc, driver_only)
        _assert_remote_cause(exc, f"No module named {driver_only.__name__!r}")
    elif what == "package":
        assert "install it on every node" in notes and f"pip install {missing}" in notes, notes
        assert "py_modules" not in notes, notes
        _assert_remote_cause(exc, f"No module named {missing!r}")
    else:
        assert "fix:" not in notes, notes
        _assert_remote_cause(exc, "RuntimeError: level 'castle' is not in this build")


class _ImportsWhenStepped(gym.Wrapper[Any, Any, Any, Any]):
    """Imports a module in ``step`` (after ``set_import``), as env code loading a part
    lazily does; ``echo`` is a method to call with any argument."""

    importing: str | None = None

    def set_import(self, name: str) -> None:
        self.importing = name

    def step(self, action: Any) -> Any:
        if self.importing is not None:
            importlib.import_module(self.importing)
        return super().step(action)

    def echo(self, arg: Any) -> str:
        return type(arg).__name__


def _stepped_cartpole() -> gym.Env[Any, Any]:
    return _ImportsWhenStepped(gym.make("CartPole-v1"))


def test_step_and_call_failing_to_import_say_the_root_cause_and_the_actor_lives_on(
    ray: Any, driver_only: Any
) -> None:
    with _manager(_stepped_cartpole) as envs:
        envs.reset(seed=0)
        actions = np.zeros(2, dtype=np.int64)

        # A call's argument of a class the actor cannot import: the command itself.
        with pytest.raises(ModuleNotFoundError) as caught:
            envs.call("echo", driver_only.Marker())
        exc = caught.value
        notes = _notes(exc)
        assert "during call('echo') (reading the command)" in notes, notes
        _assert_ships_module(exc, driver_only)
        _assert_remote_cause(exc, f"No module named {driver_only.__name__!r}")
        assert envs.call("echo", 1) == ("int", "int")  # the actor serves the next call

        # An import inside the env's step.
        envs.call("set_import", driver_only.__name__)
        with pytest.raises(ModuleNotFoundError) as caught:
            envs.step(actions)
        exc = caught.value
        notes = _notes(exc)
        assert "env 0, during step" in notes, notes
        _assert_ships_module(exc, driver_only)
        _assert_remote_cause(exc, f"No module named {driver_only.__name__!r}")

        envs.call("set_import", "json")  # importable everywhere: the envs step on
        assert envs.step(actions)[0].shape == (2, 4)
