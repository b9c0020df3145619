"""Capacity under concurrency: predicted against measured, and Elastico on each capacity model.

Run as ``python bench/capacity.py [--servers 1,4] [--slos 500,750,1000,1500]
[--patterns spike,ramp,step,bursty] [--seeds 10] [--seed-offset 0] [--jobs 2]
[--requests 2000] [--interval 1] [--burst-memory 60] [--json PATH]``, or with ``--live [--time-scale 0.2]`` on real Triton
servers (below).

The simulator plays the hardware: a pod of rag-sim's pipeline (``RAG_SIM_STAGES``: retriever and
reranker of one instance each, a generator that batches) behind a router of c instances, serving
the paper's Pareto front. Two sections:

1. Capacity. Each front configuration's curve is measured by the profiler's ladder (seed 0);
   the planner's maximum rate at each SLO is read off it and, beside it, off the analytic models
   (M/G/c Erlang C and the paper's M/G/1). Each is compared with the rate at which a long run
   (``--check-requests`` Poisson arrivals, another seed) has its p95 cross the SLO, found by
   bisection. Floor: the measured-curve prediction within 15% for every configuration.
2. Serving. Every (SLO, pattern, seed) scenario, at the paper's load relative to the fastest
   configuration's measured capacity, served by static fastest, static most accurate and
   Elastico on each model's thresholds, and on the measured ones with a burst memory
   (``+memory``), and the predictive strategy with admission at dispatch (``predictive+adm``).
   Floors (measured curve): compliance >= static fastest - 1.0 point in every cell and >= 30%
   of the fastest-to-accurate accuracy gap on average.

``--ladder [--ladder-points 10]`` prints only the ladder's section: each front configuration's
rate at each SLO read off a curve of that many rates, measured by the ladder that halves below
its first rate regardless and by the SLO-aware one (told the SLO less the slack buffer, as the
profiling Job is), against the crossing, with the rates each spent below its first.

``--live`` measures the same on rag-sim served by a real tritonserver (this machine's CPU) per
router instance count: each front configuration is profiled one at a time, its curve measured
by the profiler's ladder (``--live-requests`` per rate, each rate the median of
``--live-curve-repeats`` runs, at most ``--live-points`` rates), and
the predicted rate at each SLO checked at 0.85 and 1.15 times the prediction, each by the
median p95 of ``--live-check-repeats`` open-loop runs of ``--live-check-requests`` (and at
least ``--live-check-seconds``); a curve rate runs at most ``--live-max-seconds``;
``--live-configs 0,1`` measures only those members of the front (fastest first). The server
runs on half of the cores and the load generator on the rest (``--no-live-pin``: both on all),
as in a deployment, where clients do not share the pod's cores.
``--live-drift K`` also measures each configuration's drain rate K times more after its checks
(each run at 1.3 times the curve's, for ``--live-check-seconds``) and prints how far it moved:
where it moves by more than the 0.85x-1.15x band (1.35x), no prediction from one curve can be
confirmed on that machine, however it is made; where it holds, a miss is the p95's own noise
below saturation, which longer runs (``--live-seconds``, ``--live-check-seconds``) shrink.
``--workflow qa-real`` does the same on qa-real (real retrieval and MiniLM on this CPU, its
encoder and reranker batching) for four of its configurations, at their own latencies. The prediction is within 15% of where p95 crosses the
SLO when p95 is within the SLO at the first and over it at the second.

The script always exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from compass.domain.admission import Admission, AdmissionPoint
from compass.domain.arrivals import make_pattern, make_scenario
from compass.domain.capacity import LADDER_START
from compass.domain.elastico import Elastico, ElasticoSettings
from compass.domain.evaluation import Config
from compass.domain.planner import Plan, Slo, ThresholdModel, pareto_front, plan_thresholds
from compass.domain.podmodel import RAG_SIM_STAGES, PodModel
from compass.domain.policy import Policy
from compass.domain.predictive import Predictive
from compass.domain.profiles import LatencyProfile, parse_profiles
from compass.domain.simulator import StaticController, simulate
from compass_dev.sim_capacity import measure_capacity

REPO_ROOT = Path(__file__).resolve().parents[1]
PROFILES = REPO_ROOT / "bench" / "data" / "compass-paper" / "planner_latency_profiles.json"
# The paper's base load (1.5 QPS) relative to its fastest configuration's capacity at c = 1.
BASE_QPS_AT_ONE_SERVER = 1.5
DURATION_S = 180.0
SLACK_BUFFER_MS = 50.0
PERCENTILE = 95.0
MODELS = (ThresholdModel.MEASURED, ThresholdModel.ERLANG_C, ThresholdModel.TAIL)
LABELS = {
    ThresholdModel.MEASURED: "measured",
    ThresholdModel.ERLANG_C: "erlang-c",
    ThresholdModel.TAIL: "m/g/1",
}
# Elastico on the measured thresholds with the burst memory (--burst-memory).
MEMORY = "+memory"
# The predictive strategy on the measured thresholds' plan, with admission at dispatch.
PREDICTIVE = "predictive+adm"
CAPACITY_TOLERANCE = 0.15
# Live: a prediction is confirmed when p95 is within the SLO at (1 - tolerance) times it and over
# it at (1 + tolerance) times it, so a capacity that moves by more than this ratio between runs
# cannot be confirmed by any prediction. --live-drift overloads at this multiple of the drain rate.
CHECK_BAND = (1 + CAPACITY_TOLERANCE) / (1 - CAPACITY_TOLERANCE)
DRIFT_OVERLOAD = 1.3
COMPLIANCE_TOLERANCE = 1.0
GAP_SHARE = 0.30


@lru_cache(maxsize=1)
def front() -> tuple[LatencyProfile, ...]:
    """The paper's Pareto front at p95."""
    profiles = parse_profiles(json.loads(PROFILES.read_text(encoding="utf-8")))
    return pareto_front(profiles, PERCENTILE).members


