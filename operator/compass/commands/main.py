"""The `compass` command line: each subcommand's module adds its parser; main() runs one."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence

from compass import __version__
from compass.console import Parser, Terminated, UsageError
from compass.evaluators.files import UnsafeFileError

# The command line's one lazy import boundary: a subcommand's module is imported only when it
# runs, so `compass --help` and each subcommand load only what that subcommand needs (the
# operator's kopf and Kubernetes client, the Triton client, matplotlib each take a second or
# two); inside a command module every import is at module level. In `compass --help`'s order.
SUBCOMMANDS: dict[str, str] = {
    "search": "find the configurations that reach an accuracy target (COMPASS-V)",
    "demo": "the whole method on this machine: search, profile, plan, serve a spike (minutes)",
    "profile": "measure the latency of configurations through the router",
    "load": "send open-loop load to the router and record every request",
    "serve": "run Elastico live against Triton, outside Kubernetes",
    "plan": "Pareto front and switching thresholds from latency profiles: a ParetoPolicy",
    "simulate": "run a policy and the static baselines through the serving simulator",
    "operator": "run the operator: the ParetoPolicy and CompoundWorkflow controllers (kopf)",
    "crds": "write the CustomResourceDefinition YAML generated from the models",
    "job": "run inside the operator's Jobs (search or profile a CompoundWorkflow)",
}

DESCRIPTION = (
    "Keep a compound-AI workflow inside its accuracy and latency SLOs on fixed hardware: find "
    "the configurations that reach an accuracy target (search), measure their latency "
    "(profile), plan a Pareto front with the queue depths to switch at (plan), try the policy "
    "on simulated or real load (simulate, load), and switch between the configurations as load "
    "changes, outside Kubernetes (serve) or as an operator in a cluster (operator, with its "
    "CRDs from crds and its Jobs running job). demo runs every step on this machine."
)
EPILOG = "`compass COMMAND --help` describes a command and every one of its options."


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The `compass` argument parser: the subcommand ``argv`` names in full (its module
    imported and its arguments added), the others by name and summary only."""
    parser = Parser(prog="compass", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"compass {__version__}")
    commands = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    chosen = next((word for word in argv[:1] if word in SUBCOMMANDS), None)
    for name, summary in SUBCOMMANDS.items():
        if name == chosen:
            module = importlib.import_module(f"compass.commands.{name}")
            module.register(commands, summary)
        else:
            commands.add_parser(name, help=summary, add_help=False)
    return parser


def _escape_unencodable() -> None:
    """Write what the terminal cannot encode (an emoji on an ASCII stdout) as escapes."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def _usage_error(prefix: str, exc: Exception) -> int:
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
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(words)
    try:
        args, unrecognized = parser.parse_known_args(words)
        # Only a command that knows why a flag is missing (demo without its tools) gets them.
        if unrecognized and not getattr(args, "explains_unrecognized", False):
            parser.error(f"unrecognized arguments: {' '.join(unrecognized)}")
        args.unrecognized = unrecognized
    except UsageError as exc:
        return _usage_error(exc.prog or "compass", exc)
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except (UsageError, UnsafeFileError) as exc:
        # UnsafeFileError: an output path that changed into a symlink or a device once checked.
        return _usage_error(f"compass {args.subcommand}", exc)
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
