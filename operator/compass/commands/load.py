"""`compass load`: open-loop load through the router, every request recorded."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from compass.commands.common import (
    add_pattern_arguments,
    add_triton_arguments,
    check_endpoint,
    check_output,
    check_some_requests,
    pattern_from_args,
    triton_tls,
    write_text,
)
from compass.console import parse_int, parse_number
from compass.dataplane.load import run_load
from compass.domain.arrivals import make_scenario


def register(commands: Any, summary: str) -> None:
    """Add `compass load` to the `compass` parser."""
    load = commands.add_parser(
        "load",
        help=summary,
        description="Open-loop Poisson arrivals shaped by a pattern (the simulator's patterns, "
        "same seed, same arrivals); records per request its send time, latency, the "
        "configuration that served it, its score and any error, as JSON Lines.",
    )
    add_triton_arguments(load, "Triton gRPC")
    add_pattern_arguments(load)
    load.add_argument("--samples", default="100", help="requests cycle through samples 0..N-1")
    load.add_argument("--slo-ms", help="also report compliance with this latency target")
    load.add_argument("--output", metavar="RECORDS.jsonl", help="write one line per request")
    load.set_defaults(handler=load_command)


def load_command(args: argparse.Namespace) -> int:
    """Drive the router with a load pattern and report what was served."""

    check_endpoint("--triton", str(args.triton))
    if args.output:
        check_output("--output", Path(args.output), {"--trace": args.trace})
    samples = parse_int("--samples", args.samples, "100", low=1)
    tls = triton_tls(args)
    # Checked before any request is sent, not after the whole load has run.
    slo = (
        None
        if args.slo_ms is None
        else parse_number("--slo-ms", args.slo_ms, "1000", low=0, inclusive=False)
    )
    pattern, seed = pattern_from_args(args)
    scenario = make_scenario(pattern, seed)
    check_some_requests(pattern, seed, scenario.requests)
    print(
        f"compass load: {scenario.requests} requests over {pattern.duration_s:g} s "
        f"({args.pattern}, peak {pattern.peak_qps:.2f} QPS) to {args.router} at {args.triton}",
        file=sys.stderr,
    )

    def payload(index: int) -> dict[str, Any]:
        # The simulator's per-request luck travels as the latency quantile, so a workflow
        # that honours it (rag-sim) serves the very requests the simulator replays.
        return {"sample": index % samples, "quantile": float(scenario.luck[index])}

    records = run_load(
        args.triton, scenario.arrivals_s.tolist(), payload, model=args.router, tls=tls
    )
    if args.output:
        write_text(Path(args.output), "".join(json.dumps(r.__dict__) + "\n" for r in records))
    ok = [r for r in records if r.error is None]
    latencies = np.array([r.latency_s * 1000 for r in ok])
    scores = [r.score for r in ok if r.score is not None]
    print(f"requests {len(records)}, failed {len(records) - len(ok)}")
    if len(latencies):
        p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
        print(f"latency ms: p50 {p50:.0f}  p95 {p95:.0f}  p99 {p99:.0f}")
    if slo is not None:
        within = sum(1 for r in ok if r.latency_s * 1000 <= slo)
        print(f"SLO {slo:g} ms: {100 * within / max(len(records), 1):.1f}% of requests within")
    if scores:
        print(f"mean score {sum(scores) / len(scores):.4f}")
    for config, count in Counter(record.config or "?" for record in ok).most_common():
        print(f"  {count:6d}  {config}")
    return 0 if len(ok) == len(records) else 1
