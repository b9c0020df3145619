"""Bad command-line input: one line that names the field and the fix, and exit code 2."""

from __future__ import annotations

import argparse
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