@lru_cache(maxsize=4)
def measured_front(servers: int, requests: int) -> tuple[LatencyProfile, ...]:
    """The front with each member's curve measured in a pod of ``servers`` instances."""
    pod = PodModel(servers, RAG_SIM_STAGES)
    return tuple(
        replace(profile, capacity=measure_capacity(profile, pod, seed=0, requests=requests))
        for profile in front()
    )


def crossing_qps(
    profile: LatencyProfile, pod: PodModel, slo_ms: float, requests: int, seed: int
) -> float:
    """The rate at which a long run's p95 crosses the SLO (bisection; 0 if it never meets it)."""

    def p95(rate: float) -> float:
        scenario = make_scenario(make_pattern("constant", rate, requests / rate), seed)
        report = simulate(
            StaticController(profile.name, 0), [profile], scenario, math.inf, pod_model=pod
        )
        return float(np.percentile(report.latencies_ms[requests // 5 :], PERCENTILE))

    if profile.latency_at(PERCENTILE) > slo_ms:
        return 0.0
    low, high = 0.0, 2 * pod.servers * 1000 / profile.mean_ms
    while high - low > 0.005 * high:
        middle = (low + high) / 2
        low, high = (middle, high) if p95(middle) <= slo_ms else (low, middle)
    return low


def plan_for(servers: int, requests: int, slo_ms: float, model: ThresholdModel) -> Plan:
    """One model's thresholds for the measured front."""
    return plan_thresholds(
        measured_front(servers, requests),
        Slo(slo_ms, PERCENTILE),
        SLACK_BUFFER_MS,
        model,
        servers=servers,
    )


@dataclass(frozen=True)
class Job:
    """One (servers, SLO, pattern, seed) scenario served by every policy."""

    servers: int
    requests: int
    slo_ms: float
    pattern: str
    seed: int
    interval_s: float
    burst_memory_s: float


def base_qps(servers: int, requests: int) -> float:
    """The paper's base load, scaled by how much more the pod serves at ``servers``."""
    fastest = measured_front(servers, requests)[0]
    assert fastest.capacity is not None
    return BASE_QPS_AT_ONE_SERVER * fastest.capacity.saturation_qps * fastest.mean_ms / 1000


def run_job(job: Job) -> tuple[Job, dict[str, tuple[float, float]]]:
    """Compliance and accuracy of each policy on one scenario."""
    members = measured_front(job.servers, job.requests)
    pod = PodModel(job.servers, RAG_SIM_STAGES)
    pattern = make_pattern(
        job.pattern, base_qps(job.servers, job.requests), DURATION_S, seed=job.seed
    )
    scenario = make_scenario(pattern, job.seed)
    controllers: dict[str, Policy] = {
        "fastest": StaticController(members[0].name, 0),
        "accurate": StaticController(members[-1].name, len(members) - 1),
    }
    for model in MODELS:
        plan = plan_for(job.servers, job.requests, job.slo_ms, model)
        controllers[LABELS[model]] = Elastico(plan)
    measured = plan_for(job.servers, job.requests, job.slo_ms, ThresholdModel.MEASURED)
    controllers[MEMORY] = Elastico(measured, ElasticoSettings(burst_memory_s=job.burst_memory_s))
    controllers[PREDICTIVE] = Predictive(measured)
    admission = Admission(job.slo_ms, at=AdmissionPoint.DISPATCH)
    outcome = {}
    for label, controller in controllers.items():
        report = simulate(
            controller,
            members,
            scenario,
            job.slo_ms,
            label,
            job.interval_s,
            pod_model=pod,
            admission=admission if label == PREDICTIVE else None,
        )
        outcome[label] = (report.compliance, report.mean_accuracy)
    return job, outcome


def capacity_section(servers: int, slos: Sequence[float], args: argparse.Namespace) -> list[str]:
    """Predicted against measured maximum rates, and the capacity floor."""
    pod = PodModel(servers, RAG_SIM_STAGES)
    lines = [f"capacity at c = {servers} (rag-sim stages), QPS at which p95 crosses the SLO:"]
    lines.append(
        f"  {'SLO':>5} {'configuration':<34} {'measured':>8} {'curve':>7} {'err':>6}"
        f" {'erlang-c':>8} {'err':>6} {'m/g/1':>6} {'err':>6}"
    )
    worst = 0.0
    for slo in slos:
        plans = {model: plan_for(servers, args.requests, slo, model) for model in MODELS}
        for i, profile in enumerate(measured_front(servers, args.requests)):
            truth = crossing_qps(profile, pod, slo, args.check_requests, seed=args.check_seed)
            if truth <= 0:
                continue
            cells = []
            for model in MODELS:
                predicted = plans[model].thresholds[i].stay_max_qps or 0.0
                error = predicted / truth - 1
                cells.append((predicted, error))
            worst = max(worst, abs(cells[0][1]))
            figures = " ".join(
                f"{p:>{w}.2f} {e:>+6.0%}" for (p, e), w in zip(cells, (7, 8, 6), strict=False)
            )
            lines.append(f"  {slo:>5g} {profile.name:<34} {truth:>8.2f} {figures}")
    verdict = "PASS" if worst <= CAPACITY_TOLERANCE else "FAIL"
    lines.append(
        f"  {verdict} measured curve within {CAPACITY_TOLERANCE:.0%} of the crossing for every "
        f"configuration (worst {worst:.1%})"
    )
    return lines


@dataclass(frozen=True)
class LadderJob:
    """One front member at one SLO and router size: its curve measured both ways."""

    servers: int
    slo_ms: float
    member: int
    requests: int
    check_requests: int
    check_seed: int
    max_points: int


def run_ladder_job(job: LadderJob) -> tuple[LadderJob, float, list[tuple[float, int, int]]]:
    """The crossing, and for the ladder that halves regardless and the SLO-aware one (told
    the SLO less the slack buffer, as the profiling Job is): the rate read at the SLO, the
    rates spent below the first one and in all."""
    pod = PodModel(job.servers, RAG_SIM_STAGES)
    profile = front()[job.member]
    truth = crossing_qps(profile, pod, job.slo_ms, job.check_requests, seed=job.check_seed)
    idle = profile.latency_at(PERCENTILE)
    first = LADDER_START * 1000 / profile.mean_ms
    rows = []
    for budget in (None, job.slo_ms - SLACK_BUFFER_MS):
        curve = measure_capacity(
            profile,
            pod,
            seed=0,
            requests=job.requests,
            slo_ms=budget,
            percentile=PERCENTILE,
            max_points=job.max_points,
        )
        below = sum(1 for point in curve.points if point.offered_qps < 0.75 * first)
        rows.append((curve.max_rate(job.slo_ms, PERCENTILE, idle), below, len(curve.points)))
    return job, truth, rows


def ladder_section(
    servers: Sequence[int], slos: Sequence[float], args: argparse.Namespace
) -> list[str]:
    """The rate read at the SLO off a curve of ``--ladder-points`` rates, by the ladder that
    halves below its first rate regardless and by the SLO-aware one, against the crossing."""
    jobs = [
        LadderJob(
            c, slo, i, args.requests, args.check_requests, args.check_seed, args.ladder_points
        )
        for c in servers
        for slo in slos
        for i in range(len(front()))
    ]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(run_ladder_job, jobs))
    lines = [
        f"ladder at {args.ladder_points} rates (rag-sim stages): QPS at which p95 crosses the "
        "SLO, read off the curve of the ladder that halves below its first rate regardless "
        "(plain) and of the SLO-aware one (told the SLO less the slack buffer); below: rates "
        "spent under the first, of all spent",
        f"  {'c':>2} {'SLO':>5} {'configuration':<34} {'measured':>8} {'plain':>7} {'err':>6}"
        f" {'below':>7} {'aware':>7} {'err':>6} {'below':>7}",
    ]
    worst: dict[tuple[str, int], float] = {}
    for job, truth, ((plain, plain_below, plain_all), (aware, aware_below, aware_all)) in results:
        if truth <= 0:
            continue
        name = front()[job.member].name
        errors = (plain / truth - 1, aware / truth - 1)
        for label, error in zip(("plain", "aware"), errors, strict=True):
            key = (label, job.servers)
            worst[key] = max(worst.get(key, 0.0), abs(error))
        lines.append(
            f"  {job.servers:>2} {job.slo_ms:>5g} {name:<34} {truth:>8.2f} {plain:>7.2f} "
            f"{errors[0]:>+6.0%} {plain_below:>3}/{plain_all:<3} {aware:>7.2f} {errors[1]:>+6.0%} "
            f"{aware_below:>3}/{aware_all:<3}"
        )
    for label in ("plain", "aware"):
        at = [f"{worst[(label, c)]:.1%} at c = {c}" for c in servers if (label, c) in worst]
        lines.append(f"  {label}: worst error {', '.join(at)}")
    return lines


def split_cores() -> tuple[set[int], set[int]] | None:
    """This process's cores in two halves, the server's and the load generator's (None with
    fewer than two)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    half = len(cores) // 2
    return set(cores[:half]), set(cores[half:])


def live_section(servers: int, slos: Sequence[float], args: argparse.Namespace) -> list[str]:
    """On a real tritonserver: curves measured, predictions checked at 0.85x and 1.15x."""
    import tempfile

    from compass.dataplane.profiler import (
        CurveSettings,
        ProfileSettings,
        measure_curve,
        measure_rate,
        profile_configuration,
    )
    from compass.dataplane.triton import TritonRouter
    from compass.domain.capacity import CapacityError
    from compass.domain.profiles import parse_profile
    from compass_dev.local_triton import LocalTriton, assemble_repository
    from compass_dev.scenarios import (
        PAPER_FRONT,
        QA_REAL_FRONT,
        QA_REAL_QUESTIONS,
        QUESTIONS,
        rag_sim_triton,
    )

    rng = np.random.default_rng(args.check_seed)
    luck = rng.uniform(0, 1, 1_000_000)
    workdir = Path(tempfile.mkdtemp(prefix="compass-capacity-"))
    if args.workflow == "qa-real":
        # Real computation: latencies are what they are (no time scale).
        scale = 1.0
        configs: Sequence[Config] = QA_REAL_FRONT

        def payload(index: int) -> dict[str, object]:
            return {"sample": index % QA_REAL_QUESTIONS}

        repository = assemble_repository(
            "qa-real", workdir / "models", instances={"router": servers}
        )
        server = LocalTriton(repository=repository)
    else:
        scale = args.time_scale
        configs = PAPER_FRONT

        def payload(index: int) -> dict[str, object]:
            return {"sample": index % QUESTIONS, "quantile": float(luck[index % len(luck)])}

        server = rag_sim_triton(workdir, scale, router_instances=servers)

    def check_requests(rate: float) -> int:
        """A check run's requests: long enough for a queue to show (near saturation it grows
        slowly)."""
        return max(int(args.live_check_requests), int(rate * args.live_check_seconds))

    def p95_at(router: TritonRouter, config: Config, rate: float) -> float:
        """The median p95 of ``--live-check-repeats`` runs: one run's p95 near a crossing
        moves with whatever else the machine does (two runs here at one rate read 177 ms and
        2,054 ms), and a median of three needs two of them to agree."""
        requests = check_requests(rate)
        runs = []
        for _ in range(args.live_check_repeats):
            try:
                point = measure_rate(router, config, rate, requests, payload, rng)
                runs.append(point.latency_at(PERCENTILE))
            except CapacityError:
                runs.append(math.inf)
        print(
            f"    check at {rate * scale:.2f}/s: p95 "
            + ", ".join(f"{run / scale:.0f}" for run in runs)
            + " ms",
            flush=True,
        )
        return float(np.median(runs))

    def drift_line(name: str, config: Config, curve_qps: float) -> str:
        """The drain rate measured ``--live-drift`` times more (overloaded runs: their
        throughput is what the pod drains at that moment), and how far it moved."""
        rate = DRIFT_OVERLOAD * curve_qps
        runs = [
            measure_rate(router, config, rate, check_requests(rate), payload, rng).throughput_qps
            for _ in range(args.live_drift)
        ]
        low, high = min(runs), max(runs)
        verdict = "wider than" if high > low * CHECK_BAND else "within"
        return (
            f"  {name}: drain rate {curve_qps * scale:.2f}/s in the curve, then "
            + ", ".join(f"{run * scale:.2f}" for run in runs)
            + f"/s: max/min {high / low:.2f}, {verdict} the check's band ({CHECK_BAND:.2f})"
        )

    lines = [
        f"live: {args.workflow} on tritonserver (CPU), router of {servers} instance(s), time "
        f"scale {scale:g}; rates and latencies at the workflow's own scale"
    ]
    lines.append(
        f"  {'SLO':>5} {'configuration':<34} {'curve':>7} {'erlang-c':>8} {'m/g/1':>6}"
        f" {'p95@0.85x':>9} {'p95@1.15x':>9}  within 15%"
    )
    if args.live_configs:
        chosen = [int(i) for i in args.live_configs.split(",")]
        if any(not 0 <= i < len(configs) for i in chosen):
            raise SystemExit(
                f"--live-configs: {args.live_configs} is not among 0..{len(configs) - 1}; "
                "give indices into the front, fastest first"
            )
        configs = [configs[i] for i in chosen]
    passed = checked = 0
    cores = split_cores() if args.live_pin else None
    if cores is not None:
        # The server (and its stubs, which inherit it) on one half, this load generator on the
        # other: on shared cores the generator's own load moved the pod's capacity between runs.
        os.sched_setaffinity(0, cores[0])
    server.start(workdir)
    if cores is not None:
        os.sched_setaffinity(0, cores[1])
        lines[0] += (
            f"; the server on cores {sorted(cores[0])}, the load generator on {sorted(cores[1])}"
        )
    router = TritonRouter(server.grpc_url, timeout_s=120.0)
    try:
        # qa-real's dense retriever embeds the corpus on its first request.
        router.infer(payload(0), config=configs[-1])
        for config in configs:
            entry = profile_configuration(router, config, ProfileSettings(5, 60), payload)
            started = time.monotonic()
            curve = measure_curve(
                router,
                config,
                entry["latency_mean_ms"],
                servers,
                payload,
                CurveSettings(
                    args.live_requests,
                    args.live_points,
                    seconds_per_rate=args.live_seconds,
                    max_seconds_per_rate=args.live_max_seconds,
                    repeats_per_rate=args.live_curve_repeats,
                ),
                progress=lambda point: print(
                    f"    {point.offered_qps:7.2f}/s -> {point.throughput_qps:7.2f}/s, "
                    f"p95 {point.latency_at(95):7.1f} ms",
                    flush=True,
                ),
                idle_p95_ms=entry["latency_p95_ms"],
            )
            entry = {**entry, "accuracy": 0.5, "capacity": curve.to_json()}
            profile = parse_profile(entry, "live")
            drain = (
                f"drains {curve.saturation_qps:.1f}/s saturated"
                if curve.saturated
                else f"never saturated (served {curve.saturation_qps:.1f}/s)"
            )
            print(
                f"  {profile.name}: curve in {time.monotonic() - started:.0f} s, {drain}",
                flush=True,
            )
            for slo in slos:
                budget = slo * scale
                if profile.latency_at(PERCENTILE) > budget:
                    # No rate meets it (the planner refuses such an SLO): nothing to check.
                    lines.append(
                        f"  {slo:>5g} {profile.name:<34} one at a time p95 "
                        f"{profile.latency_at(PERCENTILE) / scale:.0f} ms is over the SLO"
                    )
                    print(lines[-1], flush=True)
                    continue
                rates = {
                    model: plan_thresholds(
                        [profile], Slo(budget, PERCENTILE), 0.0, model, servers=servers
                    )
                    .thresholds[0]
                    .stay_max_qps
                    or 0.0
                    for model in MODELS
                }
                predicted = rates[ThresholdModel.MEASURED]
                if predicted <= 0:
                    continue
                below = p95_at(router, config, (1 - CAPACITY_TOLERANCE) * predicted)
                above = p95_at(router, config, (1 + CAPACITY_TOLERANCE) * predicted)
                ok = below <= budget < above
                passed += ok
                checked += 1
                figures = " ".join(
                    f"{rates[m] * scale:>{w}.2f}" for m, w in zip(MODELS, (7, 8, 6), strict=True)
                )
                lines.append(
                    f"  {slo:>5g} {profile.name:<34} {figures} {below / scale:>9.0f} "
                    f"{above / scale:>9.0f}  {'yes' if ok else 'NO'}"
                )
                print(lines[-1], flush=True)
            if args.live_drift:
                lines.append(drift_line(profile.name, config, curve.saturation_qps))
                print(lines[-1], flush=True)
    finally:
        router.close()
        server.stop()
        if cores is not None:
            # Back on every core: the next router size splits them again.
            os.sched_setaffinity(0, cores[0] | cores[1])
    verdict = "PASS" if passed == checked else "FAIL"
    lines.append(
        f"  {verdict} the measured curve's rate is within 15% of the crossing for {passed}/"
        f"{checked} (configuration, SLO) pairs"
    )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="1,4", help="router instances per pod, e.g. 1,4")
    parser.add_argument("--slos", default="500,750,1000,1500", help="SLOs in ms")
    parser.add_argument("--patterns", default="spike,ramp,step,bursty", help="load patterns")
    parser.add_argument("--seeds", type=int, default=10, help="seeds per cell")
    parser.add_argument("--seed-offset", type=int, default=0, help="first seed (held out: 100)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    parser.add_argument("--requests", type=int, default=2000, help="requests per curve rate")
    parser.add_argument("--check-requests", type=int, default=4000, help="requests per check")
    parser.add_argument("--check-seed", type=int, default=7, help="seed of the check runs")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between looks")
    parser.add_argument(
        "--burst-memory", type=float, default=60.0, help=f"seconds, for the {MEMORY} column"
    )
    parser.add_argument("--json", type=Path, help="write the serving cells here")
    parser.add_argument("--live", action="store_true", help="on real Triton servers instead")
    parser.add_argument(
        "--ladder",
        action="store_true",
        help="only the ladder with and without the SLO, at --ladder-points rates a curve",
    )
    parser.add_argument("--ladder-points", type=int, default=10, help="ladder: rates per curve")
    parser.add_argument(
        "--workflow", choices=("rag-sim", "qa-real"), default="rag-sim", help="live: which one"
    )
    parser.add_argument("--time-scale", type=float, default=0.2, help="live: latencies x this")
    parser.add_argument("--live-requests", type=int, default=200, help="live: per curve rate")
    parser.add_argument("--live-points", type=int, default=10, help="live: rates per curve")
    parser.add_argument(
        "--live-seconds", type=float, default=10.0, help="live: at least, per curve rate"
    )
    parser.add_argument(
        "--live-max-seconds", type=float, default=60.0, help="live: at most, per curve rate"
    )
    parser.add_argument(
        "--live-configs", default="", help="live: front indices to measure, e.g. 0,1 (all)"
    )
    parser.add_argument("--live-check-requests", type=int, default=400, help="live: per check")
    parser.add_argument(
        "--live-check-seconds", type=float, default=20.0, help="live: at least, per check"
    )
    parser.add_argument(
        "--live-check-repeats", type=int, default=3, help="live: runs per check (median p95)"
    )
    parser.add_argument(
        "--live-pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="live: the server on half the cores, the load generator on the rest",
    )
    parser.add_argument(
        "--live-curve-repeats", type=int, default=3, help="live: runs per curve rate (median)"
    )
    parser.add_argument(
        "--live-drift",
        type=int,
        default=0,
        help="live: drain-rate runs per configuration after its checks, to see it move (0: none)",
    )
    args = parser.parse_args(argv)
    if args.live_check_repeats < 1 or args.live_curve_repeats < 1:
        parser.error("--live-check-repeats, --live-curve-repeats: give 1 or more runs")
    if args.live_drift < 0:
        parser.error("--live-drift: give 0 or more runs")
    servers = [int(s) for s in args.servers.split(",")]
    slos = [float(s) for s in args.slos.split(",")]
    patterns = args.patterns.split(",")
    started = time.monotonic()
    if args.live:
        for c in servers:
            print("\n".join(live_section(c, slos, args)))
        print(f"({time.monotonic() - started:.0f} s)")
        return 0
    if args.ladder:
        print("\n".join(ladder_section(servers, slos, args)))
        print(f"({time.monotonic() - started:.0f} s)")
        return 0
    for c in servers:
        print("\n".join(capacity_section(c, slos, args)))
    jobs = [
        Job(c, args.requests, slo, pattern, seed, args.interval, args.burst_memory)
        for c in servers
        for slo in slos
        for pattern in patterns
        for seed in range(args.seed_offset, args.seed_offset + args.seeds)
    ]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(run_job, jobs))
    cells: dict[tuple[int, float, str], dict[str, list[tuple[float, float]]]] = {}
    for job, outcome in results:
        cell = cells.setdefault((job.servers, job.slo_ms, job.pattern), {})
        for label, figures in outcome.items():
            cell.setdefault(label, []).append(figures)
    policies = [*LABELS.values(), MEMORY, PREDICTIVE]
    labels = ["fastest", "accurate", *policies]
    rows = []
    for c in servers:
        print(
            f"\nserving at c = {c}: base {base_qps(c, args.requests):.2f} QPS per pod, "
            f"{args.seeds} seeds from {args.seed_offset}, a look every {args.interval:g} s, "
            f"{MEMORY}: measured with a {args.burst_memory:g} s burst memory; {PREDICTIVE}: the "
            "predictive strategy with admission at dispatch; compliance % / share of the "
            "fastest-to-accurate accuracy gap"
        )
        print(f"  {'SLO':>5} {'pattern':<7} " + " ".join(f"{label:>14}" for label in labels))
        shares: dict[str, list[float]] = {label: [] for label in policies}
        misses: dict[str, list[str]] = {label: [] for label in policies}
        for slo in slos:
            for pattern in patterns:
                means = {
                    label: (
                        float(np.mean([v[0] for v in values])),
                        float(np.mean([v[1] for v in values])),
                    )
                    for label, values in cells[(c, slo, pattern)].items()
                }
                fast_c, fast_a = means["fastest"]
                gap = means["accurate"][1] - fast_a
                parts = []
                row: dict[str, object] = {"servers": c, "slo_ms": slo, "pattern": pattern}
                for label in labels:
                    compliance, accuracy = means[label]
                    share = (accuracy - fast_a) / gap if gap > 0 else 0.0
                    row[label] = {"compliance_pct": compliance, "accuracy": accuracy}
                    if label in shares:
                        shares[label].append(share)
                        if compliance < fast_c - COMPLIANCE_TOLERANCE:
                            misses[label].append(f"{slo:g} {pattern} ({compliance - fast_c:+.1f})")
                        parts.append(f"{compliance:>6.1f}/{share:>6.0%}")
                    else:
                        parts.append(f"{compliance:>6.1f}/{accuracy:.4f}")
                rows.append(row)
                print(f"  {slo:>5g} {pattern:<7} " + " ".join(f"{p:>14}" for p in parts))
        for label in policies:
            mean_share = float(np.mean(shares[label]))
            compliance_ok = not misses[label]
            verdict = "PASS" if compliance_ok and mean_share >= GAP_SHARE else "FAIL"
            where = f": {', '.join(misses[label])}" if misses[label] else ""
            print(
                f"  {verdict} {label}: compliance >= fastest - {COMPLIANCE_TOLERANCE:g} in "
                f"{len(shares[label]) - len(misses[label])}/{len(shares[label])} cells{where}; "
                f"{mean_share:.0%} of the accuracy gap on average (floor {GAP_SHARE:.0%})"
            )
    if args.json:
        args.json.write_text(json.dumps({"cells": rows}, indent=1), encoding="utf-8")
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
