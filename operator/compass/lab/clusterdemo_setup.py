"""`compass demo --cluster`'s settings and what it applies: examples/rag-sim-workflow.yaml adapted
only as far as this machine needs (each change printed), with late binding behind the router's
gate where asked, and the replay ledger the search reads (compass.lab.clusterdemo runs it)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compass.domain.binding import RAG_SIM_COMPONENTS, RAG_SIM_SHARES, RAG_SIM_STAGE_PARAMS
from compass.lab.demo import RUN_TITLES
from compass.lab.devcluster import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "rag-sim-workflow.yaml"
TITLES = {**RUN_TITLES, "policy": "Elastico (operator)"}
BINDING_TITLES = {**RUN_TITLES, "policy": "late binding (operator)"}
# --late-binding: the routers' gate and lag cap as bench/serving_triton.py measured them best
# (--pipeline-slots 1 --router-instances 8 --binding-lag 0.3 --binding-lag-reserve 2
# --degrade-after 1; docs/method.md, "Behind the router's gate").
BINDING_ROUTER_INSTANCES = 8
BINDING_PIPELINE_SLOTS = 1
BINDING_LAG_SHARE = 0.3
BINDING_LAG_RESERVE = 2
PROMETHEUS_SCRAPE_S = 0.5  # scaled: Prometheus' scrape interval when the queue is read through it


@dataclass(frozen=True)
class ClusterDemoSettings:
    """The adaptations' knobs and the load; times unscaled unless named scaled."""

    output_dir: Path
    # At 0.1 the operator's 0.1 s ticks and Triton's per-request overhead on two shared cores
    # put the live run 2 points under the simulator's; at 0.25 it is within 0.2 of it.
    time_scale: float = 0.25
    slo_ms: float = 1000.0
    base_qps: float | None = None  # None: beyond the most accurate's capacity, within the fastest's
    duration_s: float = 180.0
    load_seed: int = 0
    warmup_runs: int = 1
    measured_runs: int = 20
    downscale_cooldown_s: float = 20.0
    slack_buffer_ms: float = 50.0
    queue_from: str = "triton"
    # Late binding (issue 43) instead of Elastico's whole-workflow switching: the workflow's
    # serving.binding per stage with the lag cap, admission without the wait rule, and the
    # local router gated (BINDING_ROUTER_INSTANCES instances, BINDING_PIPELINE_SLOTS slot).
    late_binding: bool = False
    binding_lag_share: float = BINDING_LAG_SHARE
    binding_lag_reserve: int = BINDING_LAG_RESERVE

    @property
    def titles(self) -> dict[str, str]:
        """Each run's title: the operator's policy named by what decides."""
        return BINDING_TITLES if self.late_binding else TITLES


# ---------------------------------------------------------------------------- pure helpers


def adaptations(
    example: dict[str, Any], settings: ClusterDemoSettings, ledger: str, metrics: dict[str, str]
) -> tuple[dict[str, Any], list[str]]:
    """The shipped example with what this machine needs, and one line per change saying why."""
    manifest = copy.deepcopy(example)
    spec = manifest["spec"]
    scale = settings.time_scale
    notes = []
    if spec["evaluation"]["evaluator"] != {"type": "triton"}:
        raise ValueError(f"{EXAMPLE} changed its evaluator: revisit compass.lab.clusterdemo")
    spec["evaluation"]["evaluator"] = {"type": "replay", "replayConfigMap": ledger}
    notes.append(
        f"search evaluator triton -> replay of rag-sim's own per-question scores (ConfigMap "
        f"{ledger}): the same verdicts; through Triton its ~13,700 sequential requests take "
        "~7 minutes here"
    )
    spec["slo"]["latencyMs"] = settings.slo_ms * scale
    notes.append(
        f"slo.latencyMs {settings.slo_ms:g} -> {settings.slo_ms * scale:g}: rag-sim "
        f"serves its latencies x{scale:g}"
    )
    spec["profiling"].update(warmupRuns=settings.warmup_runs, measuredRuns=settings.measured_runs)
    notes.append(
        f"profiling {settings.warmup_runs} + {settings.measured_runs} requests a configuration "
        "(shipped 3 + 50: ~2 minutes for the 33 feasible ones on two cores)"
    )
    if "metrics" in spec["serving"]:
        raise ValueError(f"{EXAMPLE} names serving.metrics: revisit compass.lab.clusterdemo")
    spec["serving"]["metrics"] = dict(metrics)
    if metrics["type"] == "triton":
        notes.append(
            f"serving.metrics -> Triton's /metrics at {metrics['url']}: the example reads every "
            "pod's at each tick on the Service's metrics port; this machine's one Triton has "
            "its own port"
        )
    else:
        notes.append(
            f"serving.metrics -> Prometheus at {metrics['url']}, scraping Triton every "
            f"{PROMETHEUS_SCRAPE_S:g} s (--queue-from prometheus: the policy acts on the last "
            "scrape)"
        )
    spec["serving"]["intervalSeconds"] = scale
    notes.append(
        f"serving.intervalSeconds 1 -> {scale:g}: a decision every second of the paper's time "
        "(the operator's timer ticks as often)"
    )
    spec["serving"]["hysteresis"] = {
        "downscaleCooldownSeconds": settings.downscale_cooldown_s * scale,
        "cooldownExponent": 0,
        "slackBufferMs": settings.slack_buffer_ms * scale,
    }
    notes.append(
        f"serving.hysteresis: cooldown {settings.downscale_cooldown_s * scale:g} s with exponent "
        f"0, slack buffer {settings.slack_buffer_ms * scale:g} ms (the defaults are for unscaled "
        "time)"
    )
    if settings.late_binding:
        notes += late_binding_adaptations(spec, settings)
    return manifest, notes


