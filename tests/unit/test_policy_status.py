"""The ParetoPolicy controller's pure decisions (compass.controllers.policy_*) and the operator
process's small helpers; the kopf timer around them runs in tests/k8s/test_policy_controller.py."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from dataclasses import replace
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client import generate_latest

from compass.api.crds import PARETO_POLICY, build_crd
from compass.api.metricsource import MetricsSourceType
from compass.api.paretopolicy_status import ConditionType, ParetoPolicyStatus
from compass.commands.main import main
from compass.controllers import policy_compile, policy_conditions, policy_decisions, policy_status
from compass.controllers.manager import _quiet_timer_successes, scope
from compass.controllers.runtime import GONE_REMEMBERED, OperatorMetrics, RecentUids
from compass.controllers.settings import OperatorSettings
from compass.domain.policy import Observation, PolicyState
from compass.domain.predictive import Predictive
from compass.domain.served import ServedCounts
from compass.domain.space import config_key
from compass.domain.split import Split

FAST = {"generator_model": "small", "retriever_k": 20}
ACCURATE = {"generator_model": "large", "retriever_k": 20}
NOW = 1_800_000_000.0
ISO = policy_status.rfc3339(NOW)


def spec(**overrides: Any) -> dict[str, Any]:
    """A valid ParetoPolicy spec (camelCase, as the API server hands it over)."""
    value: dict[str, Any] = {
        "front": [
            {"config": FAST, "accuracy": 0.83, "latencyMeanMs": 20, "latencyP95Ms": 23},
            {"config": ACCURATE, "accuracy": 0.86, "latencyMeanMs": 33, "latencyP95Ms": 37},
        ],
        "slo": {"latencyMs": 150},
        "hysteresis": {"downscaleCooldownSeconds": 2, "cooldownExponent": 0, "slackBufferMs": 20},
        "routing": {"grpcEndpoint": "triton.serving:8001"},
    }
    value.update(overrides)
    return value


COMPILED = policy_compile.compile_policy(spec(), generation=1)
PLAN = COMPILED.plan
FAST_NAME, ACCURATE_NAME = PLAN.names


# ---------------------------------------------------------------------------- compile


def test_compile_derives_plan_and_endpoints() -> None:
    assert COMPILED.generation == 1
    assert COMPILED.grpc_address == "triton.serving:8001"
    assert COMPILED.router_model == "router"
    # No metrics section: Triton's own /metrics on the routing host.
    assert COMPILED.metrics == policy_compile.MetricsTarget(
        MetricsSourceType.TRITON, "http://triton.serving:8002/metrics", None, None
    )
    assert PLAN.names == ("small/20", "large/20")


def test_admission_gives_the_routers_each_members_time_by_its_key() -> None:
    # On by default, as the routers bind each request; off for whole-workflow serving.
    assert COMPILED.admission is not None
    whole = policy_compile.compile_policy(spec(binding={"mode": "workflow"}), 1)
    assert whole.admission is None
    table = policy_compile.compile_policy(
        spec(admission={"enabled": True, "quantile": 0.9}), 1
    ).admission
    assert table is not None
    assert table["fastest"] == config_key(FAST)
    quantiles = table["quantiles_ms"]
    assert set(quantiles) == {config_key(FAST), config_key(ACCURATE)}
    # The 90th percentile of each entry: between its mean and its p95.
    assert 20 < quantiles[config_key(FAST)] < 23
    assert 33 < quantiles[config_key(ACCURATE)] < 37


def test_address_override_replaces_the_routing_endpoint() -> None:
    compiled = policy_compile.compile_policy(
        spec(routing=None), 3, address_override="127.0.0.1:9001"
    )
    assert compiled.grpc_address == "127.0.0.1:9001"
    assert compiled.metrics.url == "http://127.0.0.1:8002/metrics"


def test_a_service_target_switches_its_pods_and_reads_each_pods_metrics() -> None:
    routing = {"service": "triton", "grpcPort": "grpc", "metricsPort": 9102}
    compiled = policy_compile.compile_policy(spec(routing=routing), 1)
    assert (compiled.service, compiled.grpc_address) == ("triton", None)
    assert (compiled.grpc_port, compiled.metrics_port) == ("grpc", 9102)
    # No metrics section: every pod's own /metrics, no single URL.
    assert compiled.metrics == policy_compile.MetricsTarget(
        MetricsSourceType.TRITON, None, None, None
    )
    # The address override (a dev setting) still wins over the Service.
    overridden = policy_compile.compile_policy(
        spec(routing=routing), 1, address_override="127.0.0.1:9"
    )
    assert (overridden.service, overridden.grpc_address) == (None, "127.0.0.1:9")


def test_prometheus_source_keeps_its_queries() -> None:
    metrics = {"type": "prometheus", "url": "http://prom:9090", "query": "q", "arrivalsQuery": "a"}
    compiled = policy_compile.compile_policy(spec(metrics=metrics), 1)
    assert compiled.metrics == policy_compile.MetricsTarget(
        MetricsSourceType.PROMETHEUS, "http://prom:9090", "q", "a"
    )


@pytest.mark.parametrize(
    ("change", "field", "fix"),
    [
        ({"slo": {"latencyMs": 10}}, "spec.slo.latencyMs", "raise the SLO above 23.0 ms"),
        ({"routing": None}, "spec.routing.service", "routing.service: triton"),
        (
            {"routing": {"service": "triton", "grpcEndpoint": "t:8001"}},
            "spec.routing",
            "not both",
        ),
        ({"routing": {"grpcEndpoint": "triton"}}, "spec.routing.grpcEndpoint", "a port in 1-65535"),
        ({"metrics": {"type": "prometheus"}}, "spec.metrics.url", "Prometheus' base URL"),
        (
            {"metrics": {"type": "triton", "arrivalsQuery": "x"}},
            "spec.metrics.arrivalsQuery",
            "remove it",
        ),
        ({"intervalSeconds": 0}, "spec.intervalSeconds", "correct it"),
        ({"admission": {"enabled": True, "quantile": 1}}, "spec.admission.quantile", "correct"),
    ],
)
def test_a_spec_that_can_never_work_names_the_field_and_the_fix(
    change: dict[str, Any], field: str, fix: str
) -> None:
    with pytest.raises(policy_compile.SpecError) as error:
        policy_compile.compile_policy(spec(**change), 1)
    message = str(error.value)
    assert message.startswith(f"{field}: "), message
    assert fix in message


@pytest.mark.parametrize(
    ("url", "what"),
    [
        ("file:///etc/passwd", "only http:// or https://"),
        ("gopher://prom:70", "only http:// or https://"),
        ("http://prom:9090/?x=", "has a query"),
        ("http://prom:9090/api#frag", "has a fragment"),
        ("http://admin:secret@prom:9090", "has credentials"),
    ],
)
def test_a_metrics_url_of_another_shape_is_refused_naming_the_field(url: str, what: str) -> None:
    """Only http(s)://host[:port][/path]: the operator appends to it and fetches it itself."""
    metrics = {"type": "prometheus", "url": url}
    with pytest.raises(policy_compile.SpecError) as error:
        policy_compile.compile_policy(spec(metrics=metrics), 1)
    assert str(error.value).startswith("spec.metrics.url: "), str(error.value)
    assert what in str(error.value)
    assert "secret" not in str(error.value)


def test_a_check_the_crd_cannot_make_names_the_list_item() -> None:
    front = spec()["front"]
    front[1] = {**front[1], "latencyP99Ms": 30}  # below its p95: only pydantic sees this
    with pytest.raises(
        policy_compile.SpecError, match=r"^spec\.front\[1\]: latencyP99Ms 30 is below"
    ):
        policy_compile.compile_policy(spec(front=front), 1)


