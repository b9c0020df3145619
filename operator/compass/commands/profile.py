"""`compass profile`: the latency of a search's feasible configurations, through the router."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from compass.commands.common import (
    add_triton_arguments,
    check_endpoint,
    check_output,
    read_document,
    triton_tls,
    write_text,
)
from compass.console import describe_work_rate, fail, parse_int
from compass.dataplane.podpool import PodPool, ProfilingTimeLimitError, TimeLimit
from compass.dataplane.profiler import ProfileSettings, profile_configurations
from compass.dataplane.triton import RoutingError, TritonRouter
from compass.domain.evaluation import Config


def register(commands: Any, summary: str) -> None:
    """Add `compass profile` to the `compass` parser."""
    profile = commands.add_parser(
        "profile",
        help=summary,
        description="Send warm-up and measured requests, one at a time, through the router "
        "with a per-request configuration override (production traffic keeps its "
        "configuration), and write mean/p50/p95/p99/std per configuration in the profiles "
        "format `compass plan` reads. Given several Triton addresses (one per pod), each "
        "measures one configuration at a time, all of them at once.",
    )
    add_triton_arguments(
        profile,
        "Triton gRPC; one address per pod, comma-separated, to profile on every pod at once",
        metavar="HOST:PORT[,HOST:PORT...]",
    )
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
    profile.add_argument(
        "--max-seconds",
        metavar="S",
        help="stop with an error past this many seconds of profiling (default: no bound)",
    )
    profile.add_argument("--output", required=True, metavar="PROFILES.json")
    profile.set_defaults(handler=profile_command)


def _feasible_from_result(path: Path) -> list[tuple[Config, float | None]]:
    """The feasible configurations of a search result, with their accuracy."""
    document = read_document("--result", path)
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
    """Profile every feasible configuration of a search result through the router, over
    every address given (each one configuration at a time)."""

    addresses = list(dict.fromkeys(a.strip() for a in str(args.triton).split(",") if a.strip()))
    if not addresses:
        fail("--triton", "no address given", "give HOST:PORT, or several comma-separated")
    for address in addresses:
        check_endpoint("--triton", address)
    output = Path(args.output)
    check_output("--output", output, {"--result": args.result})
    configs = _feasible_from_result(Path(args.result))
    settings = ProfileSettings(
        warmup_runs=parse_int("--warmup", args.warmup, "3", low=1),
        measured_runs=parse_int("--runs", args.runs, "50", low=1),
    )
    samples = parse_int("--samples", args.samples, "100", low=1)
    max_seconds = (
        None
        if args.max_seconds is None
        else parse_int("--max-seconds", args.max_seconds, "600", low=1)
    )
    tls = triton_tls(args)
    routers = {a: TritonRouter(a, model=args.router, tls=tls) for a in addresses}
    limit = TimeLimit(max_seconds, "--max-seconds", time.monotonic())
    pool: PodPool[Any, Any] = PodPool(routers, limit)

    def payload(index: int) -> dict[str, Any]:
        return {"sample": index % samples}

    def progress(done: int, total: int) -> None:
        rate = describe_work_rate(done, total, limit.elapsed())
        print(
            f"\rprofiled {done}/{total} on {len(pool.pods)} pod(s)  {rate}  ",
            end="",
            file=sys.stderr,
            flush=True,
        )

    try:
        document = profile_configurations(pool, configs, settings, payload, progress)
    except (RoutingError, ProfilingTimeLimitError) as error:
        print(f"\ncompass profile: error: {error}", file=sys.stderr)
        return 1
    finally:
        for router in routers.values():
            router.close()
    print(file=sys.stderr)
    write_text(output, json.dumps(document, indent=1) + "\n")
    print(f"{'mean':>8} {'p95':>8}  configuration (ms)")
    for entry in document["profiles"]:
        print(
            f"{entry['latency_mean_ms']:8.1f} {entry['latency_p95_ms']:8.1f}  "
            f"{json.dumps(entry['config'], sort_keys=True)}"
        )
    for pod in document["metadata"]["pods"]:
        lost = f" (left: {pod['lost']})" if "lost" in pod else ""
        print(f"pod {pod['pod']}: {pod['measured']} measured{lost}")
    print(
        f"wrote {output}: {len(document['profiles'])} profiles in {limit.elapsed():.1f} s "
        f"on {len(routers)} pod(s)"
    )
    return 0
