"""rag-sim as the local demo and the tests serve it: its models, its configurations, the seeded
spike, its requests.

`compass demo`, `compass demo --cluster`, bench/serving_triton.py and the triton, k8s and e2e test
tiers all serve rag-sim (model-images/rag-sim: the paper's RAG workflow, replayed); what they
share about it lives here, once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from compass.api.meta import DEFAULT_ROUTER_MODEL
from compass.domain.arrivals import SPIKE_FACTOR, Scenario, make_pattern, make_scenario
from compass.domain.capacity import CapacityCurve, CurvePoint
from compass.domain.evaluation import Config
from compass.domain.planner import Plan
from compass.domain.profiles import LatencyProfile
from compass.domain.space import config_key
from compass.examples import RAG_PAPER_SAMPLES
from compass_dev.local_triton import LocalTriton, assemble_repository, local_fleet, model_images
from compass_rules.protocol import PIPELINE_SLOTS_PARAMETER

WORKFLOW = "rag-sim"
COMPONENTS = ("retriever", "reranker", "generator")
# rag-sim replays the embedded example's per-question scores: request i asks question i mod this.
QUESTIONS = RAG_PAPER_SAMPLES
# A 16-configuration corner of the paper's RAG grid (accuracies 0.61-0.86): a search small enough
# for the k8s tier's workflow tests and the operator latency bench, large enough to have a front.
RAG_CORNER_SPACE: dict[str, Any] = {
    "parameters": [
        {
            "name": "generator_model",
            "type": "categorical",
            "values": ["gemma3:12b", "llama3.1:8b", "llama3.2:3b", "llama3.2:1b"],
        },
        {"name": "retriever_k", "type": "integer", "values": [10, 20]},
        {"name": "reranker_k", "type": "integer", "values": [1, 3]},
        {"name": "reranker_model", "type": "categorical", "values": ["ms-marco"]},
    ],
    "constraints": ["reranker_k <= retriever_k"],
}

# The paper's Pareto front (planner_pareto_frontier.json) plus the one faster configuration our
# planner keeps on it, fastest first: what `compass plan` finds on the paper's profiles.
PAPER_FRONT: tuple[Config, ...] = tuple(
    {"generator_model": model, "retriever_k": k, "reranker_k": rerank, "reranker_model": "ms-marco"}
    for model, k, rerank in (
        ("llama3.2:3b", 10, 1),
        ("llama3.2:3b", 20, 1),
        ("llama3.1:8b", 20, 3),
        ("gemma3:12b", 20, 1),
    )
)
# The pair the tests and the operator benchmarks switch between: through the router at a tenth
# of rag-sim's latency ~20 ms and ~33 ms a request, far enough apart for a load to overload one
# long before the other.
FASTEST: Config = PAPER_FRONT[1]
ACCURATE: Config = PAPER_FRONT[3]
# The time scale the triton, k8s and e2e tiers and the operator benchmarks serve rag-sim at: its
# measured latencies (130-330 ms) a tenth as long, the same queueing shape 10x faster, so a test
# sees queues build and drain in seconds. Through the router FASTEST then takes ~20 ms a request
# (capacity ~50/s) and ACCURATE ~33 ms (~30/s), ~7 ms of each being Triton's gRPC and BLS
# overhead: scaled down further, the overhead would be most of a request and blur the two.
TEST_TIME_SCALE = 0.1

# The paper's spike (1.5 QPS, x4) peaks at 77% of its fastest configuration's capacity (mean
# 128.6 ms). On a CPU-only machine Triton's own overhead lengthens every service time, so the
# spike keeps that peak utilisation rather than the absolute rate.
PAPER_PEAK_UTILIZATION = SPIKE_FACTOR * 1.5 * 0.1286
# `compass demo`'s peak, off the paper's knife edge: at 77% a 3% change in the fastest's service
# time moves its compliance by up to 3.3 points (bench/demo_live_gap.py --sensitivity), and two
# live runs of the same arrivals differed by 6; at 65% the simulator and the demo's live runs
# agree within a point, and the most accurate configuration is still far past its capacity.
DEMO_PEAK_UTILIZATION = 0.65


# qa-real's configurations measured live, fastest to most accurate (its README): no neural
# network; a MiniLM reader; the reranker (batching) before it; hybrid retrieval.
QA_REAL_FRONT: tuple[Config, ...] = (
    {"reader": "lexical", "rerank": "none", "retriever": "bm25", "top_k": 1},
    {"reader": "minilm", "rerank": "none", "retriever": "bm25", "top_k": 1},
    {"reader": "minilm", "rerank": "minilm", "retriever": "bm25", "top_k": 1},
    {"reader": "minilm", "rerank": "none", "retriever": "hybrid", "top_k": 3},
)
QA_REAL_QUESTIONS = 149


def rag_sim_data() -> dict[str, Any]:
    """The data file rag-sim's components serve: per configuration, latency quantiles and scores."""
    path = model_images() / WORKFLOW / "models" / "rag_sim.json"
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def rag_sim_triton(
    workdir: Path,
    time_scale: float,
    active: Config | None = None,
    host: str = "127.0.0.1",
    router_instances: int = 1,
    pipeline_slots: int | None = None,
) -> LocalTriton:
    """rag-sim's tritonserver on ``host``, not started: latencies x ``time_scale``, the router
    on ``active`` with ``router_instances`` instances (requests served at once; with
    ``pipeline_slots``, requests taken up at once, of which that many run the pipeline at once,
    the rest waiting at the router's gate)."""
    # The repository goes to workdir/models; time_scale 0 serves no latency at all, and active
    # None leaves the router on its config's default.
    parameters: dict[str, dict[str, str]] = {
        c: {"time_scale": repr(float(time_scale))} for c in COMPONENTS
    }
    router: dict[str, str] = {}
    if active is not None:
        router["compass_active_config"] = config_key(active)
    if pipeline_slots is not None:
        router[PIPELINE_SLOTS_PARAMETER] = str(pipeline_slots)
    if router:
        parameters[DEFAULT_ROUTER_MODEL] = router
    repository = assemble_repository(
        WORKFLOW, workdir / "models", parameters, {DEFAULT_ROUTER_MODEL: router_instances}
    )
    return LocalTriton(repository=repository, host=host)