# ---------------------------------------------------------------------------- timing


@pytest.mark.parametrize(
    ("last", "now", "interval", "due"),
    [
        (None, 0.0, 5.0, True),
        (0.0, 1.02, 1.0, True),
        (0.0, 1.02, 2.0, False),
        (0.0, 2.05, 2.0, True),
        (0.0, 1.02, 0.2, True),  # below the 1 s tick: every tick
        (0.0, 4.4, 5.0, False),
        (0.0, 4.6, 5.0, True),
    ],
)
def test_decision_due_honours_the_interval_to_half_a_tick(
    last: float | None, now: float, interval: float, due: bool
) -> None:
    assert policy_decisions.decision_due(last, now, interval) is due


def test_retry_delay_doubles_up_to_the_cap() -> None:
    assert [policy_decisions.retry_delay(n, 1.0) for n in range(1, 6)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert policy_decisions.retry_delay(1, 3.0) == 3.0


# ---------------------------------------------------------------------------- state


def pending(active: str = FAST_NAME) -> PolicyState:
    """On ``active``, with downscale evidence collected since NOW - 1 and one past switch."""
    return PolicyState(
        active=active,
        active_since=NOW - 100,
        last_switch_at=NOW - 100,
        last_reason="queue 9 over large/20's limits",
        switches=3,
        downscale_since=NOW - 1,
        entry_levels=((NOW - 1, ACCURATE_NAME),),
        arrivals=((NOW - 1, 10.0),),
    )


def test_saved_state_is_resumed_whole_when_the_router_agrees() -> None:
    saved = pending()
    state, note = policy_decisions.align_state(saved, NOW - 1, config_key(FAST), PLAN, NOW, 5.0)
    assert state == saved
    assert note is None


def test_a_mix_the_routers_serve_is_resumed_and_one_changed_outside_is_adopted() -> None:
    saved = replace(pending(), blend=ACCURATE_NAME, weight=0.25)
    key = policy_decisions.state_routing_key(PLAN, saved)
    assert key is not None
    assert key.startswith("mix:")
    state, note = policy_decisions.align_state(saved, NOW - 1, key, PLAN, NOW, 5.0)
    assert (state, note) == (saved, None)
    # The pods serve another weight: adopted, and the note names both mixes.
    other = policy_decisions.state_routing_key(PLAN, replace(saved, weight=0.5))
    assert other is not None
    state, note = policy_decisions.align_state(saved, NOW - 1, other, PLAN, NOW, 5.0)
    assert (state.active, state.blend, state.weight) == (FAST_NAME, ACCURATE_NAME, 0.5)
    assert note is not None
    assert "+ 50%" in note
    assert "+ 25%" in note
    # A saved mix while the pods serve the base alone: the base alone is adopted.
    state, _ = policy_decisions.align_state(saved, NOW - 1, config_key(FAST), PLAN, NOW, 5.0)
    assert (state.active, state.blend, state.weight) == (FAST_NAME, None, 0.0)
    # A mix with a configuration off the front is not on the front.
    state, note = policy_decisions.align_state(
        saved, NOW - 1, 'mix:["{}", "{}", 0.5]', PLAN, NOW, 5.0
    )
    assert state.active is None
    assert note is not None


def test_state_round_trips_through_the_status() -> None:
    status = policy_status.build_status(PLAN, pending(), None, {}, "hold", [], 1)
    restored = PolicyState.from_dict(status["policyState"])
    state, _ = policy_decisions.align_state(restored, NOW - 1, config_key(FAST), PLAN, NOW, 5.0)
    assert state == pending()


def test_a_status_edited_to_a_time_in_the_future_freezes_no_cooldown() -> None:
    """activeSince: 1e10 (the year 2286) reads back, but counts as now: the metrics-loss
    fallback and the cooldowns run from the present."""
    on_accurate = replace(pending(), active=ACCURATE_NAME, downscale_since=None, entry_levels=())
    edited = on_accurate.to_dict() | {"active_since": 1e10, "last_switch_at": 1e10}
    edited |= {"observed_at": 1e10, "arrivals": [[1e10, 5.0]]}
    saved = policy_decisions.saved_state({"policyState": edited})
    assert saved is not None
    state, _ = policy_decisions.align_state(saved, None, config_key(ACCURATE), PLAN, NOW, 5.0)
    assert (state.active_since, state.last_switch_at, state.observed_at) == (NOW, NOW, NOW)
    assert state.arrivals == ()
    # Metrics missing for longer than staleAfterSeconds: the fallback to the fastest happens.
    decision, _ = COMPILED.policy.decide(None, state, NOW + 6)
    assert decision.target == FAST_NAME


def test_downscale_evidence_is_dropped_after_a_gap_without_observations() -> None:
    state, note = policy_decisions.align_state(
        pending(), NOW - 30, config_key(FAST), PLAN, NOW, 5.0
    )
    assert (state.downscale_since, state.entry_levels) == (None, ())
    # The rest is kept: the upscale cooldown still counts from the last switch.
    assert (state.active, state.switches, state.last_switch_at) == (FAST_NAME, 3, NOW - 100)
    assert note is not None
    assert "downscale evidence restarts" in note


def test_the_router_is_the_truth_when_it_differs() -> None:
    state, note = policy_decisions.align_state(
        pending(), NOW - 1, config_key(ACCURATE), PLAN, NOW, 5.0
    )
    assert state.active == ACCURATE_NAME
    assert state.active_since == NOW
    assert state.downscale_since is None
    assert state.switches == 3
    assert note is not None
    assert "changed outside the policy" in note


def test_a_fresh_policy_starts_from_what_the_router_serves() -> None:
    state, note = policy_decisions.align_state(None, None, config_key(ACCURATE), PLAN, NOW, 5.0)
    assert (state.active, state.active_since, state.switches) == (ACCURATE_NAME, NOW, 0)
    assert note is None


def test_a_configuration_off_the_front_leaves_no_active_one() -> None:
    other = config_key({"generator_model": "other", "retriever_k": 1})
    state, note = policy_decisions.align_state(None, None, other, PLAN, NOW, 5.0)
    assert state.active is None  # the policy's first decision falls back to the fastest
    decision, _ = COMPILED.policy.decide(Observation(NOW, 0.0), state, NOW)
    assert decision.target == FAST_NAME
    assert note is not None


def test_pausing_drops_the_downscale_evidence_only() -> None:
    state = policy_decisions.paused_state(pending())
    assert (state.downscale_since, state.entry_levels) == (None, ())
    assert state.active == FAST_NAME
    assert state.arrivals == pending().arrivals


# ---------------------------------------------------------------------------- conditions


def conditions_of(
    health: policy_conditions.Health, previous: list[dict[str, Any]] | None = None
) -> Any:
    return policy_conditions.merge_conditions(
        previous or [], policy_conditions.health_conditions(health), ISO, 4
    )


def by_type(conditions: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in conditions}


def test_serving_policy_is_ready_with_metrics() -> None:
    health = policy_conditions.Health(
        metrics_read=True, metrics_source="m", active=FAST_NAME, decision="hold"
    )
    found = by_type(conditions_of(health))
    # No pods reached, no binding reported: neither condition.
    unreported = {ConditionType.PODS_SERVING, ConditionType.PER_REQUEST_BINDING}
    assert list(found) == [t.value for t in ConditionType if t not in unreported]
    assert found["Ready"]["status"] == "True"
    assert found["Ready"]["message"] == f"serving {FAST_NAME}; hold"
    assert found["MetricsAvailable"]["status"] == "True"
    assert found["Degraded"]["status"] == "False"
    assert found["Paused"]["status"] == "False"
    assert all(
        c["lastTransitionTime"] == ISO and c["observedGeneration"] == 4 for c in found.values()
    )


def test_transition_time_stays_while_the_status_does_not_change() -> None:
    first = conditions_of(
        policy_conditions.Health(metrics_read=True, active=FAST_NAME, decision="a")
    )
    later = policy_conditions.merge_conditions(
        first,
        policy_conditions.health_conditions(
            policy_conditions.Health(metrics_read=True, active=ACCURATE_NAME, decision="b")
        ),
        policy_status.rfc3339(NOW + 10),
        5,
    )
    ready = by_type(later)["Ready"]
    assert ready["lastTransitionTime"] == ISO
    assert ready["message"] == f"serving {ACCURATE_NAME}; b"
    lost = policy_conditions.merge_conditions(
        later,
        policy_conditions.health_conditions(
            policy_conditions.Health(metrics_read=True, metrics_error="down", decision="x")
        ),
        policy_status.rfc3339(NOW + 20),
        5,
    )
    assert by_type(lost)["MetricsAvailable"]["lastTransitionTime"] == policy_status.rfc3339(
        NOW + 20
    )


def test_unreachable_triton_keeps_the_metrics_condition_it_could_not_check() -> None:
    before = conditions_of(policy_conditions.Health(metrics_read=True, active=FAST_NAME))
    after = by_type(
        policy_conditions.merge_conditions(
            before,
            policy_conditions.health_conditions(
                policy_conditions.Health(unreachable="Triton at x:1: refused")
            ),
            ISO,
            4,
        )
    )
    assert after["Ready"]["status"] == "False"
    assert after["Ready"]["reason"] == "TritonUnreachable"
    assert "x:1" in after["Ready"]["message"]
    assert after["Degraded"]["reason"] == "TritonUnreachable"
    assert after["MetricsAvailable"] == by_type(before)["MetricsAvailable"]


def test_a_condition_of_another_type_is_kept_and_sorted_last() -> None:
    foreign = {"type": "Audited", "status": "True", "reason": "ByHand", "lastTransitionTime": ISO}
    key = config_key(FAST)
    routing = policy_conditions.routing_status([("a", key, None)], key)
    binding = policy_conditions.binding_condition({}, "elastico", (8, 1), per_request=False)
    merged = conditions_of(
        policy_conditions.Health(
            metrics_read=True, active=FAST_NAME, routing=routing, binding=binding
        ),
        [foreign],
    )
    assert [c["type"] for c in merged] == [*(t.value for t in ConditionType), "Audited"]
    assert {k: v for k, v in merged[-1].items() if v not in ("", None)} == foreign


def test_paused_and_invalid_spec_conditions() -> None:
    pause = policy_decisions.pause_of(COMPILED.spec.model_copy(update={"paused": True}), {})
    health = policy_conditions.Health(metrics_read=True, pause=pause, active=FAST_NAME)
    paused = by_type(conditions_of(health))
    assert (paused["Paused"]["status"], paused["Ready"]["reason"]) == ("True", "Paused")
    assert paused["Paused"]["reason"] == "PausedBySpec"
    assert paused["Paused"]["message"] == f"spec.paused: holding {FAST_NAME}"
    invalid = by_type(
        conditions_of(policy_conditions.Health(spec_error="spec.slo.latencyMs: x; y"))
    )
    assert list(invalid) == ["Ready"]
    assert invalid["Ready"]["reason"] == "InvalidSpec"


def test_events_only_on_transitions() -> None:
    ok = conditions_of(
        policy_conditions.Health(metrics_read=True, metrics_source="m", active=FAST_NAME)
    )
    lost = conditions_of(policy_conditions.Health(metrics_read=True, metrics_error="gone"), ok)
    still_lost = conditions_of(
        policy_conditions.Health(metrics_read=True, metrics_error="gone"), lost
    )
    back = conditions_of(
        policy_conditions.Health(metrics_read=True, metrics_source="m", active=FAST_NAME), lost
    )
    assert policy_conditions.transition_events([], ok) == []
    assert [(e.type, e.reason) for e in policy_conditions.transition_events(ok, lost)] == [
        ("Warning", "MetricsLost")
    ]
    assert policy_conditions.transition_events(lost, still_lost) == []
    assert [e.reason for e in policy_conditions.transition_events(lost, back)] == [
        "MetricsRestored"
    ]
    down = conditions_of(policy_conditions.Health(unreachable="refused"), ok)
    assert [e.reason for e in policy_conditions.transition_events(ok, down)] == [
        "TritonUnreachable"
    ]
    assert (
        policy_conditions.transition_events(
            down, conditions_of(policy_conditions.Health(unreachable="refused"), down)
        )
        == []
    )
    assert [e.reason for e in policy_conditions.transition_events(down, ok)] == ["TritonReachable"]


def test_switch_event_is_one_line() -> None:
    event = policy_conditions.switch_event(
        ACCURATE_NAME, FAST_NAME, 7.0, "queue 7 over large/20's limits"
    )
    assert (event.type, event.reason) == ("Normal", "ConfigurationSwitched")
    assert (
        event.message == f"{ACCURATE_NAME} -> {FAST_NAME}: queue 7; queue 7 over large/20's limits"
    )
    assert "\n" not in event.message


# ---------------------------------------------------------------------------- status


def test_status_matches_the_crd_model_and_has_no_empty_strings() -> None:
    conditions = conditions_of(policy_conditions.Health(metrics_read=True, active=FAST_NAME))
    state = replace(pending(), last_reason="")
    status = policy_status.build_status(
        PLAN, state, Observation(NOW, 2.0), {}, "hold", conditions, 4
    )
    parsed = ParetoPolicyStatus.model_validate(status)
    assert parsed.active is not None
    assert (parsed.active.name, parsed.active.index) == (FAST_NAME, 0)
    assert status["lastQueueDepth"] == 2.0
    assert status["lastObservationTime"] == ISO
    assert [t["config"] for t in status["thresholds"]] == [FAST_NAME, ACCURATE_NAME]

    def strings(value: Any) -> list[str]:
        if isinstance(value, dict):
            return [s for v in value.values() for s in strings(v)]
        if isinstance(value, list):
            return [s for v in value for s in strings(v)]
        return [value] if isinstance(value, str) else []

    assert "" not in strings(status)  # Degraded's empty message is left out


def test_unobserved_fields_keep_their_previous_values() -> None:
    previous = {"lastQueueDepth": 3.0, "lastObservationTime": "earlier"}
    status = policy_status.build_status(PLAN, pending(), None, previous, "hold", [], 1)
    assert (status["lastQueueDepth"], status["lastObservationTime"]) == (3.0, "earlier")


def test_served_is_named_by_the_front_and_kept_until_counted_again() -> None:
    fast, accurate = (t.profile for t in PLAN.thresholds)
    counts = ServedCounts({fast.key: 30.0, accurate.key: 10.0}, refused=2.0, seconds=59.6)
    served = policy_status.served_status(counts, PLAN, NOW)
    assert ParetoPolicyStatus.model_validate({"served": served}).served is not None
    assert (served["windowSeconds"], served["requests"], served["refused"]) == (60, 40, 2)
    assert served["observedTime"] == ISO
    assert served["accuracy"] == pytest.approx(
        round((30 * fast.accuracy + 10 * accurate.accuracy) / 40, 4)
    )
    assert [(c["name"], c["share"]) for c in served["configurations"]] == [
        (FAST_NAME, 0.75),
        (ACCURATE_NAME, 0.25),
    ]
    status = policy_status.build_status(PLAN, pending(), None, {}, "hold", [], 1, served=served)
    assert status["served"] == served
    # Not counted this time (no new reading): the status keeps what it showed.
    kept = policy_status.build_status(PLAN, pending(), None, status, "hold", [], 1)
    assert kept["served"] == served
    # A new mix is routine: it waits for the heartbeat, as the queue seen does.
    moved = {**status, "served": {**served, "requests": 41}}
    assert policy_status.status_patch(status, moved, NOW, NOW - 1) == {}
    heartbeat = NOW - policy_status.STATUS_HEARTBEAT_S
    assert policy_status.status_patch(status, moved, NOW, heartbeat) == {"served": {"requests": 41}}


def test_merge_patch_changes_removes_and_recurses() -> None:
    old = {"a": 1, "b": {"x": 1, "y": 2}, "c": [1], "gone": 5, "none": None}
    new = {"a": 1, "b": {"x": 1, "y": 3}, "c": [1, 2], "added": None, "none": None}
    assert policy_status.merge_patch(old, new) == {"gone": None, "b": {"y": 3}, "c": [1, 2]}
    assert policy_status.merge_patch(new, copy.deepcopy(new)) == {}


def test_status_patch_waits_for_the_heartbeat_when_only_routine_fields_changed() -> None:
    old = {"lastObservationTime": "t1", "switches": 1}
    new = {"lastObservationTime": "t2", "switches": 1}
    assert policy_status.status_patch(old, new, NOW, NOW - 1) == {}
    assert policy_status.status_patch(old, new, NOW, NOW - policy_status.STATUS_HEARTBEAT_S) == {
        "lastObservationTime": "t2"
    }
    assert policy_status.status_patch(old, {**new, "switches": 2}, NOW, NOW - 1) == {
        "lastObservationTime": "t2",
        "switches": 2,
    }
    assert policy_status.status_patch({}, new, NOW, None) == new
    # The queue seen moves every tick under load: it waits too, and rides with any real change
    # (a switch writes the queue that caused it).
    queued = {**new, "lastQueueDepth": 7.0}
    assert policy_status.status_patch({**old, "lastQueueDepth": 0.0}, queued, NOW, NOW - 1) == {}
    assert policy_status.status_patch(
        {**old, "lastQueueDepth": 0.0}, {**queued, "switches": 2}, NOW, NOW - 1
    ) == {"lastObservationTime": "t2", "lastQueueDepth": 7.0, "switches": 2}
    # New arrivals samples are routine too; new downscale evidence is not.
    with_state = {**old, "policyState": {"arrivals": [[1, 2]], "downscale_since": None}}
    more = {**new, "policyState": {"arrivals": [[1, 2], [2, 3]], "downscale_since": None}}
    assert policy_status.status_patch(with_state, more, NOW, NOW - 1) == {}
    pending = {**new, "policyState": {"arrivals": [[1, 2]], "downscale_since": 5}}
    assert policy_status.status_patch(with_state, pending, NOW, NOW - 1) == {
        "lastObservationTime": "t2",
        "policyState": {"downscale_since": 5},
    }

    # So is the decision's wording (predictive quotes a rate that moves every tick), until the
    # heartbeat or a real change carries it.
    reworded = {**new, "lastDecision": "forecast 1.02/s"}
    before = {**old, "lastDecision": "forecast 1.01/s"}
    assert policy_status.status_patch(before, reworded, NOW, NOW - 1) == {}
    assert policy_status.status_patch(before, {**reworded, "switches": 2}, NOW, NOW - 1) == {
        "lastObservationTime": "t2",
        "lastDecision": "forecast 1.02/s",
        "switches": 2,
    }

    # A condition reworded with the same status and reason waits too; a new reason does not.
    def ready(reason: str, message: str) -> dict[str, object]:
        return {"conditions": [{"type": "Ready", "status": "True", "reason": reason,
                                "message": message}]}  # fmt: skip

    was = {**old, **ready("Serving", "serving a; forecast 1.01/s")}
    assert policy_status.status_patch(was, {**new, **ready("Serving", "serving a; forecast 1.02/s")},
                           NOW, NOW - 1) == {}  # fmt: skip
    paused = policy_status.status_patch(was, {**new, **ready("Paused", "serving a")}, NOW, NOW - 1)
    assert paused["conditions"][0]["reason"] == "Paused"
    assert (
        policy_status.status_patch(was, {**new, "conditions": []}, NOW, NOW - 1)["conditions"] == []
    )


def test_a_null_the_api_server_dropped_is_not_an_edit_to_put_back() -> None:
    """A merge patch's nulls are kept nowhere by the API server: the live status lacks those
    keys. That is the operator's own write, not someone's edit, so a steady tick writes
    nothing (before, every tick wrote the thresholds back: 1,000 policies, 175 writes a second)."""
    threshold = {"config": "a", "stayMaxQps": None, "ttftMeanMs": None, "slackMs": 5.0}
    written = {"lastObservationTime": "t1", "switches": 1, "thresholds": [threshold]}
    live = {
        "lastObservationTime": "t1",
        "switches": 1,
        "thresholds": [{"config": "a", "slackMs": 5.0}],
    }
    new = {**written, "lastObservationTime": "t2"}
    assert policy_status.status_patch(written, new, NOW, NOW - 1, live=live) == {}
    # A real edit of the same field is still put back.
    edited = {**live, "thresholds": [{"config": "a", "slackMs": 99.0}]}
    assert policy_status.status_patch(written, new, NOW, NOW - 1, live=edited) == {
        "lastObservationTime": "t2",
        "thresholds": [threshold],
    }


def test_rfc3339_round_trip() -> None:
    assert ISO.endswith("Z")
    assert policy_status.parse_rfc3339(ISO) == pytest.approx(NOW, abs=1e-3)
    assert policy_status.parse_rfc3339(None) is None
    assert policy_status.parse_rfc3339("not a time") is None


# ---------------------------------------------------------------------------- resource, process


def test_printer_columns_show_what_the_on_call_needs() -> None:
    version = build_crd(PARETO_POLICY)["spec"]["versions"][0]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Active": ".status.active.name",
        "Queue": ".status.lastQueueDepth",
        "Accuracy": ".status.active.accuracy",
        "P95": ".status.active.latencyP95Ms",
        "SLO": ".spec.slo.latencyMs",
        "Served": ".status.served.accuracy",
        "Switches": ".status.switches",
        "Ready": '.status.conditions[?(@.type=="Ready")].status',
        "Age": ".metadata.creationTimestamp",
    }
    assert build_crd(PARETO_POLICY)["spec"]["names"]["shortNames"] == ["pp"]