def late_binding_serving(lag_share: float, lag_reserve: int) -> dict[str, Any]:
    """The serving settings --late-binding gives the workflow (camelCase): rag-sim's three
    stages bound per request with this lag cap, admission without the wait rule."""
    return {
        "binding": {
            "mode": "per-stage",
            "stages": [
                {"component": component, "parameters": list(names), "share": share}
                for component, names, share in zip(
                    RAG_SIM_COMPONENTS, RAG_SIM_STAGE_PARAMS, RAG_SIM_SHARES, strict=True
                )
            ],
            "lagShare": lag_share,
            "lagReserve": lag_reserve,
        },
        "admission": {"enabled": True, "degradeAfter": 1},
    }


def late_binding_adaptations(spec: dict[str, Any], settings: ClusterDemoSettings) -> list[str]:
    """--late-binding: the workflow's serving.binding and admission (changed in ``spec``), and
    the local router's gate; one line each saying why."""
    serving = spec["serving"]
    for key in ("binding", "admission", "routerInstances"):
        if key in serving:
            raise ValueError(f"{EXAMPLE} names serving.{key}: revisit compass.lab.clusterdemo")
    space = {p["name"] for p in spec["space"]["parameters"]}
    bound = {name for names in RAG_SIM_STAGE_PARAMS for name in names}
    if bound != space:
        raise ValueError(
            f"{EXAMPLE}'s parameters {sorted(space)} are not rag-sim's stages' {sorted(bound)}: "
            "revisit compass.lab.clusterdemo"
        )
    serving.update(late_binding_serving(settings.binding_lag_share, settings.binding_lag_reserve))
    described = "; ".join(
        f"{component}: {', '.join(names)}"
        for component, names in zip(RAG_SIM_COMPONENTS, RAG_SIM_STAGE_PARAMS, strict=True)
    )
    return [
        f"serving.binding per-stage ({described}), lagShare {settings.binding_lag_share:g}, "
        f"lagReserve {settings.binding_lag_reserve}: the routers bind each request stage by "
        "stage from the table the operator sends with every switch, a request's extra time "
        f"leaving it at most {settings.binding_lag_share:g} x (SLO - "
        f"{settings.binding_lag_reserve} fastest services) behind static fastest's schedule (the "
        "stages' shares only where the profiles lack component times)",
        "serving.admission enabled, degradeAfter 1: what is late whatever serves it is refused "
        "at the first stage; no wait rule (the lag cap replaces it)",
        f"the local router: {BINDING_ROUTER_INSTANCES} instances, compass_pipeline_slots "
        f'"{BINDING_PIPELINE_SLOTS}" (the gate): requests are taken up as they arrive and wait '
        "at the gate, seen there with their deadlines; a request without one (the load sends "
        "none) gets its take-up + the SLO; the pod still serves one at a time",
    ]


def replay_ledger(rag_sim: dict[str, Any]) -> str:
    """rag-sim's recorded per-question scores as a replay ledger, rounded as Triton returns them
    (the generator's SCORE output is float32)."""
    lines = [
        {"config": json.loads(key), "scores": [float(np.float32(s)) for s in entry["scores"]]}
        for key, entry in rag_sim["configs"].items()
    ]
    return "".join(json.dumps(line) + "\n" for line in lines)
