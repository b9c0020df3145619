"""rag-sim or qa-real on real Tritons under load: the live policy against static baselines.

    python bench/serving_triton.py [--workflow rag-sim] [--replicas 2] [--router-instances 1]
                                   [--pipeline-slots G [--client-free]]
                                   [--binding-lag 0.3 --binding-lag-reserve 2]
                                   [--pattern spike] [--time-scale 0.25]
                                   [--slos 750,1000,1500] [--seed 0] [--json PATH]
                                   [--runs fastest,accurate,policy,policy+adm]
                                   [--admission-quantile 0.5] [--degrade-after 0.25]
                                   [--trace-name NAME [--utilisation 0.7] [--window-start S]
                                    [--window-s 600]]

Everything runs for real on this machine: N tritonservers (nvidia-pytriton's CPU build), each
on its own loopback address like pods behind a Service, serving rag-sim; the open-loop load
generator, which sends each request to one replica (the simulator's seeded assignment); the
latency profiler; and Elastico's live loop, which reads every replica's queue and switches
every replica's router through its control model. Time is scaled down by --time-scale
(service times, arrival rates, SLO, cooldowns and the decision interval together), which
leaves the queueing unchanged in scaled time. Every run replays the same seeded arrivals,
assignment and service-time luck (the simulator's scenario), so the static baselines, the live
policy and the simulator's prediction (N pods, the measured switch delay) are paired. Figures
are reported at the paper's scale (ms and QPS divided back by the time scale); switch times
are real milliseconds.

``policy+adm`` is the policy with admission at dispatch: each request carries the SLO as its
deadline and every router serves a request that would miss it on the fastest configuration, or
refuses it (UNAVAILABLE, counted as a miss in ``refused``, not as a failure), judged on each
front member's service time at ``--admission-quantile``; the simulator predicts it with the same
rule (compass.domain.admission, ``AdmissionPoint.DISPATCH``). ``accuracy`` is the answers' mean
score; ``served`` the mean profiled accuracy of the members that served the requests (what the
simulator counts, ``sim``), which judges the policy's choices without the luck of which
questions each member drew; ``gap%`` is served's share of the fastest-to-most-accurate gap and
``oracle%`` its gain over static fastest as a share of what the hindsight oracle
(compass.domain.oracle) wins on the same arrivals in the simulator. ``--strategy predictive``
runs the policy runs with the predictive strategy (meant for ``policy+adm``).

``binding`` is late binding (issue 43, ``binding: {mode: per-stage}`` with admission): each
request carries the SLO as its deadline and every router binds rag-sim's retriever, reranker and
generator parameters stage by stage from the table the operator would send (the front's
per-stage times, the planner's rate limits), refusing at the first stage what is late whatever
serves it; the simulator predicts it with compass.domain.simulator's binding rule on the same arrivals, on
what the routers see (rag-sim; qa-real's sim columns read nan). qa-real's stages, retrieval
(retriever, top_k, rerank: bm25, dense or both, then maybe the reranker) and reading (the
reader), take their per-stage times from the component times profiled through the router here
(its spec names each stage's models, ``binding.stages[].components``): the reader is bound when
the request reaches it. ``binding@take-up`` (rag-sim) serves the same arrivals right after
``binding`` (first where ``--runs`` names it first) with the same rule on the whole configuration
as one stage, bound when each request is taken up (``binding`` without stages): per-stage against
at-take-up binding, live.
After each rag-sim run a line says where its requests waited: the mean time in Triton's queue
of the router and of each component (Triton's statistics, paper ms), the router's being what a
router cannot see.

``--pipeline-slots G`` (rag-sim, with ``--router-instances N`` > G) gives the routers a gate
(model-images/router/model.py, ``compass_pipeline_slots``): the N instances take requests up as
they arrive and G of them run the pipeline at once, the others waiting at the gate in arrival
order, seen there with their deadlines by the request that binds; the pod serves G at once, as
a router of G instances does (the plan, the pod model and the oracle count G), so static
fastest's capacity is the same with and without it. The simulator predicts ``binding`` as a
router that sees every follower with its deadline (``followers_poll_s`` None) and the rate of
every arrival (``RateView.ARRIVALS``). With ``--client-free`` the admitting and binding runs'
requests carry no deadline: the gated routers give each its take-up plus the SLO, which the
simulator's own deadlines (arrival plus the SLO) equal while fewer than N requests are in the
router. The policy runs read the queue as the operator does:
Triton's pending count of the router plus the requests its instances hold at the gate (the
routers' gauge ``compass_router_gate_waiting``).

``--binding-lag S --binding-lag-reserve R`` (``binding``) gives the routers the lag cap
(ParetoPolicy ``binding.lagShare``/``lagReserve``): a request's extra time may leave it at most
S x (SLO - R x the fastest's likely time) behind the schedule static fastest keeps; with
``--degrade-after 1`` the table carries no wait rule (the simulator's best rule:
``bench/serving_sim.py --binding-gate 8 --degrade-after 1 --binding-lag 0.3
--binding-lag-reserve 2``). Its simulator column runs the same rule on the router's own view:
behind the gate, the N - G waiters seen with their deadlines, those beyond (in Triton's queue)
unseen, as the gated routers poll nothing, the rate of the arrivals the instances took up
(``RateView.GATE_ARRIVALS``); each bound request's turn in the pipeline is longer by the
router's binding work, timed on the table sent, first at idle, then again (in a child process)
while static fastest serves, and the binding run is predicted with the latter. rag-sim's
members are profiled at evenly spread latency quantiles once every router instance has served
a request (an instance's first runs cold).

``--workflow qa-real`` serves qa-real instead: real retrieval and MiniLM on this CPU, so no time
scale (1) and each request's accuracy is its real answer's score; by default one replica whose
router runs 4 instances (``--router-instances``), SLOs 500 and 1000 ms. Each front member's
capacity curve is measured at those instances first (the profiler's ladder), the plan's
thresholds come from the curves (``measured``), the simulator's pod shares its cores among the
busy instances as the curves say (``PodModel.contended``), and the default spike peaks at 1.2x
what the most accurate member drains. The oracle's column needs one instance per pod (its FIFO
is one server): ``-`` otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, closing
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from compass.api.binding import BindingMode, BindingSettings, BindingStage
from compass.api.paretopolicy import AdmissionSettings, Hysteresis, ParetoPolicySpec
from compass.commands.common import (
    add_admission_arguments,
    add_enum_argument,
    add_pattern_arguments,
    add_trace_window_arguments,
    admission_degrade_after,
    admission_quantile,
    pattern_from_args,
    trace_window_pattern,
)
from compass.console import UsageError
from compass.conversion import binding_rule, binding_table, runtime_policy, spec_for_plan
from compass.dataplane.fleet import Endpoint, FleetQueueDepth, RouterFleet
from compass.dataplane.profiler import (
    CurveSettings,
    ProfileSettings,
    measure_curve,
    profile_configurations,
    warm_up,
)
from compass.dataplane.triton import TritonRouter
from compass.domain.admission import (
    DEFAULT_DEGRADE_AFTER,
    Admission,
    AdmissionPoint,
    router_admission,
)
from compass.domain.arrivals import SPIKE_FACTOR, PatternKind, Scenario, make_pattern, make_scenario
from compass.domain.binding import (
    QA_REAL_COMPONENTS,
    QA_REAL_STAGE_PARAMS,
    RAG_SIM_COMPONENTS,
    RAG_SIM_SHARES,
    RAG_SIM_STAGE_PARAMS,
    measured_stage_times,
)
from compass.domain.evaluation import Config
from compass.domain.oracle import hindsight_oracle
from compass.domain.planner import Slo, ThresholdModel, plan_from_profiles
from compass.domain.podmodel import RAG_SIM_STAGES, PodModel
from compass.domain.profiles import parse_profiles
from compass.domain.simulator import RunReport, compare, simulate
from compass.domain.space import config_key
from compass.domain.strategy import Strategy
from compass_dev.experiment import (
    ADMITTED_RUN,
    BINDING_RUN,
    EVERY_RUN,
    RUNS,
    LiveRun,
    serve_each,
)
from compass_dev.local_triton import local_fleet
from compass_dev.scenarios import (
    ACCURATE,
    FASTEST,
    PAPER_FRONT,
    PAPER_PEAK_UTILIZATION,
    QA_REAL_FRONT,
    QA_REAL_QUESTIONS,
    QUESTIONS,
    RagSimLoad,
    profiling_payload,
    qa_real_triton,
    rag_sim_data,
    rag_sim_fleet,
)
from router_binding import time_bindings, time_bindings_until

IDLE_SWITCHES = 40
# binding's rule with the whole configuration one stage, bound at take-up (rag-sim).
TAKE_UP_RUN = "binding@take-up"
# The models whose queues a rag-sim request passes through, in order: where it waits is read
# from Triton's statistics (the router's queue is invisible to the router's own decisions).
RAG_SIM_MODELS = ("router", *RAG_SIM_COMPONENTS)
# qa-real's serving front: the fastest, the first MiniLM reader, the most accurate (its
# reranked member is as accurate as the last at three times its time).
QA_REAL_SERVING = (QA_REAL_FRONT[0], QA_REAL_FRONT[1], QA_REAL_FRONT[3])
# qa-real's default spike peaks at this many times the most accurate member's drain rate.
QA_REAL_PEAK_OVER_DRAIN = 1.2
CURVE_POINTS = 10


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    """p50, p95 and max of some durations, in ms."""
    if not seconds:
        return {"p50": float("nan"), "p95": float("nan"), "max": float("nan")}
    ms = np.asarray(seconds) * 1000
    return {
        "p50": round(float(np.percentile(ms, 50)), 2),
        "p95": round(float(np.percentile(ms, 95)), 2),
        "max": round(float(ms.max()), 2),
    }


def queue_totals(http_urls: list[str], models: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """Per model, summed over the servers: requests that left its queue and the ns they spent
    in it (Triton's cumulative statistics, /v2/models/<model>/stats)."""
    totals: dict[str, tuple[int, int]] = {}
    for model in models:
        count = ns = 0
        for url in http_urls:
            with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=10) as r:
                stats = json.load(r)["model_stats"][0]["inference_stats"]["queue"]
            count, ns = count + int(stats["count"]), ns + int(stats["ns"])
        totals[model] = (count, ns)
    return totals