def test_operator_scope() -> None:
    settings = OperatorSettings(namespaces=["a", "b"])
    assert scope(OperatorSettings(), None, False) == (True, [])
    assert scope(settings, None, False) == (False, ["a", "b"])
    assert scope(settings, ["c"], False) == (False, ["c"])
    assert scope(settings, None, True) == (True, [])
    with pytest.raises(ValueError, match="exclude each other"):
        scope(settings, ["c"], True)


def test_operator_command_rejects_conflicting_scopes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["operator", "--all-namespaces", "--namespace", "x"]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_operator_metrics_are_named_as_the_dashboard_reads_them() -> None:
    metrics = OperatorMetrics()
    metrics.reconciles.labels("ParetoPolicy", "ok").inc()
    metrics.errors.labels("ParetoPolicy", "TritonUnreachable").inc()
    metrics.decision_seconds.observe(0.01)
    metrics.switches.labels("ns", "p", "faster").inc()
    metrics.queue_depth.labels("ns", "p").set(4)
    metrics.active_index.labels("ns", "p").set(1)
    text = generate_latest(metrics.registry).decode()
    for name in (
        "compass_reconciles_total",
        "compass_errors_total",
        "compass_decision_seconds_bucket",
        "compass_switches_total",
        'compass_queue_depth{namespace="ns",policy="p"} 4.0',
        'compass_active_configuration_index{namespace="ns",policy="p"} 1.0',
    ):
        assert name in text


