"""The `compass` command line: each subcommand's module adds its parser; main() runs one."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable

from compass.commands import (
    crds,
    demo,
    job,
    load,
    operator,
    plan,
    profile,
    search,
    serve,
    simulate,
)
from compass.console import Parser, Terminated, UsageError
from compass.evaluators.files import UnsafeFileError


def build_parser() -> argparse.ArgumentParser:
    """The `compass` argument parser with its subcommands."""
    parser = Parser(
        prog="compass",
        description="Find every configuration of a compound-AI workflow that reaches an "
        "accuracy target, evaluating as few samples as possible.",
    )
    commands = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    # In the order `compass --help` lists them.
    search.register(commands)
    demo.register(commands)
    profile.register(commands)
    load.register(commands)
    serve.register(commands)
    plan.register(commands)
    simulate.register(commands)
    operator.register(commands)  # kopf is imported only when the operator runs
    crds.register(commands)
    job.register(commands)
    return parser


def _escape_unencodable() -> None:
    """Write what the terminal cannot encode (an emoji on an ASCII stdout) as escapes."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def _usage_error(prefix: str, exc: UsageError) -> int:
    """Print a usage error as the one line it promises (a value may carry a newline)."""
    print(f"{prefix}: error: {' '.join(str(exc).splitlines())}", file=sys.stderr)
    return 2


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM's handler: an exception, so that a running evaluator command is ended too."""
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    """Run the `compass` command line; return the exit code."""
    # Python's default SIGTERM exits at once, leaving a --command evaluator's group running.
    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return _main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> int:
    """main() without the signal handling."""
    _escape_unencodable()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return _usage_error(exc.prog or "compass", exc)
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except UsageError as exc:
        return _usage_error(f"compass {args.subcommand}", exc)
    except UnsafeFileError as exc:
        # An output path that changed into a symlink or a device after it was checked.
        return _usage_error(f"compass {args.subcommand}", UsageError(str(exc)))
    except BrokenPipeError:
        # The reader has gone (`compass simulate | head`): nothing more can be read. stdout
        # goes to /dev/null, or the interpreter's last flush fails on the pipe once more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt as exc:
        # `search` reports its own interruption with a resume hint; this is everything else.
        terminated = isinstance(exc, Terminated)
        print(
            f"compass {args.subcommand}: {'terminated' if terminated else 'interrupted'}",
            file=sys.stderr,
        )
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)


if __name__ == "__main__":
    raise SystemExit(main())
