"""`compass demo --cluster`'s settings and what it applies: examples/rag-sim-workflow.yaml adapted
only as far as this machine needs (each change printed), served as the example says (late
binding behind the router's gate) or, with --whole-workflow, by whole-workflow switching alone,
and the replay ledger the search reads (compass_dev.clusterdemo runs it)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from compass.api.binding import BindingMode
from compass.api.paretopolicy import ServingSettings
from compass_dev.devcluster import REPO_ROOT
from compass_dev.localdemo import RUN_TITLES

EXAMPLE = REPO_ROOT / "examples" / "rag-sim-workflow.yaml"
TITLES = {**RUN_TITLES, "policy": "Elastico (operator)"}
BINDING_TITLES = {**RUN_TITLES, "policy": "late binding (operator)"}
# Late binding's router, as examples/rag-sim-triton.yaml runs it (model-images/rag-sim/models/
# router/configs/gated.pbtxt): 8 instances behind a gate of 1 pipeline slot.
BINDING_ROUTER_INSTANCES = 8
BINDING_PIPELINE_SLOTS = 1
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
    # Late binding as the example serves it (its serving.binding and admission, the local
    # router gated: BINDING_ROUTER_INSTANCES instances, BINDING_PIPELINE_SLOTS slot); False
    # (--whole-workflow): both removed, Elastico's whole-workflow switching alone, ungated.
    late_binding: bool = True
    # The example's lag cap, replaced (None: as the example sets it).
    binding_lag_share: float | None = None
    binding_lag_reserve: int | None = None

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
        raise ValueError(f"{EXAMPLE} changed its evaluator: revisit compass_dev.clusterdemo")
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
        raise ValueError(f"{EXAMPLE} names serving.metrics: revisit compass_dev.clusterdemo")
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
    notes += (
        late_binding_adaptations(spec, settings)
        if settings.late_binding
        else whole_workflow_adaptations(spec)
    )
    return manifest, notes


def late_binding_serving(lag_share: float, lag_reserve: int) -> dict[str, Any]:
    """The example's serving.binding and admission with this lag cap (camelCase): rag-sim's
    three stages bound per request, admission without the wait rule."""
    serving = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))["spec"]["serving"]
    binding = {**serving["binding"], "lagShare": lag_share, "lagReserve": lag_reserve}
    return {"binding": binding, "admission": serving["admission"]}


def late_binding_adaptations(spec: dict[str, Any], settings: ClusterDemoSettings) -> list[str]:
    """The example's late binding checked, its lag cap replaced where asked (in ``spec``), and
    the local router's gate; one line each saying why."""
    serving = spec["serving"]
    settings_in = ServingSettings.model_validate(serving)
    if settings_in.binding.mode is BindingMode.WORKFLOW or not settings_in.admits:
        raise ValueError(
            f"{EXAMPLE} no longer serves with per-request binding and admission: revisit "
            "compass_dev.clusterdemo"
        )
    notes = []
    default_share, default_reserve = settings_in.binding.lag_share, settings_in.binding.lag_reserve
    lag_share = settings.binding_lag_share or default_share
    lag_reserve = (
        default_reserve if settings.binding_lag_reserve is None else settings.binding_lag_reserve
    )
    if (lag_share, lag_reserve) != (default_share, default_reserve):
        notes.append(
            f"serving.binding lagShare {default_share} -> {lag_share}, lagReserve "
            f"{default_reserve} -> {lag_reserve} (--binding-lag, --binding-lag-reserve)"
        )
        serving.setdefault("binding", {}).update(lagShare=lag_share, lagReserve=lag_reserve)
    notes.append(
        f"the local router: {BINDING_ROUTER_INSTANCES} instances, compass_pipeline_slots "
        f'"{BINDING_PIPELINE_SLOTS}" (the gate, as examples/rag-sim-triton.yaml runs it with '
        "--model-config-name=gated): requests are taken up as they arrive and wait at the "
        "gate, seen there with their deadlines; a request without one (the load sends none) "
        "gets its take-up + the SLO; the pod still serves one at a time"
    )
    return notes


def whole_workflow_adaptations(spec: dict[str, Any]) -> list[str]:
    """--whole-workflow: the example's late binding and admission removed (in ``spec``), so the
    operator's policy alone decides, for the whole workflow; one line saying why."""
    serving = spec["serving"]
    removed = [key for key in ("binding", "admission") if serving.pop(key, None) is not None]
    # Per-request binding is the default: whole-workflow switching is asked for by name.
    serving["binding"] = {"mode": "workflow"}
    return [
        f"serving.{' and serving.'.join(removed) or 'binding'} removed (--whole-workflow): the "
        "policy's whole-workflow switching alone (Elastico), the local router ungated (one "
        "instance)"
    ]


def replay_ledger(rag_sim: dict[str, Any]) -> str:
    """rag-sim's recorded per-question scores as a replay ledger, rounded as Triton returns them
    (the generator's SCORE output is float32)."""
    lines = [
        {"config": json.loads(key), "scores": [float(np.float32(s)) for s in entry["scores"]]}
        for key, entry in rag_sim["configs"].items()
    ]
    return "".join(json.dumps(line) + "\n" for line in lines)