def _conditions(metrics: str, ready: str = "True") -> list[dict[str, Any]]:
    return [
        {"type": "Ready", "status": ready, "reason": "Serving"},
        {"type": "MetricsAvailable", "status": metrics, "reason": "MetricsRead"},
    ]


def test_policy_gauges_show_the_active_entry_its_limits_and_the_pressure() -> None:
    fastest, accurate = PLAN.thresholds
    assert fastest.stay_max_queue is not None
    deep = float(fastest.stay_max_queue + 3)
    on_fast = PolicyState(active=FAST_NAME)
    gauges = policy_status.policy_gauges(
        PLAN, on_fast, Observation(NOW, deep), _conditions("True"), False
    )
    assert gauges == policy_status.PolicyGauges(
        ready=True,
        paused=False,
        metrics_available=True,
        queue_depth=deep,
        active_index=0,
        active_name=FAST_NAME,
        at_fastest=True,
        served_accuracy=0.83,
        stay_queue_threshold=float(fastest.stay_max_queue),
        enter_queue_threshold=float(fastest.enter_max_queue or 0),
        capacity_pressure=(deep + 1) / (fastest.stay_max_queue + 1),
    )
    on_accurate = PolicyState(active=ACCURATE_NAME)
    gauges = policy_status.policy_gauges(
        PLAN, on_accurate, None, _conditions("False", "False"), True
    )
    assert (gauges.ready, gauges.paused, gauges.metrics_available) == (False, True, False)
    assert (gauges.active_index, gauges.at_fastest, gauges.served_accuracy) == (1, False, 0.86)
    assert gauges.stay_queue_threshold == float(accurate.stay_max_queue or 0)
    # No observation: the queue and the pressure keep their last values.
    assert (gauges.queue_depth, gauges.capacity_pressure) == (None, None)
    # A split's blend is weighted into the accuracy served.
    blended = PolicyState(active=FAST_NAME, blend=ACCURATE_NAME, weight=0.25)
    gauges = policy_status.policy_gauges(PLAN, blended, Observation(NOW, 0), [], False)
    assert gauges.served_accuracy == pytest.approx(0.75 * 0.83 + 0.25 * 0.86)
    assert (gauges.metrics_available, gauges.capacity_pressure) == (None, None)
    # Read but stale (MetricsAvailable False): no pressure figure, however deep the queue.
    stale = policy_status.policy_gauges(
        PLAN, on_fast, Observation(NOW, deep), _conditions("False"), False
    )
    assert (stale.queue_depth, stale.capacity_pressure) == (deep, None)


