"""The `compass` command line: each subcommand's module adds its parser; main() runs one."""

from __future__ import annotations

import argparse
import sys
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
from compass.console import Parser, UsageError


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


def main(argv: list[str] | None = None) -> int:
    """Run the `compass` command line; return the exit code."""
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
    except KeyboardInterrupt:
        # `search` reports its own interruption with a resume hint; this is everything else.
        print(f"compass {args.subcommand}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
