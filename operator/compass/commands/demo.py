"""`compass demo`: the whole method on this machine, or (--search-only) the search alone."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from compass.commands.search_common import (
    add_settings,
    check_budgets,
    parse_settings,
    summary,
    write_result,
)
from compass.console import fail, search_with_progress, shown
from compass.domain.evaluation import EvaluationError
from compass.domain.search import SearchSettings
from compass.domain.space import Space
from compass.evaluators.ledger import Ledger, ReplayEvaluator
from compass.examples import RAG_PAPER_SAMPLES, build_replay_ledger, load_rag_paper

DEMO_LEDGER_SEED = 0
# The live demo runs the development tools (dev/compass_dev: the local Triton, the experiment,
# the local control plane and node), which the compass-operator package does not ship: looked up
# by name, so only where installed.
DEV_TOOLS = "compass_dev"
INSTALL_DEV_TOOLS = (
    "install them from a checkout of the repository: pip install -e dev/ (hack/demo.sh does), "
    "or run the search alone with --search-only"
)


def register(commands: Any, summary: str) -> None:
    """Add `compass demo` to the `compass` parser."""
    demo = commands.add_parser(
        "demo",
        help=summary,
        description="Start a real tritonserver serving rag-sim (the paper's RAG workflow: 234 "
        "configurations with the paper's measured accuracy and latency), run COMPASS-V through "
        "its router, profile the feasible configurations, plan, and serve a seeded load spike "
        "with the static fastest, the static most accurate and the default serving (per-request "
        "binding behind the router's gate), each beside the simulator's prediction (--runs "
        "picks the runs); tables on stdout, files and plots in --output-dir. --search-only runs "
        "the search alone on the embedded replay (seconds, no Triton); the rest, and its flags, "
        "come with the repository's development tools (pip install -e dev/).",
    )
    # 0.75: the accuracy floor of the paper's own planning and serving runs.
    add_settings(demo, tau_default="0.75")
    demo.add_argument(
        "--search-only",
        action="store_true",
        help=f"only the search, replaying the embedded grid in memory ({RAG_PAPER_SAMPLES} "
        "samples a configuration); --output writes its result",
    )
    live = live_demo()
    if live is not None:
        live.add_arguments(demo)
    demo.set_defaults(handler=demo_command, explains_unrecognized=live is None)


def demo_ledger() -> tuple[Space, Ledger]:
    """The embedded RAG example as a space and an in-memory replay ledger."""
    spec, rows = load_rag_paper()
    space = Space.from_spec(spec)
    ledger = Ledger("embedded RAG example")
    for line in build_replay_ledger(rows, RAG_PAPER_SAMPLES, DEMO_LEDGER_SEED):
        ledger.add(line["config"], range(len(line["scores"])), line["scores"])
    return space, ledger


def live_demo() -> ModuleType | None:
    """The development tools' live demo command line (None: the tools are not installed)."""
    if importlib.util.find_spec(DEV_TOOLS) is None:
        return None
    return importlib.import_module(f"{DEV_TOOLS}.democli")


def _run_search_only(settings: SearchSettings, output: Path | None) -> int:
    """The search alone, replaying the embedded grid in memory."""
    space, ledger = demo_ledger()
    print(
        f"compass demo: the Compass paper's RAG grid ({space.size} configurations; each "
        f"replays its recorded accuracy over {RAG_PAPER_SAMPLES} samples)"
    )
    try:
        outcome = search_with_progress(space, ReplayEvaluator(ledger), RAG_PAPER_SAMPLES, settings)
        write_result(outcome, output)
    except (EvaluationError, OSError) as exc:
        print(f"compass demo: error: {exc}", file=sys.stderr)
        return 1
    print(summary(outcome, settings, output, "none (the demo replays in memory)"))
    return 0


def demo_command(args: argparse.Namespace) -> int:
    """`compass demo`: the whole method on a local Triton, or (--search-only) the search alone."""
    settings, output = parse_settings(args)
    check_budgets(settings.budgets, RAG_PAPER_SAMPLES, "the embedded example")
    live = live_demo()
    if live is not None:
        live.check_flags(args)
    elif args.unrecognized:  # the live demo's flags (--runs, --cluster) come with its tools
        fail(
            shown(args.unrecognized[0]),
            f"unknown here: the live demo's flags need the development tools ({DEV_TOOLS}), "
            "not installed",
            INSTALL_DEV_TOOLS,
        )
    if args.search_only:
        return _run_search_only(settings, output)
    if output is not None:
        fail("--output", "only with --search-only", "the demo writes into --output-dir")
    if live is None:
        fail("the live demo", f"needs the development tools ({DEV_TOOLS})", INSTALL_DEV_TOOLS)
    status: int = live.run(args, settings)
    return status