def _series(metrics: OperatorMetrics, namespace: str = "ns") -> list[str]:
    text = generate_latest(metrics.registry).decode()
    return [line for line in text.splitlines() if f'namespace="{namespace}"' in line]


def test_the_active_configuration_info_keeps_one_series_and_deletion_removes_all() -> None:
    metrics = OperatorMetrics()
    full = policy_status.policy_gauges(
        PLAN, PolicyState(active=FAST_NAME), Observation(NOW, 1), _conditions("True"), False
    )
    metrics.set_policy("ns", "p", "uid-p", full)
    metrics.set_policy("other", "p", "uid-o", full)
    metrics.switches.labels("ns", "p", "faster").inc()
    metrics.set_policy("ns", "p", "uid-p", replace(full, active_index=1, active_name="x/y"))
    info = [s for s in _series(metrics) if s.startswith("compass_active_configuration_info")]
    assert info == [
        'compass_active_configuration_info{index="1",name="x/y",namespace="ns",policy="p"} 1.0'
    ]
    assert len(_series(metrics)) == 13  # 10 gauges, the info, a switch counter (and _created)
    # A tick without a fresh queue removes the pressure's series (an autoscaler then holds).
    metrics.set_policy("ns", "p", "uid-p", replace(full, capacity_pressure=None))
    assert not [s for s in _series(metrics) if s.startswith("compass_capacity_pressure")]
    assert len(_series(metrics)) == 12
    metrics.set_fenced("ns", "p", "uid-p", False, policy_decisions.SERIES_TTL_S)
    assert len(_series(metrics)) == 13
    metrics.forget_policy("ns", "p", "uid-p")
    assert _series(metrics) == []
    assert len(_series(metrics, "other")) == 11  # another namespace's policy of that name stays
    # A tick that was in flight at the delete sets nothing after it.
    metrics.set_policy("ns", "p", "uid-p", full)
    metrics.set_fenced("ns", "p", "uid-p", True, policy_decisions.SERIES_TTL_S)
    assert _series(metrics) == []
    metrics.count_workflow("ns", "w", "uid-w", [("search", "started")], 30)
    metrics.count_workflow(
        "ns", "w", "uid-w", [("search", "succeeded"), ("profiling", "started")], 5
    )
    text = "\n".join(_series(metrics))
    assert (
        'compass_workflow_searches_total{namespace="ns",result="started",workflow="w"} 1.0' in text
    )
    assert 'compass_workflow_samples_evaluated_total{namespace="ns",workflow="w"} 35.0' in text
    metrics.forget_workflow("ns", "w", "uid-w")
    metrics.count_workflow("ns", "w", "uid-w", [("profiling", "failed")], 1)
    assert _series(metrics) == []


def test_the_deleted_uids_remembered_are_the_last_ones_and_a_repeat_counts_as_new() -> None:
    """Past GONE_REMEMBERED deletes the oldest uid is forgotten (its memory stays bounded); one
    deleted again is remembered from its latest delete, not evicted for its first."""
    gone = RecentUids(3)
    for uid in ("a", "b", "c", "a", "d"):
        gone.add(uid)
    assert ("a" in gone, "b" in gone, "c" in gone, "d" in gone) == (True, False, True, True)
    assert len(gone) == 3

    metrics = OperatorMetrics()
    full = policy_status.policy_gauges(
        PLAN, PolicyState(active=FAST_NAME), Observation(NOW, 1), _conditions("True"), False
    )
    metrics.forget_policy("ns", "p", "uid-p")
    metrics.set_policy("ns", "p", "uid-p", full)  # a tick in flight at the delete
    assert _series(metrics) == []
    for k in range(GONE_REMEMBERED - 1):
        metrics.forget_workflow("other", f"w{k}", f"uid-w{k}")
    metrics.set_policy("ns", "p", "uid-p", full)
    assert _series(metrics) == []  # still among the last GONE_REMEMBERED
    metrics.forget_workflow("other", "last", "uid-last")
    metrics.set_policy("ns", "p", "uid-p", full)
    assert _series(metrics) != []  # forgotten: a uid that came back long after is served


