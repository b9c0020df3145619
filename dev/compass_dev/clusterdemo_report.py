"""What `compass demo --cluster` predicts and prints: the policy the operator runs and late
binding as the simulator runs them, unscaled, on the same arrivals; each run's share of the
fastest-to-accurate gap against issue 42's floor; the status samples and served requests as a
timeline (compass_dev.clusterdemo runs the demo)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from compass.api.paretopolicy import ParetoPolicySpec
from compass.conversion import (
    admission_rule,
    binding_rule,
    binding_table,
    elastico_settings,
    latency_profiles,
)
from compass.domain.admission import Admission
from compass.domain.arrivals import Scenario
from compass.domain.boundpod import ROUTER_POLL_S
from compass.domain.planner import Plan, Slo, plan_from_profiles
from compass.domain.podmodel import PodModel
from compass.domain.policy import Decision, Observation, PolicyState
from compass.domain.profiles import LatencyProfile
from compass.domain.simulator import RunReport, Tick, simulate
from compass.domain.space import config_key
from compass.domain.strategy import StrategyPolicy, build_policy
from compass_dev.clusterdemo_setup import BINDING_PIPELINE_SLOTS, BINDING_ROUTER_INSTANCES
from compass_dev.experiment import OBSERVED_WINDOW_S, LiveRun, SwitchEvent
from compass_dev.scenarios import scaled_profile

# Issue 42's floor for the operator's policy: this share of the fastest-to-accurate gap (served
# accuracy) at no more than this many points of compliance under static fastest.
GAP_FLOOR_PCT = 30.0
COMPLIANCE_SLACK_POINTS = 1.0


def unscaled_plan(spec: ParetoPolicySpec, scale: float) -> tuple[Plan, tuple[LatencyProfile, ...]]:
    """The policy's plan at the paper's scale (the front's times and the SLO divided by scale)."""
    profiles = tuple(scaled_profile(p, 1 / scale) for p in latency_profiles(spec))
    plan = plan_from_profiles(
        profiles,
        Slo(spec.slo.latency_ms / scale, spec.slo.percentile),
        spec.hysteresis.slack_buffer_ms / scale,
        spec.threshold_model,
        spec.switch_delay_ms / scale,
        spec.router_instances,
    )
    return plan, profiles


def unscaled_policy(spec: ParetoPolicySpec, plan: Plan, scale: float) -> StrategyPolicy:
    """The policy (its strategy, cooldowns and staleness) as the simulator runs it at the
    paper's scale."""
    settings = elastico_settings(spec)
    unscaled = replace(
        settings,
        upscale_cooldown_s=settings.upscale_cooldown_s / scale,
        downscale_cooldown_s=settings.downscale_cooldown_s / scale,
        stale_after_s=settings.stale_after_s / scale,
    )
    return build_policy(spec.strategy, plan, unscaled)


@dataclass(frozen=True)
class StartingOn:
    """A policy whose first state serves front member ``index``: the live run starts where the
    idle policy climbed to (the most accurate eligible member), so the prediction beside it
    starts there too, not on the fastest where a fresh policy would."""

    policy: StrategyPolicy
    index: int

    def initial_state(self, now: float) -> PolicyState:
        """The policy's own initial state, on ``index``."""
        return replace(
            self.policy.initial_state(now),
            active=self.policy.plan.names[self.index],
            last_reason="initial: where the live run starts",
        )

    def decide(
        self, observation: Observation | None, state: PolicyState, now: float
    ) -> tuple[Decision, PolicyState]:
        """The policy's own decision."""
        return self.policy.decide(observation, state, now)


def unscaled_admission(spec: ParetoPolicySpec, scale: float) -> Admission | None:
    """The routers' admission at the paper's scale, None where the policy has none."""
    if not spec.admits:
        return None
    rule = admission_rule(spec)
    return replace(rule, slo_ms=rule.slo_ms / scale)


def binding_prediction(
    spec: ParetoPolicySpec,
    plan: Plan,
    profiles: Sequence[LatencyProfile],
    scenario: Scenario,
    slo_ms: float,
    scale: float,
) -> RunReport:
    """The simulator's late binding on the same arrivals at the paper's scale: the routers'
    table for the unscaled plan (its rate limits at the paper's rates), on what the gated
    routers see (compass.conversion.binding_rule; their 25 ms poll and their settle at
    a free pipeline, unscaled)."""
    table = binding_table(spec, plan)
    if table is None:
        raise ValueError("the policy has no per-stage binding to predict")
    rule = binding_rule(
        spec,
        table,
        BINDING_ROUTER_INSTANCES,
        BINDING_PIPELINE_SLOTS,
        ROUTER_POLL_S / scale,
        settle_s=table["settle_ms"] / 1000 / scale,
    )
    return simulate(
        rule,
        profiles,
        scenario,
        slo_ms,
        "policy",
        pod_model=PodModel(servers=BINDING_PIPELINE_SLOTS),
    )


def gap_share(run: LiveRun, front: Sequence[LatencyProfile]) -> float:
    """The run's served accuracy as a share (%) of the fastest-to-most-accurate gap of the
    ``front`` (fastest first); nan where the front has no gap."""
    fastest = front[0].accuracy
    gap = max(p.accuracy for p in front) - fastest
    return 100 * (run.served_accuracy(front) - fastest) / gap if gap > 0 else float("nan")


def floor_verdict(runs: dict[str, LiveRun], front: Sequence[LatencyProfile], title: str) -> str:
    """One line: the operator's policy's share of the gap, its compliance against static
    fastest's, and whether that meets issue 42's floor (GAP_FLOOR_PCT of the gap within
    COMPLIANCE_SLACK_POINTS of static fastest)."""
    policy, fastest = runs["policy"], runs["fastest"]
    share = gap_share(policy, front)
    ahead = policy.compliance - fastest.compliance
    met = share >= GAP_FLOOR_PCT and ahead >= -COMPLIANCE_SLACK_POINTS
    return (
        f"  share of the fastest-to-accurate gap (served accuracy): {title} {share:.0f}% at "
        f"{ahead:+.1f} points of compliance against static fastest; issue 42's floor (>= "
        f"{GAP_FLOOR_PCT:g}% at >= static fastest - {COMPLIANCE_SLACK_POINTS:.1f} points) "
        f"{'met' if met else 'not met'}"
    )


def served_mix(run: LiveRun, plan: Plan) -> dict[int, int]:
    """How many answered requests each front member served, by its index (fastest 0)."""
    index_of = {t.profile.key: i for i, t in enumerate(plan.thresholds)}
    mix: dict[int, int] = {}
    for record in run.answered:
        if record.config:
            index = index_of[config_key(json.loads(record.config))]
            mix[index] = mix.get(index, 0) + 1
    return dict(sorted(mix.items()))


def table_lines(
    table: dict[str, Any], plan: Plan, scale: float, quantile: float, measured: bool
) -> list[str]:
    """The routers' late-binding table, read back from the router, at the paper's scale."""
    lag = (
        "no lag cap"
        if table["lag_share"] is None
        else f"lag cap {table['lag_share']:g} (reserve {table['lag_reserve']})"
    )
    wait = (
        "no wait rule"
        if table["degrade_after"] is None
        else f"wait rule {table['degrade_after']:g}"
    )
    if len(table["stages"]) == 1:
        stages = "one stage (the whole configuration, bound at take-up)"
        times = f"ms at quantile {quantile:g}"
    else:
        split = "the profiled component times" if measured else "the fit"
        stages = "stages " + " | ".join(", ".join(s) for s in table["stages"])
        times = f"per-stage ms at quantile {quantile:g} (split by {split})"
    lines = [
        f"      the router holds the operator's late-binding table: {stages}, SLO "
        f"{table['slo_ms'] / scale:g} ms, {lag}, {wait}, refuse {str(table['refuse']).lower()}; "
        f"{times} and the rate limit:"
    ]
    names = {t.profile.key: (i, t.profile.name) for i, t in enumerate(plan.thresholds)}
    for entry in table["configs"]:
        index, name = names[entry["config"]]
        limit = entry["max_qps"]
        lines.append(
            f"        #{index} {name:<28} accuracy {entry['accuracy']:.4f}  "
            + " / ".join(f"{ms / scale:6.1f}" for ms in entry["stage_ms"])
            + ("  no limit" if limit is None else f"  <= {limit * scale:.2f}/s")
        )
    return lines


def status_ticks(
    samples: Sequence[tuple[float, dict[str, Any]]],
    offered: Callable[[float], float],
    sent_s: Sequence[float],
    scale: float,
) -> tuple[Tick, ...]:
    """Timeline ticks from the policy's status read during a run (sample times scaled, from the
    load's start; the last sample before it gives the state at 0). The queue depth is the
    sample's (_Sampler: Triton's at the sample); the observed rate is the load's own over
    OBSERVED_WINDOW_S."""
    sent = np.sort(np.asarray(sent_s, dtype=np.float64))
    started = [i for i, (at, _) in enumerate(samples) if at < 0]
    kept = samples[started[-1] :] if started else samples
    ticks = []
    previous = None
    for at, status in kept:
        active = (status.get("active") or {}).get("index")
        if active is None:
            continue
        unscaled = max(at, 0.0) / scale
        window = min(OBSERVED_WINDOW_S, unscaled)
        count = np.searchsorted(sent, unscaled, "right") - np.searchsorted(sent, unscaled - window)
        ticks.append(
            Tick(
                time_s=unscaled,
                offered_qps=offered(unscaled),
                observed_qps=float(count) / window if window > 0 else float("nan"),
                queue_depth=int(status.get("lastQueueDepth") or 0),
                active=int(active),
                switched=previous is not None and active != previous,
            )
        )
        previous = active
    return tuple(ticks)


def served_ticks(ticks: Sequence[Tick], run: LiveRun, plan: Plan) -> tuple[Tick, ...]:
    """With late binding, each tick's configuration is the front member that served most of
    the requests sent over the OBSERVED_WINDOW_S before it (the routers choose per request, so
    the policy's active configuration is not what served them); a tick with none keeps the
    last one's."""
    index_of = {t.profile.key: i for i, t in enumerate(plan.thresholds)}
    served = sorted(
        (r.sent_s, index_of[config_key(json.loads(r.config))]) for r in run.answered if r.config
    )
    sent = np.array([at for at, _ in served])
    members = np.array([index for _, index in served], dtype=np.int64)
    out: list[Tick] = []
    for tick in ticks:
        low, high = np.searchsorted(sent, [tick.time_s - OBSERVED_WINDOW_S, tick.time_s], "right")
        counts = np.bincount(members[low:high], minlength=len(plan.thresholds))
        previous = out[-1].active if out else tick.active
        active = int(np.argmax(counts)) if counts.sum() else previous
        out.append(replace(tick, active=active, switched=bool(out) and active != previous))
    return tuple(out)


def status_switches(ticks: Sequence[Tick], plan: Plan) -> tuple[SwitchEvent, ...]:
    """The switches the status showed (the reload's cost is the operator's, not seen here)."""
    return tuple(
        SwitchEvent(t.time_s, config_key(plan.thresholds[t.active].profile.config), 0.0)
        for t in ticks
        if t.switched
    )


def by_third(run: LiveRun, duration_s: float) -> str:
    """SLO compliance before, during and after the spike (by when each request was sent)."""
    parts = []
    for k in range(3):
        low, high = k * duration_s / 3, (k + 1) * duration_s / 3 if k < 2 else float("inf")
        part = [r for r in run.records if low <= r.sent_s < high]
        within = sum(1 for r in part if r.error is None and r.latency_s * 1000 <= run.slo_ms)
        parts.append(f"{100 * within / max(len(part), 1):.0f}%")
    return " / ".join(parts)


# ---------------------------------------------------------------------------- the cluster