# rag-sim's streaming variant (model-images/rag-sim/streaming): its router and the decoupled
# generator it streams from, served beside rag-sim's retriever and reranker.
STREAM_ROUTER_MODEL = "router_stream"
STREAM_GENERATOR = "generator_stream"
STREAM_MODELS = (
    "retriever",
    "reranker",
    STREAM_GENERATOR,
    STREAM_ROUTER_MODEL,
    f"{STREAM_ROUTER_MODEL}_control",
)


def rag_sim_stream_triton(
    workdir: Path,
    time_scale: float,
    active: Config | None = None,
    host: str = "127.0.0.1",
    pipeline_slots: int | None = None,
    instances: Mapping[str, int] | None = None,
) -> LocalTriton:
    """rag-sim's streaming variant on ``host``, not started: its decoupled generator streams
    tokens through STREAM_ROUTER_MODEL (on ``active``; behind a gate of ``pipeline_slots``),
    latencies x ``time_scale``, ``instances`` as assemble_repository's."""
    scale = {"time_scale": repr(float(time_scale))}
    parameters: dict[str, dict[str, str]] = {
        model: dict(scale) for model in ("retriever", "reranker", STREAM_GENERATOR)
    }
    router = parameters[STREAM_ROUTER_MODEL] = {}
    if active is not None:
        router["compass_active_config"] = config_key(active)
    if pipeline_slots is not None:
        router[PIPELINE_SLOTS_PARAMETER] = str(pipeline_slots)
    repository = assemble_repository(WORKFLOW, workdir / "models", parameters)
    assemble_repository(f"{WORKFLOW}/streaming", repository, parameters, instances)
    return LocalTriton(repository=repository, models=STREAM_MODELS, host=host)


def rag_sim_fleet(
    workdir: Path,
    time_scale: float,
    replicas: int,
    router_instances: int = 1,
    pipeline_slots: int | None = None,
) -> AbstractContextManager[list[LocalTriton]]:
    """``replicas`` rag-sim tritonservers, started on loopback addresses of their own
    (local_fleet), latencies x ``time_scale``, each router with ``router_instances`` instances
    (and ``pipeline_slots``, as rag_sim_triton): the fleet a search Job spreads its requests
    over; stopped on leaving."""

    def server(where: Path, host: str) -> LocalTriton:
        return rag_sim_triton(
            where,
            time_scale,
            host=host,
            router_instances=router_instances,
            pipeline_slots=pipeline_slots,
        )

    return local_fleet(workdir, replicas, server)


def qa_real_triton(
    workdir: Path, host: str = "127.0.0.1", router_instances: int = 1
) -> LocalTriton:
    """qa-real's tritonserver on ``host``, not started: real retrieval and MiniLM on this CPU,
    the router with ``router_instances`` instances."""
    repository = assemble_repository(
        "qa-real", workdir / "models", instances={DEFAULT_ROUTER_MODEL: router_instances}
    )
    return LocalTriton(repository=repository, host=host)