def test_a_policy_no_longer_ticked_here_loses_its_gauges_and_keeps_its_counters() -> None:
    """A replica that peering paused, or that the fence holds, stops exporting its last view of
    a policy (its Ready, at-fastest, pressure would alert beside the acting replica's) once
    SERIES_TTL_S passes without a tick; while ticking (every second) nothing lapses."""
    now = [1000.0]
    metrics = OperatorMetrics(clock=lambda: now[0])
    full = policy_status.policy_gauges(
        PLAN, PolicyState(active=FAST_NAME), Observation(NOW, 1), _conditions("True"), False
    )
    for key in ("p", "q"):
        metrics.touch_policy("ns", key, policy_decisions.SERIES_TTL_S)
        metrics.set_policy("ns", key, f"uid-{key}", full)
        metrics.set_fenced("ns", key, f"uid-{key}", False, policy_decisions.SERIES_TTL_S)
    metrics.switches.labels("ns", "p", "faster").inc()
    ticked = len(_series(metrics))
    for _ in range(int(policy_decisions.SERIES_TTL_S) + 5):  # "q" ticks every second; "p" is fenced
        now[0] += 1.0
        metrics.touch_policy("ns", "q", policy_decisions.SERIES_TTL_S)
        metrics.set_fenced("ns", "p", "uid-p", True, policy_decisions.SERIES_TTL_S)
        metrics.set_fenced("ns", "q", "uid-q", False, policy_decisions.SERIES_TTL_S)
    text = "\n".join(_series(metrics))
    assert 'compass_policy_ready{namespace="ns",policy="q"} 1.0' in text
    assert 'compass_policy_ready{namespace="ns",policy="p"}' not in text
    assert 'compass_active_configuration_info{index="0"' in text  # q's only
    assert text.count("compass_active_configuration_info{") == 1
    # What the fenced replica still knows: that it is fenced, and what it switched.
    assert 'compass_policy_fenced{namespace="ns",policy="p"} 1.0' in text
    assert 'compass_switches_total{direction="faster",namespace="ns",policy="p"} 1.0' in text
    assert len(_series(metrics)) == ticked - 11  # p's ten gauges and its info series
    # Peering paused the whole process: nothing ticks, every gauge goes, the counters stay.
    now[0] += policy_decisions.SERIES_TTL_S + 1
    assert [s.split("{")[0] for s in _series(metrics)] == [
        "compass_switches_total",
        "compass_switches_created",
    ]


def test_build_info_names_the_version() -> None:
    text = generate_latest(OperatorMetrics().registry).decode()
    assert 'compass_build_info{kopf="1.45.2",python="' in text
    assert 'version="0.1.0"} 1.0' in text


def test_timer_successes_are_not_logged_every_second() -> None:
    def record(level: int, message: str) -> logging.LogRecord:
        return logging.LogRecord("kopf.objects", level, __file__, 1, message, None, None)

    assert not _quiet_timer_successes(record(logging.INFO, "Timer 'elastico' succeeded."))
    assert _quiet_timer_successes(record(logging.ERROR, "Timer 'elastico' failed temporarily"))
    assert _quiet_timer_successes(record(logging.INFO, "ConfigurationSwitched: a -> b"))
    forget = "Handler 'forget-policy-series' succeeded."
    assert not _quiet_timer_successes(record(logging.INFO, forget))
    assert _quiet_timer_successes(record(logging.INFO, "Handler 'start_generation' succeeded."))


def test_the_active_configuration_is_rounded_for_kubectl() -> None:
    """Printer columns print every digit: the status shows 4-digit accuracy, 0.1 ms latency."""
    front = spec()["front"]
    front[0] = {**front[0], "accuracy": 0.8482380950450897, "latencyP95Ms": 34.08395180167645}
    plan = policy_compile.compile_policy(spec(front=front), generation=1).plan
    active = policy_status.active_configuration(plan, plan.names[0])
    assert active is not None
    assert (active.accuracy, active.latency_p95_ms, active.latency_mean_ms) == (0.8482, 34.1, 20.0)


def test_the_strategy_picks_the_policy_and_the_status_shows_the_blend() -> None:
    assert not isinstance(policy_compile.compile_policy(spec(), generation=1).policy, Split)
    compiled = policy_compile.compile_policy(spec(strategy="split"), generation=1)
    assert isinstance(compiled.policy, Split)
    plan = compiled.plan
    active = policy_status.active_configuration(plan, plan.names[0], plan.names[1], 0.35)
    assert active is not None
    assert active.blend is not None
    assert (active.blend.name, active.blend.index, active.blend.weight) == (plan.names[1], 1, 0.35)
    status = active.model_dump(by_alias=True, mode="json")
    assert status["blend"] == {"name": plan.names[1], "index": 1, "weight": 0.35}
    # No blend, an unknown blend or a weight of 0: the member alone.
    for blend, weight in ((None, 0.0), ("gone", 0.5), (plan.names[1], 0.0)):
        alone = policy_status.active_configuration(plan, plan.names[0], blend, weight)
        assert alone is not None
        assert alone.blend is None
    assert isinstance(
        policy_compile.compile_policy(spec(strategy="predictive"), generation=1).policy, Predictive
    )
    with pytest.raises(policy_compile.SpecError, match="strategy"):
        policy_compile.compile_policy(spec(strategy="random"), generation=1)


def test_the_admission_table_carries_degrade_after_and_refuse() -> None:
    admission = {"enabled": True, "degradeAfter": 0.5}
    compiled = policy_compile.compile_policy(spec(admission=admission), generation=1)
    table = compiled.admission
    assert table is not None
    assert table["degrade_below_ms"] == pytest.approx(compiled.spec.slo.latency_ms * 0.5)
    assert table["refuse"] is True
    keeping = policy_compile.compile_policy(
        spec(admission={**admission, "refuse": False}), generation=1
    )
    assert keeping.admission is not None
    assert keeping.admission["refuse"] is False
    with pytest.raises(policy_compile.SpecError, match="degradeAfter"):
        policy_compile.compile_policy(
            spec(admission={"enabled": True, "degradeAfter": 0}), generation=1
        )


# ---------------------------------------------------------------------------- pods


def test_routing_status_counts_serving_pods_and_names_the_lagging_ones() -> None:
    key = config_key(FAST)
    pods = [("a", key, None), ("b", "other", None), ("c", None, "unreachable: refused")]
    status = policy_conditions.routing_status(pods, key)
    assert (status.pods, status.serving) == (3, 1)
    assert [(p.name, p.reason) for p in status.lagging] == [
        ("b", "serves other"),
        ("c", "unreachable: refused"),
    ]
    many = policy_conditions.routing_status([(f"p{i}", None, "down") for i in range(50)], key)
    assert (many.pods, many.serving, len(many.lagging)) == (50, 0, 20)


def test_pods_condition_and_events_name_the_lagging_pod() -> None:
    key = config_key(FAST)
    serving = policy_conditions.Health(
        active=FAST_NAME, routing=policy_conditions.routing_status([("a", key, None)] * 2, key)
    )
    lagging = policy_conditions.Health(
        active=FAST_NAME,
        routing=policy_conditions.routing_status([("a", key, None), ("b", None, "down")], key),
    )
    all_ok = policy_conditions.merge_conditions(
        [], policy_conditions.health_conditions(serving), ISO, 1
    )
    one_down = policy_conditions.merge_conditions(
        all_ok, policy_conditions.health_conditions(lagging), ISO, 1
    )
    pods = {c["type"]: c for c in one_down}["PodsServing"]
    assert (pods["status"], pods["reason"]) == ("False", "PodsLagging")
    assert "1/2 pods serve" in pods["message"]
    assert "b (down)" in pods["message"]
    events = policy_conditions.transition_events(all_ok, one_down)
    assert [(e.type, e.reason) for e in events] == [("Warning", "PodsLagging")]
    assert "b (down)" in events[0].message
    assert (
        policy_conditions.transition_events(one_down, one_down) == []
    )  # the same pods lagging: quiet
    back = policy_conditions.merge_conditions(
        one_down, policy_conditions.health_conditions(serving), ISO, 1
    )
    assert [e.reason for e in policy_conditions.transition_events(one_down, back)] == [
        "PodsServing"
    ]
    # A single Triton (no fleet) reports no PodsServing condition at all.
    assert "PodsServing" not in {
        c.type for c in policy_conditions.health_conditions(policy_conditions.Health(active="x"))
    }