def waits_ms(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], scale: float
) -> dict[str, float]:
    """Per model, the mean time a request spent in its queue between two readings, paper ms."""
    waits = {}
    for model, (count, ns) in after.items():
        served = count - before[model][0]
        waits[model] = (ns - before[model][1]) / 1e6 / scale / served if served else 0.0
    return waits


def qa_real_accuracy(router: TritonRouter, config: Config) -> float:
    """The configuration's accuracy: its answers' mean score over qa-real's questions."""
    scores = [
        float(router.infer({"sample": i}, config=config).result.get("score") or 0.0)
        for i in range(QA_REAL_QUESTIONS)
    ]
    return float(np.mean(scores))


def served_by_member(
    run: LiveRun, report: RunReport, members: list[Any], scale: float
) -> list[str]:
    """Per front member, live against the simulator: the requests it served, their median
    latency (paper ms) and how many of those were late: where a run parts from its
    prediction."""
    live_keys = run.served_keys
    live_ms = run.latencies_ms
    sim_ms = report.latencies_ms / scale
    parts = []
    for index, member in enumerate(members):
        mine = np.array([key == member.key for key in live_keys], dtype=bool)
        simulated = report.configs == index
        if not mine.any() and not simulated.any():
            continue
        figures = []
        for latencies in (live_ms[mine], sim_ms[simulated]):
            median = f"{np.median(latencies):.0f}" if len(latencies) else "-"
            late = int(np.sum(latencies > run.slo_ms))
            figures.append(f"{len(latencies)} (p50 {median} ms, {late} late)")
        parts.append(f"{member.accuracy:.4f} {figures[0]} vs {figures[1]}")
    return parts


