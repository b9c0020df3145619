"""Profiling in parallel on real tritonservers: the feasible set on 1 pod against N pods.

Run as ``python bench/profile_parallel.py [--servers 2] [--tau 0.8] [--time-scale 0.2]
[--warmup 3] [--runs 50] [--repeats 1]``. Starts ``--servers`` rag-sim tritonservers (each its
own process and port, as pods of one Deployment; latencies x ``--time-scale``) and profiles the
same configurations twice with the profiler the `compass profile` command and the profiling Job
run (``compass.dataplane.profiler.profile_configurations`` over a ``PodPool``): on the first
server alone, then on all of them, each server measuring one configuration at a time. The
configurations are rag-sim's whose recorded accuracy is at least ``--tau`` (the feasible set the
search converges to at that threshold; 33 at 0.8), at the profiling Job's defaults (3 warm-up
and 50 measured requests each).

Printed: each run's wall time, configurations per pod, the speed-up (1-pod wall / N-pod wall)
against the floor (issue 44: at least 1.8x on 2 replicas), and how far each configuration's
mean moved between the runs (a pod measuring two configurations at once would read queueing,
not service time: the means must agree). ``--repeats R`` runs the pair R times and reports the
median ratio. The load average is printed at the start and the end (the machine is shared).
The script always exits 0; the floor is printed as a PASS/FAIL line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from compass.dataplane.podpool import PodPool
from compass.dataplane.profiler import ProfileSettings, profile_configurations
from compass.dataplane.triton import TritonRouter
from compass.domain.evaluation import Config
from compass_dev.local_triton import LocalTriton
from compass_dev.scenarios import FASTEST, rag_sim_data, rag_sim_triton

FLOOR = 1.8


def load() -> str:
    """The load averages, as `uptime` prints them."""
    one, five, fifteen = os.getloadavg()
    return f"load average: {one:.2f}, {five:.2f}, {fifteen:.2f}"


def feasible(tau: float) -> list[tuple[Config, float | None]]:
    """rag-sim's configurations whose recorded accuracy reaches tau, most accurate first."""
    configs = rag_sim_data()["configs"]
    chosen = []
    for key, facts in configs.items():
        accuracy = float(np.mean(facts["scores"]))
        if accuracy >= tau:
            chosen.append((dict(json.loads(key)), accuracy))
    return sorted(chosen, key=lambda pair: -float(pair[1] or 0))


def profile(
    servers: list[LocalTriton],
    configs: list[tuple[Config, float | None]],
    settings: ProfileSettings,
    samples: int,
) -> tuple[float, dict[str, Any]]:
    """One profiling of ``configs`` over these servers: its wall time and document."""
    routers = {s.grpc_url: TritonRouter(s.grpc_url) for s in servers}
    pool: PodPool[Any, Any] = PodPool(routers)
    try:
        started = time.perf_counter()
        document = profile_configurations(
            pool, configs, settings, lambda i: {"sample": i % samples}
        )
        wall = time.perf_counter() - started
    finally:
        for router in routers.values():
            router.close()
    return wall, document


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=2, help="pods profiled on at once")
    parser.add_argument("--tau", type=float, default=0.8, help="the feasible set's threshold")
    parser.add_argument("--time-scale", type=float, default=0.2, help="rag-sim's latencies x")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up requests a configuration")
    parser.add_argument("--runs", type=int, default=50, help="measured requests a configuration")
    parser.add_argument("--repeats", type=int, default=1, help="pairs of runs (median ratio)")
    args = parser.parse_args()
    if args.servers < 2:
        parser.error("--servers: give at least 2 (the comparison is 1 pod against N)")

    configs = feasible(args.tau)
    samples = len(next(iter(rag_sim_data()["configs"].values()))["scores"])
    settings = ProfileSettings(args.warmup, args.runs)
    print(
        f"profiling {len(configs)} configurations (rag-sim accuracy >= {args.tau:g}) at "
        f"{args.warmup} + {args.runs} requests each, time scale {args.time_scale:g}, on 1 pod "
        f"and on {args.servers}; {load()}",
        flush=True,
    )
    workdir = Path(tempfile.mkdtemp(prefix="compass-profile-parallel-"))
    servers: list[LocalTriton] = []
    try:
        for index in range(args.servers):
            where = workdir / f"pod-{index}"
            server = rag_sim_triton(where, args.time_scale, FASTEST)
            servers.append(server.start(where))
        ratios = []
        means_moved = []
        for repeat in range(args.repeats):
            alone, one = profile(servers[:1], configs, settings, samples)
            spread, many = profile(servers, configs, settings, samples)
            ratios.append(alone / spread)
            per_pod = ", ".join(f"{p['pod']} {p['measured']}" for p in many["metadata"]["pods"])
            moved = [
                b["latency_mean_ms"] / a["latency_mean_ms"] - 1
                for a, b in zip(one["profiles"], many["profiles"], strict=True)
            ]
            worst = max(moved, key=abs)
            means_moved.append(abs(worst))
            print(
                f"run {repeat + 1}: 1 pod {alone:.1f} s, {args.servers} pods {spread:.1f} s "
                f"(configurations per pod: {per_pod}): {alone / spread:.2f}x; means on "
                f"{args.servers} pods against 1: median {statistics.median(moved):+.1%}, worst "
                f"{worst:+.1%}; {load()}",
                flush=True,
            )
    finally:
        for server in servers:
            server.stop()
    ratio = statistics.median(ratios)
    verdict = "PASS" if ratio >= FLOOR else "FAIL"
    print(
        f"{verdict}: profiling on {args.servers} pods {ratio:.2f}x faster than on 1 "
        f"(floor {FLOOR}x at 2); worst mean moved {max(means_moved):.1%}; {load()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
