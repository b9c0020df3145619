"""Conversions between the wire types (compass.api) and the domain (compass.domain): a layer
of its own, just above api, which holds wire types only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from compass.api.binding import BindingSettings, RouterGate
from compass.api.gateway import ActuatorType
from compass.api.meta import API_VERSION, POLICY_KIND
from compass.api.paretopolicy import (
    CapacitySpec,
    FrontEntry,
    Hysteresis,
    ParetoPolicySpec,
    ServingSettings,
    SloSpec,
)
from compass.api.paretopolicy_status import ThresholdStatus
from compass.domain.admission import Admission, AdmissionPoint, router_admission
from compass.domain.arrivals import Scenario
from compass.domain.binding import (
    GATE_SETTLE_MS,
    RATE_HEADROOM,
    StageComponents,
    router_table,
    stage_plan,
)
from compass.domain.boundpod import ROUTER_POLL_S, BindingRule, RateView
from compass.domain.capacity import parse_curve
from compass.domain.elastico import ElasticoSettings
from compass.domain.mix import Dealing
from compass.domain.planner import Plan, Slo, plan_from_profiles
from compass.domain.podmodel import PodModel, planned_slots
from compass.domain.profiles import LatencyProfile
from compass.domain.simulator import FRESH, MetricsView, RunReport, simulate
from compass.domain.strategy import StrategyPolicy, build_policy

# Spec fields a person sets and a plan never writes: a planned manifest leaves them out.
PERSON_OWNED_SPEC_FIELDS = ("paused",)


def latency_profile(entry: FrontEntry) -> LatencyProfile:
    """The entry as a latency profile for the planner and the simulator."""
    return LatencyProfile(
        config=dict(entry.config),
        accuracy=entry.accuracy,
        mean_ms=entry.latency_mean_ms,
        p95_ms=entry.latency_p95_ms,
        p50_ms=entry.latency_p50_ms,
        p99_ms=entry.latency_p99_ms,
        std_ms=entry.latency_std_ms,
        # The domain curve's checks: rates ascending, percentiles ordered.
        capacity=None
        if entry.capacity is None
        else parse_curve(entry.capacity.model_dump(by_alias=False), "capacity"),
        component_ms=None if entry.component_ms is None else dict(entry.component_ms),
        ttft_mean_ms=entry.ttft_mean_ms,
        ttft_p50_ms=entry.ttft_p50_ms,
        ttft_p95_ms=entry.ttft_p95_ms,
    )


def front_entry(profile: LatencyProfile) -> FrontEntry:
    """The entry for a latency profile."""
    return FrontEntry(
        config=dict(profile.config),
        accuracy=profile.accuracy,
        latency_mean_ms=profile.mean_ms,
        latency_p95_ms=profile.p95_ms,
        latency_p50_ms=profile.p50_ms,
        latency_p99_ms=profile.p99_ms,
        latency_std_ms=profile.std_ms,
        capacity=None
        if profile.capacity is None
        else CapacitySpec.model_validate(profile.capacity.to_json()),
        component_ms=None if profile.component_ms is None else dict(profile.component_ms),
        ttft_mean_ms=profile.ttft_mean_ms,
        ttft_p50_ms=profile.ttft_p50_ms,
        ttft_p95_ms=profile.ttft_p95_ms,
    )


def latency_profiles(spec: ParetoPolicySpec) -> tuple[LatencyProfile, ...]:
    """The front entries as latency profiles."""
    return tuple(latency_profile(entry) for entry in spec.front)


def policy_plan(spec: ParetoPolicySpec) -> Plan:
    """The thresholds derived from this spec (PlanError when the SLO admits none)."""
    return plan_from_profiles(
        latency_profiles(spec),
        Slo(spec.slo.latency_ms, spec.slo.percentile),
        spec.hysteresis.slack_buffer_ms,
        spec.threshold_model,
        spec.switch_delay_ms,
        spec.router_instances,
    )


def elastico_settings(spec: ParetoPolicySpec) -> ElasticoSettings:
    """The policy knobs this spec sets."""
    return ElasticoSettings(
        upscale_cooldown_s=spec.hysteresis.upscale_cooldown_seconds,
        downscale_cooldown_s=spec.hysteresis.downscale_cooldown_seconds,
        cooldown_exponent=spec.hysteresis.cooldown_exponent,
        on_metrics_loss=spec.on_metrics_loss,
        stale_after_s=spec.stale_after_seconds,
        paused=spec.paused,
        burst_memory_s=spec.hysteresis.burst_memory_seconds,
    )


def runtime_policy(spec: ParetoPolicySpec, plan: Plan | None = None) -> StrategyPolicy:
    """The runtime policy this spec describes (``plan``: policy_plan's for it, if made)."""
    chosen = policy_plan(spec) if plan is None else plan
    return build_policy(spec.strategy, chosen, elastico_settings(spec), spec.interval_seconds)


def admission_table(spec: ParetoPolicySpec, plan: Plan) -> dict[str, Any] | None:
    """What every router gets with each switch to judge requests (None: admission off)."""
    if not spec.admits:
        return None
    return router_admission([t.profile for t in plan.thresholds], admission_rule(spec))


def binding_stages(spec: ParetoPolicySpec) -> tuple[list[tuple[str, ...]], list[StageComponents]]:
    """The stages the routers bind and the models each calls (else one stage, no model named)."""
    stages = spec.binding.stages
    if stages:
        return [tuple(stage.parameters) for stage in stages], [stage.models for stage in stages]
    return [tuple(spec.front[0].config)], [()]


def stage_shares(spec: ParetoPolicySpec) -> list[float] | None:
    """The declared stages' shares of a configuration's time, where all give one; else None."""
    shares = [stage.share for stage in spec.binding.stages]
    if not shares or None in shares:
        return None
    return [share for share in shares if share is not None]


def binding_table(spec: ParetoPolicySpec, plan: Plan) -> dict[str, Any] | None:
    """What every router gets with each switch to bind each request (None: whole-workflow)."""
    settings = spec.binding
    if not settings.mode.per_request:
        return None
    stages, components = binding_stages(spec)
    front = [t.profile for t in plan.thresholds]
    plan_of_stages = stage_plan(
        front,
        stages,
        settings.quantile,
        stage_shares(spec),
        spec.admission.quantile,
        None if not settings.stages else components,
    )
    # Several pipelines at once: the routers judge deadlines at the concurrency they run at.
    slots = settings.gate.slots
    if slots > 1:
        plan_of_stages = replace(
            plan_of_stages,
            slots=slots,
            stretch=tuple(profile.slot_stretch(slots) for profile in front),
        )
    # The wait rule is admission's, and the lag cap replaces it (bench/serving_default.py: the
    # two together win 65% of the oracle's gain where the lag cap alone wins 93%).
    waits = spec.admits and settings.lag_share is None
    return router_table(
        plan_of_stages,
        components,
        refuse=spec.admits and spec.admission.refuse,
        slo_ms=spec.slo.latency_ms,
        degrade_after=spec.admission.degrade_after if waits else None,
        lag_share=settings.lag_share,
        lag_reserve=settings.lag_reserve,
        settle_ms=GATE_SETTLE_MS,
        max_qps=[
            None if t.stay_max_qps is None else t.stay_max_qps * RATE_HEADROOM
            for t in plan.thresholds
        ],
    )


def binding_rule(
    spec: ParetoPolicySpec,
    table: Mapping[str, Any],
    router_instances: int,
    pipeline_slots: int | None,
    poll_s: float = ROUTER_POLL_S,
    decision_s: float = 0.0,
    settle_s: float | None = None,
) -> BindingRule:
    """The routers' late binding as the simulator runs it, on what those routers see."""
    if table["lag_share"] is not None and pipeline_slots is not None:
        view: dict[str, Any] = {
            "visible_followers": router_instances - pipeline_slots,
            "followers_poll_s": None,
            "rate_view": RateView.GATE_ARRIVALS,
        }
    else:
        view = {
            "followers_poll_s": poll_s if pipeline_slots is None else None,
            "rate_view": RateView.TAKEN_ARRIVALS if pipeline_slots is None else RateView.ARRIVALS,
        }
    # A request at a free pipeline settles only behind a gate.
    if pipeline_slots is None:
        settle_s = 0.0
    elif settle_s is None:
        settle_s = float(table.get("settle_ms", 0.0)) / 1000
    stages, _ = binding_stages(spec)
    return BindingRule(
        stages=stages,
        prior_shares=stage_shares(spec),
        quantile=spec.binding.quantile,
        # As the table tells the routers: refusing only where admission is enabled.
        refuse=bool(table["refuse"]),
        admission_quantile=spec.admission.quantile,
        max_qps=tuple(c["max_qps"] for c in table["configs"]),
        degrade_after=table["degrade_after"],
        # The routers poll their own queue; behind the gate they see each waiter's deadline.
        spare_followers=True,
        lag_share=table["lag_share"],
        lag_reserve=table["lag_reserve"],
        decision_s=decision_s,
        settle_s=settle_s,
        **view,
    )


def mix_dealing(spec: ParetoPolicySpec) -> Dealing:
    """How the spec's actuator deals a mix: the routers' round-robin, or the gateway's draw."""
    gateway = spec.routing is not None and spec.routing.actuator is not ActuatorType.TRITON
    return Dealing.DRAW if gateway else Dealing.ROUND_ROBIN


def admission_rule(spec: ParetoPolicySpec) -> Admission:
    """The spec's admission rule at dispatch (enabled or not: ``simulate --admission`` runs it)."""
    return Admission(
        spec.slo.latency_ms,
        spec.admission.quantile,
        at=AdmissionPoint.DISPATCH,
        degrade_after=spec.admission.degrade_after,
        refuse=spec.admission.refuse,
    )


def spec_for_plan(
    plan: Plan,
    hysteresis: Hysteresis | None = None,
    serving: ServingSettings | None = None,
    **fields: Any,
) -> ParetoPolicySpec:
    """The ParetoPolicy spec for a plan (its front, SLO, slack buffer and model) and settings."""
    base = serving or ServingSettings()
    chosen = (hysteresis or base.hysteresis).model_copy(
        update={"slack_buffer_ms": plan.slack_buffer_ms}
    )
    settings = {
        **base.model_dump(exclude={"hysteresis", "threshold_model"}),
        "switch_delay_ms": plan.switch_delay_ms,
        "router_instances": plan.servers,
        **fields,
    }
    given = fields.get("binding", base.binding)
    binding = given if isinstance(given, BindingSettings) else BindingSettings.model_validate(given)
    settings["binding"] = planned_gate(binding, [t.profile for t in plan.thresholds])
    return ParetoPolicySpec(
        front=[front_entry(t.profile) for t in plan.thresholds],
        slo=SloSpec(latency_ms=plan.slo.latency_ms, percentile=plan.slo.percentile),
        hysteresis=chosen,
        threshold_model=plan.model,
        **settings,
    )


def planned_gate(binding: BindingSettings, front: Sequence[LatencyProfile]) -> BindingSettings:
    """``binding`` with its gate's slots planned from the front's curves, where none was given."""
    if not binding.mode.per_request or "gate" in binding.model_fields_set:
        return binding
    slots = planned_slots(front)
    if slots == binding.gate.slots:
        return binding
    waiters = binding.gate.instances - binding.gate.slots
    gate = RouterGate(instances=slots + waiters, slots=slots)
    return binding.model_copy(update={"gate": gate})


def threshold_statuses(plan: Plan) -> list[ThresholdStatus]:
    """Every front member's limits, fastest first, rounded for the status."""
    return [
        ThresholdStatus(
            config=t.profile.name,
            eligible=t.eligible,
            slack_ms=round(t.slack_ms, 3),
            stay_max_queue=t.stay_max_queue,
            enter_max_queue=t.enter_max_queue,
            stay_max_qps=None if t.stay_max_qps is None else round(t.stay_max_qps, 4),
            enter_max_qps=None if t.enter_max_qps is None else round(t.enter_max_qps, 4),
            ttft_mean_ms=None
            if t.profile.ttft_mean_ms is None
            else round(t.profile.ttft_mean_ms, 3),
        )
        for t in plan.thresholds
    ]


def planned_manifest(
    name: str,
    namespace: str | None,
    spec: Mapping[str, Any],
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A planned ParetoPolicy as an applyable manifest, never with PERSON_OWNED_SPEC_FIELDS."""
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    if labels:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": API_VERSION,
        "kind": POLICY_KIND,
        "metadata": metadata,
        "spec": {k: v for k, v in spec.items() if k not in PERSON_OWNED_SPEC_FIELDS},
    }


def simulate_serving(
    spec: ParetoPolicySpec,
    scenario: Scenario,
    label: str = "policy",
    *,
    pods: int = 1,
    plan: Plan | None = None,
    pod_model: PodModel | None = None,
    admission: Admission | None = None,
    metrics_view: MetricsView = FRESH,
) -> RunReport:
    """The spec served on the scenario as its routers and operator would serve it."""
    chosen = policy_plan(spec) if plan is None else plan
    table = binding_table(spec, chosen)
    gate = spec.binding.gate
    if table is None and admission is None and spec.admits:
        admission = admission_rule(spec)
    serving = (
        runtime_policy(spec, chosen)
        if table is None
        else binding_rule(spec, table, gate.instances, gate.slots)
    )
    return simulate(
        serving,
        [t.profile for t in chosen.thresholds],
        scenario,
        spec.slo.latency_ms,
        label,
        spec.interval_seconds,
        pods=pods,
        switch_delay_s=spec.switch_delay_ms / 1000,
        pod_model=(
            pod_model or PodModel(spec.router_instances)
            if table is None
            # Several slots share the pod's cores and batches (the contended pod model).
            else PodModel(servers=gate.slots, contended=gate.slots > 1)
        ),
        admission=admission if table is None else None,
        metrics_view=metrics_view,
        dealing=mix_dealing(spec),
    )