def fastest_mean_s(plan: Plan) -> float:
    """The mean service time of the plan's fastest member that meets the SLO, in seconds."""
    return plan.thresholds[plan.eligible[0]].profile.mean_ms / 1000


def spike_scenario(
    plan: Plan,
    duration_s: float,
    seed: int,
    base_qps: float | None = None,
    peak: float = PAPER_PEAK_UTILIZATION,
) -> Scenario:
    """The seeded spike, unscaled; without ``base_qps`` peaking at ``peak`` of the fastest's
    capacity (by default the paper's utilisation)."""
    # Relative to the plan's fastest eligible member as profiled here, not the paper's 1.5 QPS.
    base = base_qps or peak / (SPIKE_FACTOR * fastest_mean_s(plan))
    return make_scenario(make_pattern("spike", base, duration_s, seed=seed), seed)


def profiling_payload(index: int, warmup_runs: int, measured_runs: int) -> dict[str, object]:
    """Profiling request ``index`` (``profile_configurations``' count: the warm-up runs, then
    the measured ones): its question, and a latency quantile spread evenly over the measured
    runs, (k + 0.5) / n for the k-th (the median while warming up). Forty runs then measure a
    configuration's whole distribution instead of forty random draws of it, whose luck alone
    moves the simulator's prediction of static fastest by about a point on a trace window
    (bench/README.md, serving_triton.py)."""
    measured = index - warmup_runs
    quantile = (measured % measured_runs + 0.5) / measured_runs if measured >= 0 else 0.5
    return {"sample": index % QUESTIONS, "quantile": quantile}


@dataclass(frozen=True)
class RagSimLoad:
    """A scenario as rag-sim requests: the same arrivals, questions and luck in every run."""

    scenario: Scenario

    def arrivals_s(self, time_scale: float = 1.0) -> list[float]:
        """When each request is sent, scaled."""
        return [float(t) * time_scale for t in self.scenario.arrivals_s]

    def payload(self, index: int) -> dict[str, object]:
        """Request ``index``: its question, and the latency quantile its components serve."""
        return {"sample": index % QUESTIONS, "quantile": float(self.scenario.luck[index])}

    def offered_qps(self, t: float) -> float:
        """The load's rate at unscaled time ``t``."""
        return float(self.scenario.pattern.rate(np.array([t]))[0])


def scaled_curve(curve: CapacityCurve, factor: float) -> CapacityCurve:
    """The same curve with times multiplied by ``factor`` and so rates divided by it."""
    return CapacityCurve(
        curve.servers,
        tuple(
            CurvePoint(
                point.offered_qps / factor,
                point.throughput_qps / factor,
                point.mean_ms * factor,
                tuple((p, v * factor) for p, v in point.percentiles_ms),
                point.growing,
            )
            for point in curve.points
        ),
        None if curve.slo_ms is None else curve.slo_ms * factor,
    )


def normal_profile(name: str, accuracy: float, mean: float, spread: float) -> LatencyProfile:
    """A normal-ish profile of configuration {"c": name}: p95 and p99 at 1.645 and 2.326 spreads
    above the mean (the tests' and benches' synthetic fronts)."""
    return LatencyProfile(
        {"c": name},
        accuracy,
        mean,
        mean + 1.645 * spread,
        p50_ms=mean,
        p99_ms=mean + 2.326 * spread,
        std_ms=spread,
    )


def scaled_profile(profile: LatencyProfile, factor: float) -> LatencyProfile:
    """The same profile with every time multiplied by ``factor`` (a time-scaled replay)."""

    def times(value: float | None) -> float | None:
        return None if value is None else value * factor

    return replace(
        profile,
        mean_ms=profile.mean_ms * factor,
        p95_ms=profile.p95_ms * factor,
        p50_ms=times(profile.p50_ms),
        p99_ms=times(profile.p99_ms),
        std_ms=times(profile.std_ms),
        capacity=None if profile.capacity is None else scaled_curve(profile.capacity, factor),
        component_ms=None
        if profile.component_ms is None
        else {model: ms * factor for model, ms in profile.component_ms.items()},
        ttft_mean_ms=times(profile.ttft_mean_ms),
        ttft_p50_ms=times(profile.ttft_p50_ms),
        ttft_p95_ms=times(profile.ttft_p95_ms),
    )
