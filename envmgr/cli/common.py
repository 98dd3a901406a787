"""What every ``envmgr`` command shares: exit codes, one-line errors, argument types."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import NoReturn

EXIT_OK, EXIT_BAD_FILE, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A failure to report as one line on stderr with exit code 1."""


class BadUsage(Exception):
    """A usage error found after parsing (an unknown env id, an unreadable FILE): exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit code 2), without the usage block."""

    def error(self, message: str) -> NoReturn:
        """Report a usage error in one line on stderr and exit with the usage exit code."""
        usage_error(self, message)
        raise SystemExit(EXIT_USAGE)


def usage_error(parser: argparse.ArgumentParser, message: str) -> int:
    """Print a usage error as one line on stderr; returns the exit code for it."""
    print(
        f"{parser.prog}: error: {one_line_text(message)} (see '{parser.prog} --help')",
        file=sys.stderr,
    )
    return EXIT_USAGE


def one_line_text(text: str) -> str:
    """Return ``text`` on one line, its runs of whitespace made single spaces."""
    return " ".join(text.split())


def one_line(exc: BaseException) -> str:
    """Return ``exc``'s message on one line, or its type's name when it has none."""
    return one_line_text(str(exc)) or type(exc).__name__


def whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


positive_int = whole_number(1)


non_negative_int = whole_number(0)


def positive_seconds(text: str) -> float:
    """Parse a number of seconds greater than 0 (an argparse ``type``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds like 2.5, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def fraction(text: str) -> float:
    """Parse a fraction in ``[0, 1)`` (an argparse ``type``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction like 0.01, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, 1), got {value}")
    return value
