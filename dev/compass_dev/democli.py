"""`compass demo`'s live runs on the command line: their flags, checked, as the local demo's or
the cluster demo's settings (the shipped command adds these flags where the tools are installed)."""

from __future__ import annotations

import argparse
from pathlib import Path

from compass.api.binding import MAX_LAG_RESERVE
from compass.console import fail, parse_int, parse_number
from compass.domain.search import SearchSettings

# Flags that only the cluster demo reads.
CLUSTER_FLAGS = ("--whole-workflow", "--late-binding", "--binding-lag", "--binding-lag-reserve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The live demo's flags, on `compass demo`'s parser."""
    parser.add_argument(
        "--output-dir", default="compass-demo", help="where the demo writes (default compass-demo)"
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="the same through the operator: a local Kubernetes API server (hack/k8s/build.sh's "
        "binaries), `compass operator`, `kubectl apply` of examples/rag-sim-workflow.yaml (its "
        "own tau and budgets; the search replays rag-sim's scores), the spike served by the "
        "operator's policy and by the most accurate configuration (a few minutes)",
    )
    parser.add_argument(
        "--queue-from",
        choices=("triton", "prometheus"),
        default="triton",
        help="with --cluster --whole-workflow: where the operator's policy reads the queue: "
        "every Triton's /metrics at each tick (default, as examples/rag-sim-workflow.yaml), or "
        "Prometheus' last scrape (to see what that delay costs)",
    )
    parser.add_argument(
        "--whole-workflow",
        action="store_true",
        help="with --cluster: serve with the policy's whole-workflow switching alone (Elastico), "
        "the example's serving.binding and admission removed and the local router ungated, "
        "instead of late binding behind the router's gate as the example serves",
    )
    parser.add_argument(
        "--late-binding",
        action="store_true",
        help="with --cluster: late binding as the example serves it (the default; kept for "
        "scripts that name it)",
    )
    parser.add_argument(
        "--binding-lag",
        metavar="SHARE",
        help="with --cluster: the lag cap's share of the SLO instead of the example's "
        "(binding.lagShare, in (0, 1]; the example's 0.3)",
    )
    parser.add_argument(
        "--binding-lag-reserve",
        metavar="N",
        help="with --cluster: the cap's share is of the SLO less N of the fastest's likely "
        "times instead of the example's (binding.lagReserve; the example's 2)",
    )
    parser.add_argument(
        "--runs",
        metavar="RUN[,RUN...]",
        help="the runs that serve the spike, comma-separated, of fastest, accurate, default, "
        "elastico, predictive (default fastest,accurate,default): static fastest and most "
        "accurate, the default serving (the policy's binding table behind the router's gate), "
        "Elastico's whole-workflow switching, the predictive strategy with admission",
    )
    parser.add_argument(
        "--time-scale",
        help="rag-sim serves its latencies times this; the load, SLO and cooldowns follow "
        "(default 0.2: the 180 s spike runs in 36 s; 0.25 with --cluster)",
    )
    parser.add_argument("--slo-ms", default="1000", help="p95 latency SLO, ms (default 1000)")
    parser.add_argument(
        "--base-qps",
        help="load before and after the spike (default: relative to this machine, the spike "
        "peaking at 65%% of the fastest configuration's capacity; the paper's peaks at 77%%; "
        "with --cluster the paper's)",
    )
    parser.add_argument("--duration", default="180", help="seconds of load (default 180)")
    parser.add_argument(
        "--profile-runs",
        help="measured requests per configuration (default 30; 20 with --cluster)",
    )


def _given(args: argparse.Namespace, flag: str) -> object:
    """The value a flag left in ``args`` (None or False: not given)."""
    return getattr(args, flag[2:].replace("-", "_"))


def _positive(
    args: argparse.Namespace, flag: str, example: str, default: str | None = None
) -> float:
    """The value of a flag that must be a number > 0 (its default when not given)."""
    return parse_number(flag, str(_given(args, flag) or default), example, low=0, inclusive=False)


def check_flags(args: argparse.Namespace) -> None:
    """A usage error for flags that do not go together (before anything runs)."""
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
    for flag in CLUSTER_FLAGS:
        if _given(args, flag) not in (None, False) and not args.cluster:
            fail(flag, "only with --cluster", f"add --cluster, or leave {flag} out")
    if args.whole_workflow and args.late_binding:
        fail("--whole-workflow", "not with --late-binding", "pass one of them")
    for flag in ("--binding-lag", "--binding-lag-reserve"):
        if _given(args, flag) is not None and args.whole_workflow:
            fail(flag, "not with --whole-workflow", f"leave {flag} out")
    if args.queue_from != "triton" and not args.whole_workflow:
        fail(
            "--queue-from",
            "only with --whole-workflow: with late binding the routers bind each request "
            "themselves, so where the policy reads the queue changes nothing that serves them",
            "add --whole-workflow, or leave --queue-from out",
        )


def run(args: argparse.Namespace, settings: SearchSettings) -> int:
    """Search, profile, plan and serve a spike on a local Triton (or through the operator)."""
    base_qps = None if args.base_qps is None else _positive(args, "--base-qps", "1.5")
    if args.cluster:
        from compass_dev import clusterdemo
        from compass_dev.clusterdemo_setup import ClusterDemoSettings

        return clusterdemo.run_cluster_demo(
            ClusterDemoSettings(
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
    from compass_dev import localdemo

    return localdemo.run_demo(
        localdemo.DemoSettings(
            output_dir=Path(str(args.output_dir)),
            search=settings,
            time_scale=_positive(args, "--time-scale", "0.2", "0.2"),
            slo_ms=_positive(args, "--slo-ms", "1000"),
            base_qps=base_qps,
            duration_s=_positive(args, "--duration", "180"),
            load_seed=settings.seed,
            measured_runs=parse_int("--profile-runs", str(args.profile_runs or 30), "30", low=2),
            runs=localdemo.parse_runs(args.runs),
        )
    )
