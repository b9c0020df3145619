"""`compass serve`: Elastico live against Triton, outside Kubernetes."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from compass.api.urls import url_problem
from compass.commands.common import (
    add_triton_arguments,
    check_endpoint,
    load_policy,
    plan_error,
    triton_tls,
)
from compass.console import fail, parse_number
from compass.conversion import admission_table, binding_table, runtime_policy
from compass.dataplane.fleet import Endpoint, FleetQueueDepth, RouterFleet
from compass.dataplane.live import LiveLoop
from compass.dataplane.metrics import QueueDepthSource, source_for
from compass.dataplane.triton import RoutingError
from compass.domain.planner import PlanError


def register(commands: Any, summary: str) -> None:
    """Add `compass serve` to the `compass` parser."""
    serve = commands.add_parser(
        "serve",
        help=summary,
        description="Every interval: read the router's queue depth (Triton's /metrics or "
        "Prometheus), run the policy's decide, and put every replica's router on the "
        "configuration it says, with the policy's binding and admission tables (per-request "
        "binding, the default, binds each request from them): the code path the operator's "
        "timer runs. Prints one line per switch or problem.",
    )
    serve.add_argument(
        "--policy", required=True, metavar="POLICY.yaml", help="`compass plan` output"
    )
    add_triton_arguments(
        serve,
        "Triton gRPC endpoint; several (comma-separated): replicas switched together",
        metavar="HOST:PORT[,HOST:PORT...]",
    )
    serve.add_argument(
        "--metrics",
        required=True,
        metavar="URL[,URL...]",
        help="Triton's metrics URL (http://host:8002/metrics; one per replica, in --triton's "
        "order) or Prometheus' base URL (its query sums the replicas)",
    )
    serve.add_argument(
        "--metrics-type",
        choices=["triton", "prometheus"],
        default="triton",
        help="what --metrics is",
    )
    serve.add_argument("--query", help="PromQL for the queue depth (prometheus)")
    serve.add_argument("--duration", help="stop after this many seconds (default: run until ^C)")
    serve.set_defaults(handler=serve_command)


def serve_command(args: argparse.Namespace) -> int:
    """Run the live loop until --duration passes or the user interrupts."""

    addresses = [a.strip() for a in str(args.triton).split(",") if a.strip()]
    for address in addresses:
        check_endpoint("--triton", address)
    metrics = [m.strip() for m in str(args.metrics).split(",") if m.strip()]
    per_replica = args.metrics_type == "triton"
    for url in metrics:
        problem = url_problem(url)
        if problem is not None:
            fail("--metrics", problem, "give http(s)://host:port/path")
    if per_replica and len(metrics) != len(addresses):
        fail(
            "--metrics",
            f"{len(metrics)} metrics URL(s) for {len(addresses)} Triton replica(s)",
            "give one Triton metrics URL per --triton address, in the same order",
        )
    spec = load_policy(Path(args.policy))
    try:
        policy = runtime_policy(spec)
    except PlanError as exc:
        raise plan_error(exc, f"--policy {args.policy}") from None
    duration = (
        parse_number("--duration", args.duration, "60", low=0, inclusive=False)
        if args.duration
        else None
    )
    fleet = RouterFleet(
        [
            Endpoint(address, address, metrics[k] if per_replica else None)
            for k, address in enumerate(addresses)
        ],
        model=args.router,
        tls=triton_tls(args),
    )
    # The tables the operator sends with each switch: a served policy binds as it would.
    fleet.admission = admission_table(spec, policy.plan)
    fleet.binding = binding_table(spec, policy.plan)
    source: QueueDepthSource = (
        FleetQueueDepth(lambda: fleet.endpoints, args.router)
        if per_replica
        else source_for(
            args.metrics_type,
            metrics[0],
            args.router,
            args.query,
            pods=lambda: len(fleet.endpoints),
        )
    )
    loop = LiveLoop(policy, source, fleet)
    started = time.monotonic()
    try:
        state = loop.initial_state(started)
    except RoutingError as error:
        print(f"compass serve: error: {error}", file=sys.stderr)
        return 1
    print(f"compass serve: starting on {state.active or 'an unknown configuration'}")
    if fleet.binding is not None:
        print(
            f"compass serve: every switch carries the binding table (binding.mode "
            f"{spec.binding.mode.value}): the routers bind each request with a deadline, or "
            "behind their gate every request, to the most accurate configuration its time fits"
        )
    last_problem: str | None = None
    try:
        while duration is None or time.monotonic() - started < duration:
            tick = time.monotonic()
            result = loop.step(state, tick)
            state = result.state
            if result.switch is not None:
                depth = result.observation.queue_depth if result.observation else float("nan")
                print(
                    f"{tick - started:7.1f}s switched to {result.decision.target} "
                    f"(queue {depth:g}; {result.decision.reason}; every replica in "
                    f"{result.switch.seconds * 1000:.0f} ms)",
                    flush=True,
                )
            if result.problem != last_problem:
                # Problems are reported when they start and when they end, not every tick.
                message = result.problem or "recovered"
                print(f"{tick - started:7.1f}s {message}", flush=True)
                last_problem = result.problem
            time.sleep(max(0.0, spec.interval_seconds - (time.monotonic() - tick)))
    except KeyboardInterrupt:
        pass
    print(f"compass serve: stopped on {state.active} after {state.switches} switches")
    return 0