def router_decision_s(table: dict[str, Any], waiting: int, requests: int = 300) -> float:
    """The router's own binding work a request, s, on this machine: its take-up and the
    binding of every rag-sim stage with ``waiting`` requests at its gate, every deadline drawn
    within the table's SLO (bench/router_binding.py's time_bindings); the mean wall time. What
    the simulator adds to each bound request's turn in the pipeline
    (BindingSettings.decision_s)."""
    took, _ = time_bindings(table, requests, 0, waiting, table["slo_ms"] / 1000)
    return float(took.sum(axis=1).mean()) / 1e6


def predict_bound(
    members: list[Any],
    scenario: Scenario,
    slo_ms: float,
    spec: Any,
    table: dict[str, Any],
    instances: int,
    slots: int | None,
    replicas: int,
    pod_model: PodModel,
    decision_s: float,
) -> RunReport:
    """The binding run in the simulator: the routers' rule on the table's own numbers and on
    their own view (behind the gate the waiters seen, the rest not), each bound request's turn
    ``decision_s`` longer (scaled time, as every argument)."""
    return simulate(
        binding_rule(spec, table, instances, slots, decision_s=decision_s),
        members,
        scenario,
        slo_ms,
        BINDING_RUN,
        pods=replicas,
        pod_model=pod_model,
    )


class DecisionsUnderLoad:
    """The router's binding work timed in a child process while a live run serves
    (router_binding.time_bindings_until): started (its imports done) before the run, timing
    from ``start()`` until ``stop()``."""

    def __init__(self, table: dict[str, Any], waiting: int) -> None:
        # Spawned, not forked: this process holds gRPC channels and their threads.
        context = multiprocessing.get_context("spawn")
        self.go, self.done = context.Event(), context.Event()
        self.replies, sink = context.Pipe(duplex=False)
        self.process = context.Process(
            target=time_bindings_until,
            args=(table, waiting, self.go, self.done, sink),
            daemon=True,
        )
        self.process.start()

    def start(self) -> None:
        """Start timing."""
        self.go.set()

    def stop(self) -> float:
        """Stop timing: the mean wall time a request's binding took, s (nan: none timed)."""
        self.go.set()
        self.done.set()
        times = self.replies.recv() if self.replies.poll(60) else []
        self.process.join(10)
        return float(np.mean(times)) if times else math.nan


