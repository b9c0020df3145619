"""Bad command-line input: one line that names the field and the fix, and exit code 2."""

from __future__ import annotations

import argparse
import math
from typing import NoReturn


class UsageError(Exception):
    """Bad input: a one-line `<field>: <what is wrong>; <the fix>`; exit code 2."""

    def __init__(self, message: str, prog: str | None = None) -> None:
        """`prog` names the (sub)command when argparse itself found the problem."""
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and leave the exit to main()."""

    def error(self, message: str) -> NoReturn:
        """Raise instead of printing the usage block and exiting."""
        raise UsageError(f"{message}; see '{self.prog} --help'", prog=self.prog)


def fail(field: str, what: str, fix: str) -> NoReturn:
    """Raise the one-line usage error `<field>: <what is wrong>; <the fix>`."""
    raise UsageError(f"{field}: {what}; {fix}")


def parse_number(flag: str, text: str, example: str, *, low: float, inclusive: bool) -> float:
    """A finite float from the command line, above ``low`` (or equal when inclusive)."""
    try:
        value = float(text)
    except ValueError:
        fail(flag, f"{text!r} is not a number", f"pass e.g. {flag} {example}")
    if not math.isfinite(value) or value < low or (value == low and not inclusive):
        bound = f">= {low:g}" if inclusive else f"> {low:g}"
        fail(flag, f"{text} is not {bound}", f"pass e.g. {flag} {example}")
    return value


def parse_int(flag: str, text: str, example: str, *, low: int | None = None) -> int:
    """An integer from the command line, at least ``low`` when given."""
    try:
        value = int(text)
    except ValueError:
        fail(flag, f"{text!r} is not an integer", f"pass a whole number, e.g. {flag} {example}")
    if low is not None and value < low:
        fail(flag, f"{value} is below {low}", f"pass e.g. {flag} {example}")
    return value
