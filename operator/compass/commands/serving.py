"""`compass profile`, `compass load` and `compass serve`: the data-plane commands."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from compass.console import fail, parse_int, parse_number
from compass.domain.evaluation import Config

# The gRPC client is imported by the commands that use it, so `compass search` starts fast.
DEFAULT_ROUTER = "router"


def register(commands: Any) -> None:
    """Add the data-plane subcommands to the `compass` parser."""
    profile = commands.add_parser(
        "profile",
        help="measure the latency of configurations through the router",
        description="Send warm-up and measured requests, one at a time, through the router "
        "with a per-request configuration override (production traffic keeps its "
        "configuration), and write mean/p50/p95/p99/std per configuration in the profiles "
        "format `compass plan` reads.",
    )
    profile.add_argument("--triton", required=True, metavar="HOST:PORT", help="Triton gRPC")
    profile.add_argument("--router", default=DEFAULT_ROUTER, help="router model name")
    profile.add_argument(
        "--result",
        required=True,
        metavar="RESULT.json",
        help="a `compass search` result: its feasible configurations are profiled",
    )
    profile.add_argument("--warmup", default="3", help="unmeasured requests per configuration")
    profile.add_argument("--runs", default="50", help="measured requests per configuration")
    profile.add_argument(
        "--samples", default="100", help="requests cycle through sample indices 0..N-1"
    )
    profile.add_argument("--output", required=True, metavar="PROFILES.json")
    profile.set_defaults(handler=profile_command)

    load = commands.add_parser(
        "load",
        help="send open-loop load to the router and record every request",
        description="Open-loop Poisson arrivals shaped by a pattern (the simulator's patterns, "
        "same seed, same arrivals); records per request its send time, latency, the "
        "configuration that served it, its score and any error, as JSON Lines.",
    )
    load.add_argument("--triton", required=True, metavar="HOST:PORT", help="Triton gRPC")
    load.add_argument("--router", default=DEFAULT_ROUTER, help="router model name")
    from compass.commands.planning import add_pattern_arguments

    add_pattern_arguments(load)
    load.add_argument("--samples", default="100", help="requests cycle through samples 0..N-1")
    load.add_argument("--slo-ms", help="also report compliance with this latency target")
    load.add_argument("--output", metavar="RECORDS.jsonl", help="write one line per request")
    load.set_defaults(handler=load_command)

    serve = commands.add_parser(
        "serve",
        help="run Elastico live against Triton, outside Kubernetes",
        description="Every interval: read the router's queue depth (Triton's /metrics or "
        "Prometheus), run the policy's decide, and switch the router when it says so: the "
        "code path the operator's timer runs. Prints one line per switch or problem.",
    )
    serve.add_argument(
        "--policy", required=True, metavar="POLICY.yaml", help="`compass plan` output"
    )
    serve.add_argument("--triton", required=True, metavar="HOST:PORT", help="Triton gRPC")
    serve.add_argument("--router", default=DEFAULT_ROUTER, help="router model name")
    serve.add_argument(
        "--metrics",
        required=True,
        metavar="URL",
        help="Triton's metrics URL (http://host:8002/metrics) or Prometheus' base URL",
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


def _feasible_from_result(path: Path) -> list[tuple[Config, float | None]]:
    """The feasible configurations of a search result, with their accuracy."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        fail("--result", f"cannot read {path}: {error.strerror}", "give a `compass search` result")
    except json.JSONDecodeError as error:
        fail(
            "--result",
            f"{path} is not JSON ({error.msg}, line {error.lineno})",
            "give a `compass search` result",
        )
    feasible = document.get("feasible") if isinstance(document, dict) else None
    if not isinstance(feasible, list) or not all(
        isinstance(e, dict) and isinstance(e.get("config"), dict) for e in feasible
    ):
        fail(
            "--result",
            f"{path} has no 'feasible' list of {{config, accuracy}}",
            "give a `compass search` result",
        )
    if not feasible:
        fail("--result", f"{path} has no feasible configuration", "lower tau and search again")
    return [(entry["config"], entry.get("accuracy")) for entry in feasible]


