"""``max_worker_steps`` and ``max_worker_memory``: what they take, and the error for the rest,
given before any worker starts."""

from __future__ import annotations

from typing import Any

import pytest
from support.helpers import cartpole

from envmgr import SubprocessEnvManager
from envmgr.frontend.options import memory_size


@pytest.mark.parametrize(
    "value, size",
    [
        (1024, 1024),
        ("2GB", 2_000_000_000),
        ("512MB", 512_000_000),
        ("512MiB", 512 * 2**20),
        ("1.5 gib", 3 * 2**29),
        ("300", 300),
        (None, None),
    ],
)
def test_a_size_is_an_int_of_bytes_or_a_number_and_unit(value: Any, size: int | None) -> None:
    assert memory_size("max_worker_memory", value) == size


@pytest.mark.parametrize(
    "value, error, says",
    [
        ("2 gigs", ValueError, "max_worker_memory='2 gigs' is not a size"),
        ("GB", ValueError, "is not a size"),
        (0, ValueError, "max_worker_memory must be at least 1 byte, got 0"),
        (-5, ValueError, "at least 1 byte"),
        ("0.1B", ValueError, "less than 1 byte"),
        (2.5e9, TypeError, "a number of bytes (int) or a size string such as '2GB'"),
        (True, TypeError, "got True"),
    ],
)
def test_a_bad_memory_limit_is_refused_before_any_worker_starts(
    value: Any, error: type[Exception], says: str
) -> None:
    with pytest.raises(error) as caught:
        SubprocessEnvManager(cartpole, 2, 1, max_worker_memory=value)
    assert says in str(caught.value)


@pytest.mark.parametrize("value", [0, -1, 1.5, "10", True])
def test_max_worker_steps_is_a_positive_int(value: Any) -> None:
    says = rf"max_worker_steps must be a positive int, got {value!r}"
    with pytest.raises(ValueError, match=says):
        SubprocessEnvManager(cartpole, 2, 1, max_worker_steps=value)
