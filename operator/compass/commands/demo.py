"""`compass demo`: the whole method on this machine, or (--search-only) the search alone."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from compass.api.binding import MAX_LAG_RESERVE
from compass.commands.search_common import (
    SearchOptions,
    add_settings,
    parse_settings,
    resolve_budgets,
    summary,
    write_result,
)
from compass.console import fail, parse_int, parse_number, search_with_progress
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
        "the search alone on the embedded replay (seconds, no Triton).",
    )
    # 0.75: the accuracy floor of the paper's own planning and serving runs.
    add_settings(demo, tau_default="0.75")
    demo.add_argument(
        "--search-only",
        action="store_true",
        help=f"only the search, replaying the embedded grid in memory ({RAG_PAPER_SAMPLES} "
        "samples a configuration); --output writes its result",
    )
    demo.add_argument(
        "--output-dir", default="compass-demo", help="where the demo writes (default compass-demo)"
    )
    demo.add_argument(
        "--cluster",
        action="store_true",
        help="the same through the operator: a local Kubernetes API server (hack/k8s/build.sh's "
        "binaries), `compass operator`, `kubectl apply` of examples/rag-sim-workflow.yaml (its "
        "own tau and budgets; the search replays rag-sim's scores), the spike served by the "
        "operator's policy and by the most accurate configuration (a few minutes). Needs the "
        "repository's development tools (pip install -e dev/), which a plain install lacks",
    )
    demo.add_argument(
        "--queue-from",
        choices=("triton", "prometheus"),
        default="triton",
        help="with --cluster --whole-workflow: where the operator's policy reads the queue: "
        "every Triton's /metrics at each tick (default, as examples/rag-sim-workflow.yaml), or "
        "Prometheus' last scrape (to see what that delay costs)",
    )
    demo.add_argument(
        "--whole-workflow",
        action="store_true",
        help="with --cluster: serve with the policy's whole-workflow switching alone (Elastico), "
        "the example's serving.binding and admission removed and the local router ungated, "
        "instead of late binding behind the router's gate as the example serves",
    )
    demo.add_argument(
        "--late-binding",
        action="store_true",
        help="with --cluster: late binding as the example serves it (the default; kept for "
        "scripts that name it)",
    )
    demo.add_argument(
        "--binding-lag",
        metavar="SHARE",
        help="with --cluster: the lag cap's share of the SLO instead of the example's "
        "(binding.lagShare, in (0, 1]; the example's 0.3)",
    )
    demo.add_argument(
        "--binding-lag-reserve",
        metavar="N",
        help="with --cluster: the cap's share is of the SLO less N of the fastest's likely "
        "times instead of the example's (binding.lagReserve; the example's 2)",
    )
    demo.add_argument(
        "--runs",
        metavar="RUN[,RUN...]",
        help="the runs that serve the spike, comma-separated, of fastest, accurate, default, "
        "elastico, predictive (default fastest,accurate,default): static fastest and most "
        "accurate, the default serving (the policy's binding table behind the router's gate), "
        "Elastico's whole-workflow switching, the predictive strategy with admission",
    )
    demo.add_argument(
        "--time-scale",
        help="rag-sim serves its latencies times this; the load, SLO and cooldowns follow "
        "(default 0.2: the 180 s spike runs in 36 s; 0.25 with --cluster)",
    )
    demo.add_argument("--slo-ms", default="1000", help="p95 latency SLO, ms (default 1000)")
    demo.add_argument(
        "--base-qps",
        help="load before and after the spike (default: the paper's 1.5 QPS relative to this "
        "machine: the spike peaks at 77%% of the fastest configuration's capacity)",
    )
    demo.add_argument("--duration", default="180", help="seconds of load (default 180)")
    demo.add_argument(
        "--profile-runs",
        help="measured requests per configuration (default 30; 20 with --cluster)",
    )
    demo.set_defaults(handler=demo_command)


def demo_ledger() -> tuple[Space, Ledger]:
    """The embedded RAG example as a space and an in-memory replay ledger."""
    spec, rows = load_rag_paper()
    space = Space.from_spec(spec)
    ledger = Ledger("embedded RAG example")
    for line in build_replay_ledger(rows, RAG_PAPER_SAMPLES, DEMO_LEDGER_SEED):
        ledger.add(line["config"], range(len(line["scores"])), line["scores"])
    return space, ledger


def dev_tool(module: str, field: str) -> ModuleType:
    """A module of the development tools, or a usage error saying how to install them."""
    if importlib.util.find_spec(DEV_TOOLS) is None:
        fail(field, f"needs the development tools ({DEV_TOOLS}), not installed", INSTALL_DEV_TOOLS)
    return importlib.import_module(f"{DEV_TOOLS}.{module}")


def _positive(
    args: argparse.Namespace, flag: str, example: str, default: str | None = None
) -> float:
    """The value of a flag that must be a number > 0 (its default when not given)."""
    text = getattr(args, flag[2:].replace("-", "_"))
    return parse_number(flag, str(text or default), example, low=0, inclusive=False)


def _run_whole(args: argparse.Namespace, options: SearchOptions, settings: SearchSettings) -> int:
    """Search, profile, plan and serve a spike on a local Triton (or through the operator)."""

    if options.output is not None:
        fail("--output", "only with --search-only", "the demo writes into --output-dir")
    base_qps = None if args.base_qps is None else _positive(args, "--base-qps", "1.5")
    if args.cluster:
        cluster = dev_tool("clusterdemo", "--cluster")
        status: int = cluster.run_cluster_demo(
            cluster.ClusterDemoSettings(
                output_dir=Path(str(args.output_dir)),
                time_scale=_positive(args, "--time-scale", "0.25", "0.25"),
                slo_ms=_positive(args, "--slo-ms", "1000"),
                base_qps=base_qps,
                duration_s=_positive(args, "--duration", "180"),
                load_seed=settings.seed,
                measured_runs=parse_int(
                    "--profile-runs", str(args.profile_runs or 20), "20", low=2
                ),
                queue_from=str(args.queue_from),
                late_binding=not args.whole_workflow,
                binding_lag_share=None
                if args.binding_lag is None
                else parse_number(
                    "--binding-lag", str(args.binding_lag), "0.3", low=0, inclusive=False, high=1
                ),
                binding_lag_reserve=None
                if args.binding_lag_reserve is None
                else parse_int(
                    "--binding-lag-reserve",
                    str(args.binding_lag_reserve),
                    "2",
                    low=0,
                    high=MAX_LAG_RESERVE,
                ),
            )
        )
        return status
    local = dev_tool("localdemo", "the live demo")
    status = local.run_demo(
        local.DemoSettings(
            output_dir=Path(str(args.output_dir)),
            search=settings,
            time_scale=_positive(args, "--time-scale", "0.2", "0.2"),
            slo_ms=_positive(args, "--slo-ms", "1000"),
            base_qps=base_qps,
            duration_s=_positive(args, "--duration", "180"),
            load_seed=settings.seed,
            measured_runs=parse_int("--profile-runs", str(args.profile_runs or 30), "30", low=2),
            runs=local.parse_runs(args.runs),
        )
    )
    return status


def _run_search_only(options: SearchOptions, settings: SearchSettings) -> int:
    """The search alone, replaying the embedded grid in memory."""
    space, ledger = demo_ledger()
    print(
        f"compass demo: the Compass paper's RAG grid ({space.size} configurations; each "
        f"replays its recorded accuracy over {RAG_PAPER_SAMPLES} samples)"
    )
    try:
        outcome = search_with_progress(space, ReplayEvaluator(ledger), RAG_PAPER_SAMPLES, settings)
        result = write_result(outcome, options.output)
    except (EvaluationError, OSError) as exc:
        print(f"compass demo: error: {exc}", file=sys.stderr)
        return 1
    print(summary(outcome, settings, result, "none (the demo replays in memory)"))
    return 0


def demo_command(args: argparse.Namespace) -> int:
    """`compass demo`: the whole method on a local Triton, or (--search-only) the search alone."""
    options = parse_settings(args)
    budgets = resolve_budgets(options.budgets, RAG_PAPER_SAMPLES, "the embedded example")
    settings = options.search_settings(budgets)
    if args.cluster and args.search_only:
        fail("--cluster", "not with --search-only", "pass one of them")
    if args.runs is not None and (args.cluster or args.search_only):
        fail(
            "--runs",
            "only for the local demo (not with --cluster or --search-only)",
            "leave --runs out",
        )
    if args.queue_from != "triton" and not args.cluster:
        fail("--queue-from", "only with --cluster", "add --cluster, or leave --queue-from out")
    for flag in ("--whole-workflow", "--late-binding", "--binding-lag", "--binding-lag-reserve"):
        given = getattr(args, flag[2:].replace("-", "_"))
        if given not in (None, False) and not args.cluster:
            fail(flag, "only with --cluster", f"add --cluster, or leave {flag} out")
    if args.whole_workflow and args.late_binding:
        fail("--whole-workflow", "not with --late-binding", "pass one of them")
    for flag in ("--binding-lag", "--binding-lag-reserve"):
        if getattr(args, flag[2:].replace("-", "_")) is not None and args.whole_workflow:
            fail(flag, "not with --whole-workflow", f"leave {flag} out")
    if args.queue_from != "triton" and not args.whole_workflow:
        fail(
            "--queue-from",
            "only with --whole-workflow: with late binding the routers bind each request "
            "themselves, so where the policy reads the queue changes nothing that serves them",
            "add --whole-workflow, or leave --queue-from out",
        )
    if args.search_only:
        return _run_search_only(options, settings)
    return _run_whole(args, options, settings)