def profile_command(args: argparse.Namespace) -> int:
    """Profile every feasible configuration of a search result through the router."""
    from compass.dataplane.profiler import ProfileSettings, profile_configurations
    from compass.dataplane.triton import RoutingError, TritonRouter

    configs = _feasible_from_result(Path(args.result))
    settings = ProfileSettings(
        warmup_runs=parse_int("--warmup", args.warmup, "3", low=1),
        measured_runs=parse_int("--runs", args.runs, "50", low=1),
    )
    samples = parse_int("--samples", args.samples, "100", low=1)
    router = TritonRouter(args.triton, model=args.router)

    def payload(index: int) -> dict[str, Any]:
        return {"sample": index % samples}

    def progress(done: int, total: int) -> None:
        print(f"\rprofiled {done}/{total}", end="", file=sys.stderr, flush=True)

    try:
        document = profile_configurations(router, configs, settings, payload, progress)
    except RoutingError as error:
        print(f"\ncompass profile: error: {error}", file=sys.stderr)
        return 1
    finally:
        router.close()
    print(file=sys.stderr)
    output = Path(args.output)
    output.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(f"{'mean':>8} {'p95':>8}  configuration (ms)")
    for entry in document["profiles"]:
        print(
            f"{entry['latency_mean_ms']:8.1f} {entry['latency_p95_ms']:8.1f}  "
            f"{json.dumps(entry['config'], sort_keys=True)}"
        )
    print(f"wrote {output}: {len(document['profiles'])} profiles")
    return 0


def load_command(args: argparse.Namespace) -> int:
    """Drive the router with a load pattern and report what was served."""
    import numpy as np

    from compass.commands.planning import pattern_from_args
    from compass.dataplane.load import run_load
    from compass.domain.simulator import make_scenario

    samples = parse_int("--samples", args.samples, "100", low=1)
    pattern, seed = pattern_from_args(args)
    scenario = make_scenario(pattern, seed)
    print(
        f"compass load: {scenario.requests} requests over {pattern.duration_s:g} s "
        f"({args.pattern}, peak {pattern.peak_qps:.2f} QPS) to {args.router} at {args.triton}",
        file=sys.stderr,
    )

    def payload(index: int) -> dict[str, Any]:
        # The simulator's per-request luck travels as the latency quantile, so a workflow
        # that honours it (rag-sim) serves the very requests the simulator replays.
        return {"sample": index % samples, "quantile": float(scenario.luck[index])}

    records = run_load(args.triton, scenario.arrivals_s.tolist(), payload, model=args.router)
    if args.output:
        with Path(args.output).open("w", encoding="utf-8") as out:
            for record in records:
                out.write(json.dumps(record.__dict__) + "\n")
    ok = [r for r in records if r.error is None]
    latencies = np.array([r.latency_s * 1000 for r in ok])
    scores = [r.score for r in ok if r.score is not None]
    print(f"requests {len(records)}, failed {len(records) - len(ok)}")
    if len(latencies):
        p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
        print(f"latency ms: p50 {p50:.0f}  p95 {p95:.0f}  p99 {p99:.0f}")
    if args.slo_ms:
        slo = parse_number("--slo-ms", args.slo_ms, "1000", low=0, inclusive=False)
        within = sum(1 for r in ok if r.latency_s * 1000 <= slo)
        print(f"SLO {slo:g} ms: {100 * within / max(len(records), 1):.1f}% of requests within")
    if scores:
        print(f"mean score {sum(scores) / len(scores):.4f}")
    served: dict[str, int] = {}
    for record in ok:
        served[record.config or "?"] = served.get(record.config or "?", 0) + 1
    for config, count in sorted(served.items(), key=lambda item: -item[1]):
        print(f"  {count:6d}  {config}")
    return 0 if len(ok) == len(records) else 1


def serve_command(args: argparse.Namespace) -> int:
    """Run the live loop until --duration passes or the user interrupts."""
    import time

    from compass.commands.planning import load_policy
    from compass.dataplane.live import LiveLoop
    from compass.dataplane.metrics import source_for
    from compass.dataplane.triton import RoutingError, TritonRouter

    spec = load_policy(Path(args.policy))
    duration = (
        parse_number("--duration", args.duration, "60", low=0, inclusive=False)
        if args.duration
        else None
    )
    policy = spec.elastico()
    loop = LiveLoop(
        policy,
        source_for(args.metrics_type, args.metrics, args.router, args.query),
        TritonRouter(args.triton, model=args.router),
    )
    started = time.monotonic()
    try:
        state = loop.initial_state(started)
    except RoutingError as error:
        print(f"compass serve: error: {error}", file=sys.stderr)
        return 1
    print(f"compass serve: starting on {state.active or 'an unknown configuration'}")
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
                    f"(queue {depth:g}; {result.decision.reason}; reload "
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