def test_a_switch_event_names_the_mix() -> None:
    before = PolicyState(active="a", blend="b", weight=0.25)
    after = PolicyState(active="a", blend="b", weight=0.4)
    event = policy_conditions.switch_event(
        policy_decisions.routing_label(before),
        policy_decisions.routing_label(after) or "",
        2,
        "why",
    )
    assert event.message == "a + 25% b -> a + 40% b: queue 2; why"
    assert policy_decisions.routing_label(PolicyState(active="a")) == "a"


ANNOTATION = "compass.io/paused"


@pytest.mark.parametrize(
    ("paused", "annotations", "expected"),
    [
        (False, None, (False, "Active")),
        (False, {}, (False, "Active")),
        (False, {ANNOTATION: "false"}, (False, "Active")),
        (False, {ANNOTATION: "true"}, (True, "PausedByAnnotation")),
        (True, {ANNOTATION: "false"}, (True, "PausedBySpec")),
        (True, {ANNOTATION: "true"}, (True, "PausedBySpec")),
        (False, {ANNOTATION: "yes"}, (False, "InvalidPauseAnnotation")),
        (True, {ANNOTATION: "yes"}, (True, "PausedBySpec")),
        (False, {"other.io/paused": "true"}, (False, "Active")),
    ],
)
def test_pause_by_spec_or_annotation(
    paused: bool, annotations: dict[str, str] | None, expected: tuple[bool, str]
) -> None:
    pause = policy_decisions.pause_of(
        COMPILED.spec.model_copy(update={"paused": paused}), annotations
    )
    assert (pause.paused, pause.reason) == expected


def test_an_invalid_pause_annotation_pauses_nothing_and_says_what_to_write() -> None:
    pause = policy_decisions.pause_of(COMPILED.spec, {ANNOTATION: "True "})
    assert not pause.paused
    assert pause.message == (
        "annotation compass.io/paused: 'True ' is not one of 'true', 'false'; the policy is not "
        "paused"
    )
    before = conditions_of(policy_conditions.Health(metrics_read=True, active=FAST_NAME))
    after = conditions_of(
        policy_conditions.Health(metrics_read=True, active=FAST_NAME, pause=pause), before
    )
    condition = by_type(after)["Paused"]
    assert (condition["status"], condition["reason"]) == ("False", "InvalidPauseAnnotation")
    assert condition["message"] == pause.message
    assert by_type(after)["Ready"]["reason"] == "Serving"
    events = policy_conditions.transition_events(before, after)
    assert [(e.type, e.reason, e.message) for e in events] == [
        ("Warning", "InvalidPauseAnnotation", pause.message)
    ]
    assert (
        policy_conditions.transition_events(
            after, conditions_of(policy_conditions.Health(pause=pause), after)
        )
        == []
    )


def test_a_pause_annotation_holds_like_spec_paused() -> None:
    pause = policy_decisions.pause_of(COMPILED.spec, {ANNOTATION: "true"})
    paused = by_type(
        conditions_of(policy_conditions.Health(metrics_read=True, pause=pause, active=FAST_NAME))
    )
    assert (paused["Paused"]["status"], paused["Paused"]["reason"]) == (
        "True",
        "PausedByAnnotation",
    )
    assert paused["Paused"]["message"] == f"annotation {ANNOTATION}: holding {FAST_NAME}"
    assert paused["Ready"]["reason"] == "Paused"


# ---------------------------------------------------------------------------- status is output