def check_qa_real_component_times(plan: Any) -> None:
    """Stop unless every profile carries the component times qa-real's per-stage split needs:
    its table is split by what the router timed on this CPU, never by an assumed share."""
    profiles = [t.profile for t in plan.thresholds]
    if measured_stage_times(profiles, QA_REAL_COMPONENTS) is None:
        raise SystemExit(
            "qa-real binding: the profiles lack component times for every stage; profile "
            "through a router that times its components (compass_component_times)"
        )


def main() -> int:
    """Run the benchmark, print its tables and (with --json) write its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflow", choices=("rag-sim", "qa-real"), default="rag-sim")
    parser.add_argument(
        "--replicas", type=int, default=None, help="Triton servers (pods; rag-sim 2, qa-real 1)"
    )
    parser.add_argument(
        "--router-instances",
        type=int,
        default=None,
        help="requests each router serves at once (rag-sim 1, qa-real 4)",
    )
    parser.add_argument(
        "--pipeline-slots",
        type=int,
        default=None,
        help="rag-sim: the routers' gate (compass_pipeline_slots): of the requests the router "
        "instances take up, this many run the pipeline at once, in arrival order (e.g. 1 with "
        "--router-instances 8)",
    )
    parser.add_argument(
        "--binding-lag",
        type=float,
        default=None,
        metavar="SHARE",
        help=f"{BINDING_RUN}: the lag cap's share of the SLO (binding.lagShare, in (0, 1]; "
        "default none), e.g. 0.3 with --binding-lag-reserve 2 --degrade-after 1",
    )
    parser.add_argument(
        "--binding-lag-reserve",
        type=int,
        default=0,
        metavar="N",
        help="with --binding-lag: its share is of the SLO less this many of the fastest's "
        "likely times (binding.lagReserve)",
    )
    parser.add_argument(
        "--curve-requests", type=int, default=60, help="qa-real: requests per curve rate"
    )
    parser.add_argument("--time-scale", type=float, default=0.25, help="rag-sim only")
    parser.add_argument(
        "--slos", default=None, help="SLOs in ms (rag-sim 750,1000,1500; qa-real 500,1000)"
    )
    parser.add_argument("--profile-runs", type=int, default=40)
    parser.add_argument(
        "--runs",
        default=",".join(RUNS),
        help=f"which runs, comma-separated, of {', '.join((*EVERY_RUN, TAKE_UP_RUN))} (default: "
        f"all but {BINDING_RUN} and {TAKE_UP_RUN})",
    )
    add_admission_arguments(parser, "0.5", where=False)
    parser.add_argument(
        "--no-refuse",
        action="store_true",
        help="admission and late binding serve a request that is late whatever serves it on "
        "the fastest instead of refusing it (admission's refuse: false)",
    )
    parser.add_argument(
        "--client-free",
        action="store_true",
        help="with --pipeline-slots: the admitting and binding runs' requests carry no "
        "deadline; the gated routers give each its take-up plus the SLO",
    )
    parser.add_argument("--json", metavar="PATH", help="write the figures here as JSON")
    add_enum_argument(parser, "--strategy", Strategy.ELASTICO, "the policy run's strategy")
    add_pattern_arguments(parser)
    add_trace_window_arguments(parser)
    # Default: the paper's spike relative to this machine (its peak at the paper's utilisation
    # of the profiled fastest configuration), per replica, as the demo serves it.
    parser.set_defaults(base_qps=None)
    args = parser.parse_args()
    qa_real = args.workflow == "qa-real"
    args.replicas = args.replicas or (1 if qa_real else 2)
    instances = args.router_instances or (4 if qa_real else 1)
    args.slos = args.slos or ("500,1000" if qa_real else "750,1000,1500")
    if qa_real:
        args.time_scale = 1.0  # real computation: latencies are what they are
    auto_base = args.base_qps is None
    if auto_base:
        args.base_qps = "1"  # validated now, set once the fastest is profiled
    if args.replicas < 1 or instances < 1:
        parser.error("--replicas and --router-instances: give 1 or more")
    slots = args.pipeline_slots
    if slots is not None and (qa_real or not 1 <= slots < instances):
        parser.error(
            "--pipeline-slots: rag-sim only, 1 or more and fewer than --router-instances "
            "(e.g. --pipeline-slots 1 --router-instances 8)"
        )
    if args.client_free and slots is None:
        parser.error(
            "--client-free: only behind the routers' gate, where they know each request's "
            "arrival; add --pipeline-slots 1 --router-instances 8"
        )
    if args.binding_lag is not None and not 0 < args.binding_lag <= 1:
        parser.error("--binding-lag: give a share of the SLO in (0, 1], e.g. 0.3")
    if args.binding_lag_reserve < 0:
        parser.error("--binding-lag-reserve: give a count >= 0, e.g. 2")
    # Requests each pod serves at once: the gate's slots, else the router's instances.
    pod_servers = slots or instances
    try:
        quantile = admission_quantile(args, 0.5)
        degrade_after = admission_degrade_after(args, DEFAULT_DEGRADE_AFTER)
    except UsageError as error:
        parser.error(str(error))
    labels = args.runs.split(",")
    known = (*EVERY_RUN, TAKE_UP_RUN)
    unknown = set(labels) - set(known)
    if unknown:
        parser.error(
            f"--runs: {', '.join(sorted(unknown))} unknown; give some of {', '.join(known)}"
        )
    if qa_real and TAKE_UP_RUN in labels:
        parser.error(f"--runs {TAKE_UP_RUN}: rag-sim only")
    scale = args.time_scale
    slos = [float(s) for s in args.slos.split(",")]
    try:
        pattern, seed = pattern_from_args(args)  # validated at the paper's scale
        if args.trace_name is not None:
            # The window's flags checked before any server starts (stretched once profiled).
            trace_window_pattern(args, 100.0, args.replicas)
    except UsageError as error:
        parser.error(str(error))
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="compass-bench-"))
    with ExitStack() as stack:
        servers = stack.enter_context(
            local_fleet(workdir, args.replicas, partial(qa_real_triton, router_instances=instances))
            if qa_real
            else rag_sim_fleet(workdir, scale, args.replicas, instances, slots)
        )
        fleet = RouterFleet(
            [Endpoint(f"pod{k}", s.grpc_url, s.metrics_url) for k, s in enumerate(servers)]
        )
        stack.callback(fleet.close)
        # Profile the front through one replica's router, as `compass profile` does.
        profiler = TritonRouter(servers[0].grpc_url, timeout_s=120.0)
        stack.callback(profiler.close)
        questions = QA_REAL_QUESTIONS if qa_real else QUESTIONS

        def sample(index: int) -> dict[str, object]:
            return {"sample": index % questions}

        front = QA_REAL_SERVING if qa_real else PAPER_FRONT
        if qa_real:
            # Its dense retriever embeds the corpus on the first request; each member's
            # accuracy is its real answers' score over every question.
            profiler.infer({"sample": 0}, config=front[-1])
            configs = [(c, qa_real_accuracy(profiler, c)) for c in front]
        else:
            data = rag_sim_data()
            configs = [(c, float(np.mean(data["configs"][config_key(c)]["scores"]))) for c in front]
        profile_settings = ProfileSettings(warmup_runs=5, measured_runs=args.profile_runs)
        # Each router instance's first request runs cold: the profiler warms the pod it
        # measures on (pod_warmup_runs); the runs need the other replicas warm too.
        for server in servers[1:]:
            with closing(TritonRouter(server.grpc_url, timeout_s=120.0)) as router:
                warm_up(router, front[0], profile_settings.pod_warmup_runs, sample)
        document = profile_configurations(
            profiler,
            configs,
            profile_settings,
            # rag-sim serves the quantile it is sent: spread evenly, the simulator's profiles
            # are the distributions the runs draw from, not forty random draws of them.
            sample
            if qa_real
            else partial(
                profiling_payload,
                warmup_runs=profile_settings.warmup_runs,
                measured_runs=profile_settings.measured_runs,
            ),
        )
        if pod_servers > 1:
            # What each member drains at the deployed instances: the thresholds, the
            # simulator's pod and the predictive forecast read it.
            for config, entry in zip(front, document["profiles"], strict=True):
                curve = measure_curve(
                    profiler,
                    config,
                    entry["latency_mean_ms"],
                    instances,
                    sample,
                    # Enough rates to reach saturation: a curve that never saturated
                    # says nothing of the drain rate, and the pod would look uncontended.
                    CurveSettings(args.curve_requests, CURVE_POINTS, seconds_per_rate=5.0),
                    progress=lambda point: print(
                        f"    {point.offered_qps:7.2f}/s -> {point.throughput_qps:7.2f}/s, "
                        f"p95 {point.latency_at(95):7.1f} ms",
                        flush=True,
                    ),
                    idle_p95_ms=entry["latency_p95_ms"],
                )
                entry["capacity"] = curve.to_json()
                print(
                    f"  curve of {config_key(config)} at {instances} instances: drains "
                    f"{curve.saturation_qps:.2f}/s{'' if curve.saturated else ' (not saturated)'}",
                    flush=True,
                )
        profiles = parse_profiles(document)
        fast_config, accurate_config = (front[0], front[-1]) if qa_real else (FASTEST, ACCURATE)
        # The switch's cost, measured: decision -> every replica serving it, at idle.
        idle = [
            fleet.switch(accurate_config if i % 2 else fast_config).seconds
            for i in range(IDLE_SWITCHES)
        ]
        switch_delay_s = float(np.percentile(idle, 95))
        gate = "" if slots is None else f" behind a gate of {slots} pipeline slot(s)"
        if args.binding_lag is not None:
            gate += (
                f", {BINDING_RUN}'s lag cap {args.binding_lag:g} (reserve "
                f"{args.binding_lag_reserve}), degrade after {degrade_after:g}"
            )
        print(
            f"{args.workflow} on {args.replicas} Triton 2.51 replica(s) (CPU), router of "
            f"{instances} instance(s){gate}, time scale {scale:g}; profiled front (paper scale):"
        )
        for p in profiles:
            print(
                f"  accuracy {p.accuracy:.4f}  mean {p.mean_ms / scale:6.1f} ms  "
                f"p95 {p.p95_ms / scale:6.1f} ms  {p.name}"
            )
        idle_ms = percentiles_ms(idle)
        print(
            f"switch of every replica at idle ({IDLE_SWITCHES}x, real ms): p50 {idle_ms['p50']}, "
            f"p95 {idle_ms['p95']}, max {idle_ms['max']}"
        )
        if auto_base and qa_real:
            accurate = max(profiles, key=lambda p: p.accuracy)
            drain = accurate.capacity.saturation_qps if accurate.capacity else 0.0
            drain = drain or instances * 1000 / accurate.mean_ms
            pattern = replace(pattern, base_qps=QA_REAL_PEAK_OVER_DRAIN * drain / SPIKE_FACTOR)
        elif auto_base:
            fastest_s = min(p.mean_ms for p in profiles) / 1000 / scale
            pattern = replace(pattern, base_qps=PAPER_PEAK_UTILIZATION / (SPIKE_FACTOR * fastest_s))
        if args.trace_name is not None:
            # The window stretched to --utilisation of the fastest member at the paper's scale.
            fastest_ms = min(p.mean_ms for p in profiles) / scale
            pattern = trace_window_pattern(args, fastest_ms, args.replicas)
        if pattern.kind is PatternKind.TRACE:
            trace = [t * scale for t in pattern.trace_s]
            scaled = make_pattern(PatternKind.TRACE, 1.0, 1.0, trace_s=trace)
        else:
            # The base rate is per replica: the Service splits the arrivals among them.
            scaled = make_pattern(
                pattern.kind,
                pattern.base_qps * args.replicas / scale,
                pattern.duration_s * scale,
                seed=seed,
            )
        scenario = make_scenario(scaled, seed)
        replicas = scenario.pods_of(args.replicas).tolist()
        load = RagSimLoad(scenario)
        arrivals = load.arrivals_s()
        payload = sample if qa_real else load.payload
        if qa_real:
            pod_model = PodModel(servers=instances, contended=True)
        else:
            pod_model = PodModel(
                servers=pod_servers, stages=RAG_SIM_STAGES if pod_servers > 1 else ()
            )
        print(
            f"{pattern.kind.value}: base {pattern.base_qps:.2f} QPS per replica, "
            f"{pattern.duration_s:g} s, {scenario.requests} requests, seed {seed}\n"
        )
        header = (
            f"{'SLO':>5} {'run':<15} {'compl%':>7} {'sim%':>6} {'accuracy':>8} {'served':>7} "
            f"{'sim':>6} {'gap%':>5} {'oracle%':>7} {'p95 ms':>7} {'failed':>6} {'refused':>7} "
            f"{'switches':>8}"
        )
        print(header)
        runs: list[dict[str, Any]] = []
        under_load: list[float] = []
        # Where requests wait (rag-sim): Triton's queue statistics around each run.
        http_urls = [s.http_url for s in servers]
        watched = () if qa_real else RAG_SIM_MODELS
        for slo_ms in slos:
            plan = plan_from_profiles(
                profiles,
                Slo(slo_ms * scale, 95.0),
                50.0 * scale,
                ThresholdModel.MEASURED if pod_servers > 1 else ThresholdModel.TAIL,
                switch_delay_ms=1000 * switch_delay_s,
                servers=pod_servers,
            )
            spec = spec_for_plan(
                plan,
                Hysteresis(downscale_cooldown_seconds=5.0 * scale),
                interval_seconds=scale,
                strategy=Strategy(args.strategy),
                admission=AdmissionSettings(
                    enabled=True,
                    quantile=quantile,
                    degrade_after=degrade_after,
                    refuse=not args.no_refuse,
                ),
                # qa-real's stages are split by the component times profiled through the
                # router (its retrieval's models together), rag-sim's by its shares where
                # its profiles lack them.
                binding=BindingSettings(
                    mode=BindingMode.PER_STAGE,
                    stages=[
                        BindingStage(components=list(models), parameters=list(names))
                        for models, names in zip(
                            QA_REAL_COMPONENTS, QA_REAL_STAGE_PARAMS, strict=True
                        )
                    ],
                )
                if qa_real
                else BindingSettings(
                    mode=BindingMode.PER_STAGE,
                    stages=[
                        BindingStage(component=model, parameters=list(names), share=share)
                        for model, names, share in zip(
                            RAG_SIM_COMPONENTS, RAG_SIM_STAGE_PARAMS, RAG_SIM_SHARES, strict=True
                        )
                    ],
                    lag_share=args.binding_lag,
                    lag_reserve=args.binding_lag_reserve,
                ),
            )
            take_up_spec: ParetoPolicySpec | None = None
            take_up: dict[str, Any] | None = None
            if not qa_real:
                bound = binding_table(spec, plan)
                if TAKE_UP_RUN in labels:
                    # The same rule, the whole configuration one stage (no stages declared).
                    take_up_spec = spec.model_copy(
                        update={
                            "binding": spec.binding.model_copy(
                                update={"mode": BindingMode.PER_REQUEST, "stages": []}
                            )
                        }
                    )
                    take_up = binding_table(take_up_spec, plan)
            elif BINDING_RUN in labels:
                check_qa_real_component_times(plan)
                bound = binding_table(spec, plan)
                print(
                    "qa-real's binding table, per-stage ms (retrieval, reading) at quantile "
                    f"{spec.binding.quantile:g}: "
                    + "; ".join(
                        f"{c['config']} {', '.join(f'{t:.1f}' for t in c['stage_ms'])}"
                        for c in bound["configs"]
                    ),
                    flush=True,
                )
            else:
                bound = None
            members = [t.profile for t in plan.thresholds]
            admission = Admission(
                slo_ms * scale,
                quantile,
                at=AdmissionPoint.DISPATCH,
                degrade_after=degrade_after,
                refuse=not args.no_refuse,
            )
            predict = partial(
                compare,
                front=members,
                scenario=scenario,
                slo_ms=slo_ms * scale,
                interval_s=scale,
                pods=args.replicas,
                switch_delay_s=switch_delay_s,
                pod_model=pod_model,
            )
            predicted = {
                **predict({"policy": runtime_policy(spec)}),
                **predict({ADMITTED_RUN: runtime_policy(spec)}, admission=admission),
            }
            loaded: DecisionsUnderLoad | None = None
            if bound is not None and not qa_real and {BINDING_RUN, TAKE_UP_RUN} & set(labels):
                # The routers' rule in the simulator, on the table's own numbers and on the
                # routers' own view (with the lag cap behind the gate: the N - G waiters
                # seen, the rest not, the rate of the arrivals taken up), as serving_sim
                # runs it.
                # The routers' own work in each turn, measured here, behind a gate (it is
                # real time: 5x the paper's at x0.2).
                decision_s = router_decision_s(bound, instances - slots) if slots else 0.0
                if decision_s:
                    print(
                        f"the router's binding work: {decision_s * 1000:.2f} ms a request "
                        f"(real; {decision_s * 1000 / scale:.1f} ms at the paper's scale), "
                        "added to each bound request's turn in the simulator",
                        flush=True,
                    )
                predict_binding = partial(
                    predict_bound,
                    members,
                    scenario,
                    slo_ms * scale,
                    spec,
                    bound,
                    instances,
                    slots,
                    args.replicas,
                    pod_model,
                )
                predicted[BINDING_RUN] = predict_binding(decision_s)
                if take_up is not None:
                    predicted[TAKE_UP_RUN] = predict_bound(
                        members,
                        scenario,
                        slo_ms * scale,
                        take_up_spec,
                        take_up,
                        instances,
                        slots,
                        args.replicas,
                        pod_model,
                        decision_s,
                    )
                if decision_s and "fastest" in labels:
                    # Timed again under static fastest's load: the prediction then counts
                    # the binding work as the pods' contention stretches it.
                    loaded = DecisionsUnderLoad(bound, instances - slots)
            # What hindsight could win on these arrivals (the simulator's oracle): each run's
            # accuracy gain over static fastest as a share of the oracle's.
            oracle = (
                hindsight_oracle(members, scenario, slo_ms * scale, pods=args.replicas)
                if pod_servers == 1
                else None
            )
            # The policy's choices are judged on what served each request (the members'
            # profiled accuracies, as the simulator and the oracle count): the answers' own
            # scores add the luck of which questions each member drew, about +-0.01 on a
            # thousand requests, as large as the gains measured.
            fastest_accuracy = members[0].accuracy
            gap = max(m.accuracy for m in members) - fastest_accuracy
            queued = queue_totals(http_urls, watched)
            if loaded is not None:
                loaded.start()
            serving = partial(
                serve_each,
                fleet,
                plan,
                runtime_policy(spec),
                FleetQueueDepth(lambda: fleet.endpoints),
                arrivals,
                payload,
                slo_ms,
                interval_s=scale,
                time_scale=scale,
                replicas=replicas,
                admission=router_admission(members, admission),
                client_deadlines=not args.client_free,
            )

            def live_runs(
                serving: Any = serving,
                bound: dict[str, Any] | None = bound,
                take_up: dict[str, Any] | None = take_up,
            ) -> Iterator[tuple[str, LiveRun]]:
                """The runs asked for, same arrivals; binding@take-up right after the others,
                or first where --runs names it before binding (to pair the two both ways on
                a machine whose load drifts)."""

                def at_take_up() -> Iterator[tuple[str, LiveRun]]:
                    if take_up is not None:
                        for _, run in serving(labels={BINDING_RUN}, binding=take_up):
                            yield TAKE_UP_RUN, run

                first = (
                    take_up is not None
                    and BINDING_RUN in labels
                    and labels.index(TAKE_UP_RUN) < labels.index(BINDING_RUN)
                )
                if first:
                    yield from at_take_up()
                yield from serving(labels=set(labels) - {TAKE_UP_RUN}, binding=bound)
                if not first:
                    yield from at_take_up()

            for label, run in live_runs():
                under_load += [e.switch_s for e in run.switch_events]
                if label == "fastest" and loaded is not None:
                    loaded_s = loaded.stop()
                    loaded = None
                    if math.isfinite(loaded_s):
                        idle = predicted[BINDING_RUN].compliance
                        predicted[BINDING_RUN] = predict_binding(loaded_s)
                        print(
                            f"the router's binding work under static fastest's load: "
                            f"{loaded_s * 1000:.2f} ms a request (real); the binding run "
                            f"predicted with it: {predicted[BINDING_RUN].compliance:.1f}% "
                            f"(with the idle timing {idle:.1f}%)",
                            flush=True,
                        )
                report = predicted.get(label)
                sim = report.compliance if report else float("nan")
                sim_accuracy = report.mean_accuracy if report else math.nan
                served = run.served_accuracy(members)
                gain = oracle.mean_accuracy - fastest_accuracy if oracle else math.nan
                # An oracle that gains nothing (to float noise) has no share to give.
                share = 100 * (served - fastest_accuracy) / gain if gain > 1e-6 else math.nan
                of_gap = 100 * (served - fastest_accuracy) / gap if gap > 0 else math.nan
                print(
                    f"{slo_ms:5.0f} {label:<15} {run.compliance:7.1f} {sim:6.1f} "
                    f"{run.accuracy:8.4f} {served:7.4f} {sim_accuracy:6.4f} {of_gap:5.0f} "
                    f"{'-' if math.isnan(share) else f'{share:.0f}':>7} "
                    f"{run.percentile_ms(95):7.0f} "
                    f"{run.failed:6d} {run.refused:7d} {run.switches:8d}",
                    flush=True,
                )
                if report is not None and run.refused + int(report.dropped.sum()):
                    print(f"      the simulator refused {int(report.dropped.sum())}", flush=True)
                if report is not None:
                    print(
                        "      served, live vs simulated: "
                        + "; ".join(served_by_member(run, report, members, scale)),
                        flush=True,
                    )
                now_queued = queue_totals(http_urls, watched)
                waited = waits_ms(queued, now_queued, scale)
                queued = now_queued
                if waited:
                    print(
                        "      mean wait in Triton's queue of "
                        + ", ".join(f"{m} {w:.1f} ms" for m, w in waited.items()),
                        flush=True,
                    )
                runs.append(
                    {
                        "slo_ms": slo_ms,
                        "run": label,
                        "compliance_pct": round(run.compliance, 2),
                        "sim_compliance_pct": round(sim, 2),
                        "accuracy": round(run.accuracy, 4),
                        "served_accuracy": round(served, 4),
                        "sim_accuracy": round(sim_accuracy, 4),
                        "gap_share_pct": round(of_gap, 1),
                        "oracle_accuracy": round(oracle.mean_accuracy, 4) if oracle else None,
                        "oracle_share_pct": None if math.isnan(share) else round(share, 1),
                        "failed": run.failed,
                        "refused": run.refused,
                        "switches": run.switches,
                        "queue_wait_ms": {m: round(w, 2) for m, w in waited.items()},
                    }
                )
    loaded_ms = percentiles_ms(under_load)
    print(
        "accuracy: the answers' mean score; served: the mean profiled accuracy of what served "
        "each request (what the simulator counts: sim); gap%: served's share of the "
        "fastest-to-most-accurate gap; oracle%: served's gain over static fastest as a share of "
        "the hindsight oracle's (compass.domain.oracle, simulated on the same arrivals)"
    )
    print(
        f"\nswitches under load: {len(under_load)}; every replica switched (real ms): "
        f"p50 {loaded_ms['p50']}, p95 {loaded_ms['p95']}, max {loaded_ms['max']}"
    )
    print(f"wall time {time.monotonic() - started:.0f} s")
    if args.json:
        document = {
            "workflow": args.workflow,
            "replicas": args.replicas,
            "router_instances": instances,
            "pipeline_slots": slots,
            "client_free": args.client_free,
            "binding_lag": args.binding_lag,
            "binding_lag_reserve": args.binding_lag_reserve,
            "degrade_after": degrade_after,
            "pattern": pattern.kind.value,
            "time_scale": scale,
            "runs": runs,
            "switch_ms": idle_ms,
            "switch_under_load_ms": loaded_ms,
        }
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