@pytest.mark.parametrize(
    "tamper",
    [
        {"last_switch_at": "yesterday"},
        {"last_switch_at": 1e300},
        {"last_switch_at": float("nan")},
        {"active_since": -5.0},
        {"switches": "many"},
        {"switches": True},
        {"weight": 7.0},
        {"active": ["fast"]},
        {"arrivals": [[NOW, "ten"]]},
        {"arrivals": [[NOW, -1.0]]},
        {"entry_levels": [[NOW, 3]]},
        {"entry_levels": "x"},
        {"last_reason": {"a": 1}},
    ],
)
def test_a_tampered_saved_state_is_discarded_on_read(
    tamper: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """status.policyState edited by hand (a string, a huge number) once made every tick after a
    restart raise TypeError, the status frozen at Ready=True: it is read as no state (the policy
    starts afresh from what the routers serve), with a log line naming the field."""
    saved = pending().to_dict() | tamper
    with pytest.raises(ValueError, match=next(iter(tamper))):
        PolicyState.from_dict(saved)
    with caplog.at_level(logging.WARNING):
        assert policy_decisions.saved_state({"policyState": saved}) is None
    assert "starting afresh" in caplog.text
    # The policy then decides from what the router serves.
    state, _ = policy_decisions.align_state(None, None, config_key(FAST), PLAN, NOW, 5.0)
    assert state.active == FAST_NAME


def test_a_saved_state_the_operator_wrote_reads_back() -> None:
    status = policy_status.build_status(PLAN, pending(), None, {}, "hold", [], 1)
    assert policy_decisions.saved_state(status) == pending()
    assert policy_decisions.saved_state({}) is None
    assert policy_decisions.saved_state({"policyState": "x"}) is None


def test_an_edited_status_active_is_overwritten_with_the_policys_own() -> None:
    """status.active edited by someone else is not what the operator last wrote: the next write
    puts back what the policy's state (aligned with the routers) says, not only on a switch."""
    written = policy_status.build_status(PLAN, pending(), None, {}, "hold", [], 1)
    live = copy.deepcopy(written)
    live["active"] = {**live["active"], "name": "forged", "accuracy": 1.0}
    live["switches"] = 999
    again = policy_status.build_status(PLAN, pending(), None, written, "hold", [], 1)
    patch = policy_status.status_patch(written, again, NOW, NOW, live=live)
    assert patch["active"]["name"] == written["active"]["name"]
    assert patch["active"]["accuracy"] == written["active"]["accuracy"]
    assert patch["switches"] == written["switches"]
    # Nothing edited: nothing to write within the heartbeat.
    assert policy_status.status_patch(written, again, NOW, NOW, live=written) == {}


def test_a_body_seen_a_write_late_is_no_edit_and_writes_nothing() -> None:
    """The timer may see the object as it was before its own last write (the watch lags, most
    under load): that is no edit by someone else, so nothing is written within the heartbeat;
    a value the operator never wrote still is put back."""
    before = policy_status.build_status(PLAN, pending(), None, {}, "hold", [], 1)
    switched = dataclasses.replace(pending(), switches=pending().switches + 1)
    written = policy_status.build_status(PLAN, switched, None, before, "hold", [], 1)
    again = policy_status.build_status(PLAN, switched, None, written, "hold", [], 1)
    recent = [policy_status.owned_fields(before)]
    assert policy_status.status_patch(written, again, NOW, NOW, live=before, recent=recent) == {}
    # Without the earlier write remembered, the late body reads as an edit and is rewritten.
    assert policy_status.status_patch(written, again, NOW, NOW, live=before) != {}
    forged = {**before, "switches": 999}
    patch = policy_status.status_patch(written, again, NOW, NOW, live=forged, recent=recent)
    assert patch == {"switches": written["switches"]}


# ---------------------------------------------------------------------------- status size

# The API server refuses a request over 1.5 MiB (etcd's limit): a status must stay well under.
REQUEST_LIMIT = 3 * 1024 * 1024 // 2


def _status_size(plan: Any, state: PolicyState) -> int:
    status = policy_status.build_status(plan, state, None, {}, "hold " * 10_000, [], 1)
    return len(json.dumps(status))


def test_front_entries_with_huge_config_values_make_a_small_status_that_round_trips() -> None:
    """Issue 46: two entries with a 300 KB config value each made a 3.3 MB status, and every
    status write failed. The status shows names and values cut; the state still resumes."""
    huge = {"prompt": "p" * 300_000, "retriever_k": 20}
    other = {"prompt": "q" * 300_000, "retriever_k": 20}
    front = [
        {"config": huge, "accuracy": 0.83, "latencyMeanMs": 20, "latencyP95Ms": 23},
        {"config": other, "accuracy": 0.86, "latencyMeanMs": 33, "latencyP95Ms": 37},
    ]
    plan = policy_compile.compile_policy(spec(front=front), generation=1).plan
    fast, accurate = plan.names
    state = replace(pending(fast), blend=accurate, weight=0.25, entry_levels=((NOW - 1, accurate),))
    status = policy_status.build_status(plan, state, None, {}, "hold", [], 1)
    assert _status_size(plan, state) < 64 * 1024
    assert status["active"]["config"]["retriever_k"] == 20
    assert status["active"]["name"] != status["active"]["blend"]["name"]  # still told apart
    assert status["thresholds"][0]["config"] != status["thresholds"][1]["config"]
    ParetoPolicyStatus.model_validate(status)
    restored = PolicyState.from_dict(status["policyState"])
    key = policy_decisions.state_routing_key(plan, state)
    assert key is not None
    resumed, note = policy_decisions.align_state(restored, NOW - 1, key, plan, NOW, 5.0)
    assert (resumed, note) == (state, None)


def test_the_largest_spec_the_schema_allows_makes_a_status_well_under_the_request_limit() -> None:
    """MAX_FRONT entries of MAX_PARAMETERS parameters, the spec at the request limit: every
    entry on the front (faster is less accurate), so every one has its threshold status."""
    from compass.api.paretopolicy import MAX_FRONT
    from compass.domain.space import MAX_PARAMETERS

    # Each value as long as the request limit leaves it, with the entry's other fields.
    value_chars = (REQUEST_LIMIT // MAX_FRONT - 250) // MAX_PARAMETERS - 13
    front = [
        {
            "config": {
                f"p{param:02d}": f"{entry:04d}{'v' * value_chars}"
                for param in range(MAX_PARAMETERS)
            },
            "accuracy": 0.5 + entry / (4 * MAX_FRONT),
            "latencyMeanMs": 10 + entry * 0.1,
            "latencyP95Ms": 12 + entry * 0.1,
        }
        for entry in range(MAX_FRONT)
    ]
    size = len(json.dumps(spec(front=front)))
    assert 0.9 * REQUEST_LIMIT < size < REQUEST_LIMIT, size
    plan = policy_compile.compile_policy(spec(front=front), generation=1).plan
    assert len(plan.thresholds) == MAX_FRONT
    names = plan.names
    state = replace(
        pending(names[-1]),
        blend=names[-2],
        weight=0.5,
        entry_levels=tuple((NOW - i, n) for i, n in enumerate(names)),
    )
    size = _status_size(plan, state)
    assert size < REQUEST_LIMIT / 3, size


def test_a_status_refused_for_its_size_is_replaced_by_a_small_one_with_a_condition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """etcd's 500 "request is too large": the policy still shows Ready False, StatusTooLarge."""

    from compass.controllers import policy_publish

    sent: list[dict[str, Any]] = []

    class Custom:
        def patch_namespaced_custom_object_status(self, *args: Any, **_: Any) -> Any:
            body = args[-1]
            sent.append(body)
            if len(sent) == 1:
                error = ApiException(status=500, reason="Internal Server Error")
                error.body = json.dumps({"message": "etcdserver: request is too large"})
                raise error
            return SimpleNamespace(status=200, data=b"{}")

    monkeypatch.setattr(policy_publish.client, "CustomObjectsApi", lambda *_: Custom())
    runtime = SimpleNamespace(api=lambda: None, metrics=mock.MagicMock())
    body = {"metadata": {"name": "p", "namespace": "ml", "generation": 4}}
    metrics = {"type": "MetricsAvailable", "status": "True", "reason": "Fresh", "message": ""}
    written = policy_publish._write_status(
        runtime,  # type: ignore[arg-type]
        body,  # type: ignore[arg-type]
        {"thresholds": ["x" * 100]},
        logging.getLogger("test"),
        [metrics],
        NOW,
    )
    assert written is False  # the whole status was not written: compared afresh next time
    assert len(sent) == 2
    small = sent[1]["status"]
    assert small["thresholds"] is None
    assert small["policyState"] is None
    ready = small["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "StatusTooLarge")
    assert small["conditions"][1] == metrics
    assert small["observedGeneration"] == 4
    assert len(json.dumps(small)) < 2048


@pytest.mark.parametrize(
    ("status", "message", "expected"),
    [
        (413, "", True),
        (500, "etcdserver: request is too large", True),
        (422, "status: Too long: must have at most 1572864 bytes", True),
        (500, "connection refused", False),
        (422, "spec.front: Invalid value", False),
        (403, "too large", False),
    ],
)
def test_too_large_tells_a_size_refusal_from_other_failures(
    status: int, message: str, expected: bool
) -> None:
    assert policy_status.too_large(status, message) is expected


def test_gauges_set_again_unchanged_come_back_after_their_series_went() -> None:
    """set_policy skips gauges the series already show, never ones that changed or whose
    series were removed meanwhile (expired, or the policy deleted and created again)."""
    now = [1000.0]
    metrics = OperatorMetrics(clock=lambda: now[0])
    full = policy_status.policy_gauges(
        PLAN, PolicyState(active=FAST_NAME), Observation(NOW, 1), _conditions("True"), False
    )
    metrics.touch_policy("ns", "p", policy_decisions.SERIES_TTL_S)
    metrics.set_policy("ns", "p", "uid-p", full)
    shown = _series(metrics)
    metrics.set_policy("ns", "p", "uid-p", full)
    assert _series(metrics) == shown
    metrics.set_policy("ns", "p", "uid-p", replace(full, queue_depth=7.0))
    assert 'compass_queue_depth{namespace="ns",policy="p"} 7.0' in _series(metrics)
    now[0] += policy_decisions.SERIES_TTL_S + 1
    metrics.expire()
    assert _series(metrics) == []
    metrics.touch_policy("ns", "p", policy_decisions.SERIES_TTL_S)
    metrics.set_policy("ns", "p", "uid-p", replace(full, queue_depth=7.0))
    assert 'compass_queue_depth{namespace="ns",policy="p"} 7.0' in _series(metrics)
    metrics.forget_policy("ns", "p", "uid-p")
    metrics.set_policy("ns", "p", "uid-p2", replace(full, queue_depth=7.0))  # created again
    assert len(_series(metrics)) == len(shown)
