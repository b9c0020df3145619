"""The ParetoPolicy controller end to end: a real API server, the `compass operator` process, and a
real tritonserver serving rag-sim at a tenth of its measured latencies.

The operator reads the router's queue from Triton's own /metrics (no Prometheus needed) and
switches the router over gRPC; every assertion checks the real router too, not just the status.
One operator process serves the module (it watches one namespace); the restart test restarts it.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from cluster import free_port, wait_for
from e2e_shared import (
    ACCURATE_NAME,
    FAST_NAME,
    Policies,
    condition,
    policy_spec,
    wait_active,
)
from kubernetes.client.exceptions import ApiException
from operator_process import Operator

from compass.api.meta import GROUP, POLICY_PLURAL, VERSION
from compass.controllers import kubeapi
from compass.controllers.policy_compile import compile_policy
from compass.dataplane.load import run_load
from compass.dataplane.triton import LATE_MESSAGE, RoutingError, TritonRouter
from compass.domain.binding import RAG_SIM_COMPONENTS, RAG_SIM_STAGE_PARAMS
from compass.domain.space import config_key
from compass_dev.local_triton import LocalPrometheus, LocalTriton
from compass_dev.processes import QuietHandler, serve_http
from compass_dev.scenarios import ACCURATE, FASTEST
from tiers import require_prometheus

REPO = Path(__file__).resolve().parents[2]
# More than either configuration can serve: the queue builds on both, faster on ACCURATE.
LOAD_QPS, LOAD_S = 55.0, 3.0


# ---------------------------------------------------------------------------- helpers


def _load(triton: LocalTriton) -> None:
    """LOAD_QPS requests a second for LOAD_S seconds, evenly spaced, every one answered."""
    arrivals = [i / LOAD_QPS for i in range(int(LOAD_QPS * LOAD_S))]
    records = run_load(triton.grpc_url, arrivals, lambda i: {"sample": i % 100})
    assert not [r.error for r in records if r.error]


# ---------------------------------------------------------------------------- tests


def test_switches_to_the_fastest_under_load_and_back_after_the_cooldown(
    triton: LocalTriton, router: TritonRouter, policies: Policies, operator: Operator
) -> None:
    policies.create("rag", policy_spec(triton))
    # Idle: the policy starts from what the router serves (FASTEST) and climbs to ACCURATE once
    # the queue has stayed empty for the 2 s cooldown.
    status = wait_active(policies, "rag", router, ACCURATE, 20)
    assert status["active"]["name"] == ACCURATE_NAME
    assert status["active"]["index"] == 1
    assert condition(status, "Ready")["status"] == "True"
    assert condition(status, "MetricsAvailable")["status"] == "True"
    assert [t["config"] for t in status["thresholds"]] == [FAST_NAME, ACCURATE_NAME]

    # Load beyond both configurations' capacity: the queue builds, the policy (and the router)
    # go to FASTEST within a decision or two.
    loader = threading.Thread(target=_load, args=(triton,))
    loader.start()
    try:
        during = wait_active(policies, "rag", router, FASTEST, LOAD_S + 5)
    finally:
        loader.join()
    assert during["active"]["name"] == FAST_NAME
    assert "over" in during["lastSwitchReason"], during["lastSwitchReason"]
    switched = [e["message"] for e in policies.wait_events("rag", "ConfigurationSwitched", 2)]
    assert any(m.startswith(f"{ACCURATE_NAME} -> {FAST_NAME}: queue ") for m in switched), switched

    # The load is over: the queue drains, and after the cooldown the policy climbs back.
    final = wait_active(policies, "rag", router, ACCURATE, 15)
    assert final["active"]["name"] == ACCURATE_NAME
    assert final["switches"] >= 3
    assert final["policyState"]["active"] == ACCURATE_NAME
    metrics = operator.metrics()
    assert "compass_switches_total{" in metrics
    assert (
        f'compass_active_configuration_index{{namespace="{policies.namespace}",policy="rag"}} 1.0'
        in metrics
    )


def test_an_advisory_policy_publishes_what_it_would_switch_and_acts_once_made_active(
    triton: LocalTriton, router: TritonRouter, policies: Policies, operator: Operator
) -> None:
    """spec.mode advisory: through idle and a load spike the policy decides, and says so in its
    status, its Events (WouldSwitch) and its metrics, while the router is never switched; made
    active, the router takes the policy's configuration at the next decision, no restart."""
    router.switch(FASTEST)
    policies.create("advice", policy_spec(triton, mode="advisory"))

    def status_shows(config: dict[str, Any]) -> dict[str, Any] | None:
        status = policies.status("advice")
        active = (status.get("active") or {}).get("config")
        return status if active is not None and config_key(active) == config_key(config) else None

    # Idle: it would climb to ACCURATE; the router stays on FASTEST.
    idle = wait_for(lambda: status_shows(ACCURATE), 20, "the advice to climb to ACCURATE")
    ready = condition(idle, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Advisory")
    assert f"would serve {ACCURATE_NAME}, the routers serve {FAST_NAME}" in ready["message"]
    assert router.active_config() == config_key(FASTEST)
    # A spike: it would go to FASTEST; still nothing switched.
    loader = threading.Thread(target=_load, args=(triton,))
    loader.start()
    try:
        wait_for(lambda: status_shows(FASTEST), LOAD_S + 5, "the advice to go to FASTEST", 0.1)
    finally:
        loader.join()
    would = [e["message"] for e in policies.wait_events("advice", "WouldSwitch", 2)]
    assert any(m.startswith(f"{FAST_NAME} -> {ACCURATE_NAME}: ") for m in would), would
    assert any(m.startswith(f"{ACCURATE_NAME} -> {FAST_NAME}: queue ") for m in would), would
    assert router.active_config() == config_key(FASTEST)
    labels = f'namespace="{policies.namespace}",policy="advice"'
    counted = [
        line
        for line in operator.metrics().splitlines()
        if line.startswith("compass_advisory_switches_total{") and labels in line
    ]
    assert {line.split('direction="')[1].split('"')[0] for line in counted} >= {
        "more-accurate",
        "faster",
    }, counted
    assert "compass_switches_total" not in _policy_series(operator, policies.namespace, "advice")

    # After the spike it would climb again; made active, the router follows within a decision.
    wait_for(lambda: status_shows(ACCURATE), 15, "the advice to climb back")
    assert router.active_config() == config_key(FASTEST)
    policies.patch_spec("advice", {"mode": "active"})
    wait_active(policies, "advice", router, ACCURATE, 3)
    ready = condition(policies.status("advice"), "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Serving")


def _policy_series(operator: Operator, namespace: str, name: str) -> dict[str, str]:
    """The operator's /metrics lines of one policy, by metric name (and labels past them)."""
    labels = f'namespace="{namespace}",policy="{name}"'
    found = {}
    for line in operator.metrics().splitlines():
        if not line.startswith("#") and labels in line:
            series, _, value = line.rpartition(" ")
            # The info series by its whole label set, the others by their name.
            found[series if "_info{" in series else series.split("{", 1)[0]] = value
    return found


def test_policy_series_describe_it_and_go_when_it_is_deleted(
    triton: LocalTriton, router: TritonRouter, policies: Policies, operator: Operator
) -> None:
    """The per-policy series scraped from the operator's /metrics: the active entry by index and
    name, what it serves, its limits, Ready, paused, fresh metrics, not at the fastest, no
    pressure; all of them gone once the policy is deleted (no finalizer of ours holds it)."""
    policies.create("obs", policy_spec(triton))
    wait_active(policies, "obs", router, ACCURATE, 20)
    namespace = policies.namespace
    plan = compile_policy(policies.get("obs")["spec"], generation=None).plan
    accurate = plan.thresholds[1]

    def described() -> dict[str, str] | None:
        series = _policy_series(operator, namespace, "obs")
        info = [k for k in series if k.startswith("compass_active_configuration_info{")]
        return series if info and f'name="{ACCURATE_NAME}"' in info[0] else None

    series = wait_for(described, 10, "the series of the accurate entry")
    [info] = [k for k in series if k.startswith("compass_active_configuration_info{")]
    assert f'index="1",name="{ACCURATE_NAME}"' in info
    assert series[info] == "1.0"
    assert len([k for k in series if k.startswith("compass_active_configuration_info")]) == 1
    assert series["compass_policy_ready"] == "1.0"
    assert series["compass_policy_paused"] == "0.0"
    assert series["compass_policy_metrics_available"] == "1.0"
    assert series["compass_policy_at_fastest"] == "0.0"
    assert series["compass_capacity_pressure"] == "0.0"
    assert float(series["compass_served_accuracy"]) == pytest.approx(0.8604)
    assert float(series["compass_stay_queue_threshold"]) == accurate.stay_max_queue
    assert float(series["compass_enter_queue_threshold"]) == accurate.enter_max_queue
    assert series["compass_active_configuration_index"] == "1.0"
    assert "compass_build_info{" in operator.metrics()

    where = (GROUP, VERSION, namespace, POLICY_PLURAL)
    kubeapi.delete(policies.api.delete_namespaced_custom_object, *where, "obs")
    wait_for(
        lambda: not _policy_series(operator, namespace, "obs"), 30, "the policy's series to go"
    )
    assert kubeapi.read(policies.api.get_namespaced_custom_object, *where, "obs") is None


def test_paused_policy_holds_and_resumes_when_unpaused(
    triton: LocalTriton, router: TritonRouter, policies: Policies
) -> None:
    policies.create("paused", policy_spec(triton, paused=True))
    wait_for(
        lambda: condition(policies.status("paused"), "Paused").get("status") == "True", 15, "Paused"
    )
    time.sleep(3.5)  # well past the 2 s cooldown: an active policy would have climbed
    status = policies.status("paused")
    assert router.active_config() == config_key(FASTEST)
    assert status["switches"] == 0
    assert status["active"]["name"] == FAST_NAME
    assert condition(status, "Ready")["reason"] == "Paused"
    assert not policies.events("paused", "ConfigurationSwitched")

    policies.patch_spec("paused", {"paused": False})
    wait_for(
        lambda: router.active_config() == config_key(ACCURATE), 15, "the climb after unpausing"
    )
    assert condition(policies.status("paused"), "Paused")["status"] == "False"


def test_admission_reaches_the_router_and_goes_when_turned_off(
    triton: LocalTriton, router: TritonRouter, policies: Policies
) -> None:
    """spec.admission.enabled: the operator sends the table with its switches; a request whose
    deadline passed is refused as late, one with time to spare is served as routed; off again,
    the next tick removes the table and nothing is refused."""
    policies.create("admitting", policy_spec(triton, admission={"enabled": True}))
    wait_active(policies, "admitting", router, ACCURATE, 20)

    def late() -> str | None:
        try:
            router.infer({"sample": 0}, deadline_ns=time.time_ns() - 10**9)
        except RoutingError as error:
            return str(error)
        return None

    refusal = wait_for(late, 10, "a late request to be refused")
    assert LATE_MESSAGE in refusal
    spared = router.infer({"sample": 1}, deadline_ns=time.time_ns() + 10 * 10**9)
    assert spared.config == config_key(ACCURATE)

    policies.patch_spec("admitting", {"admission": {"enabled": False}})
    wait_for(lambda: late() is None, 10, "admission to be turned off")
    assert router.active_config() == config_key(ACCURATE)


def test_late_binding_reaches_the_router_and_goes_when_turned_off(
    triton: LocalTriton, router: TritonRouter, policies: Policies
) -> None:
    """spec.binding per-stage: the operator compiles the per-stage table from the front and
    sends it with its switches; the router then binds each request that carries a deadline on
    its own time left (ACCURATE where it fits, FASTEST where it does not) whatever is routed.
    Back to binding mode workflow, the next tick takes the table back: served as routed."""
    stages = [
        {"component": model, "parameters": list(names)}
        for model, names in zip(RAG_SIM_COMPONENTS, RAG_SIM_STAGE_PARAMS, strict=True)
    ]
    # Admission off: a request that nothing brings in time is served on the fastest, not refused.
    spec = policy_spec(
        triton, binding={"mode": "per-stage", "stages": stages}, admission={"enabled": False}
    )
    policies.create("binding", spec)
    # At idle the policy climbs to ACCURATE: the routed configuration a tight request leaves.
    wait_active(policies, "binding", router, ACCURATE, 20)
    # This router has no gate: the status says it binds only what carries a deadline.
    condition = wait_for(
        lambda: _condition(policies, "binding", "PerRequestBinding"), 10, "PerRequestBinding"
    )
    assert (condition["status"], condition["reason"]) == ("False", "RoutersNotGated")

    def tight() -> str:
        # 5 ms left: ACCURATE (about 37 ms) cannot fit; the fastest completion serves it.
        return router.infer({"sample": 0}, deadline_ns=time.time_ns() + 5 * 10**6).config

    wait_for(lambda: tight() == config_key(FASTEST), 10, "a tight request to bind FASTEST")
    roomy = router.infer({"sample": 1}, deadline_ns=time.time_ns() + 10 * 10**9)
    assert roomy.config == config_key(ACCURATE)
    # Without a deadline (and no gate in front of this router) it is served as routed.
    assert router.infer({"sample": 2}).config == config_key(ACCURATE)

    # What the router served, from its own counters: in the status (refreshed every 10 s)
    # and in `kubectl get pp`'s Served column.
    def served() -> dict[str, Any] | None:
        shown = policies.status("binding").get("served") or {}
        names = {c["name"] for c in shown.get("configurations", [])}
        return shown if {FAST_NAME, ACCURATE_NAME} <= names else None

    shown = wait_for(served, 30, "status.served to show what binding served")
    accuracies = {c["name"]: c["accuracy"] for c in shown["configurations"]}
    assert shown["requests"] >= 3
    assert shown["refused"] == 0
    assert accuracies[FAST_NAME] < shown["accuracy"] < accuracies[ACCURATE_NAME]
    assert sum(c["share"] for c in shown["configurations"]) == pytest.approx(1.0, abs=0.01)
    row = _table_row(policies, "binding")
    assert row["Served"] == pytest.approx(shown["accuracy"])

    policies.patch_spec("binding", {"binding": {"mode": "workflow", "stages": []}})
    wait_for(lambda: tight() == config_key(ACCURATE), 10, "the table to be taken back")
    assert router.active_config() == config_key(ACCURATE)
    whole = wait_for(
        lambda: (
            (c := _condition(policies, "binding", "PerRequestBinding"))
            and c["reason"] == "WholeWorkflow"
            and c
        ),
        10,
        "PerRequestBinding to say the whole workflow is switched",
    )
    assert whole["status"] == "False"


def _condition(policies: Policies, name: str, kind: str) -> dict[str, Any] | None:
    """The policy's condition of this type (None: not reported yet)."""
    conditions = policies.status(name).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


def _table_row(policies: Policies, name: str) -> dict[str, Any]:
    """The policy's row as `kubectl get pp` shows it (the API server's Table, from the CRD's
    printer columns), by column name."""
    api = policies.api.api_client
    method, url, headers, body, _ = api.param_serialize(
        "GET",
        f"/apis/{GROUP}/{VERSION}/namespaces/{policies.namespace}/{POLICY_PLURAL}/{name}",
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        auth_settings=["BearerToken"],
    )
    answer = api.call_api(method, url, header_params=headers, body=body)
    answer.read()
    table = json.loads(answer.data)
    columns = [c["name"] for c in table["columnDefinitions"]]
    return dict(zip(columns, table["rows"][0]["cells"], strict=True))


def test_pause_annotation_holds_and_an_invalid_one_pauses_nothing(
    triton: LocalTriton, router: TritonRouter, policies: Policies, operator: Operator
) -> None:
    """compass.io/paused: "true" holds a policy whose spec says nothing of pausing (a spec that
    GitOps owns is not touched), and its paused gauge says so; a value other than true/false is
    reported and pauses nothing."""
    policies.create("held", policy_spec(triton), annotations={"compass.io/paused": "true"})
    wait_for(
        lambda: condition(policies.status("held"), "Paused").get("status") == "True", 15, "Paused"
    )
    time.sleep(3.5)  # well past the 2 s cooldown: an active policy would have climbed
    status = policies.status("held")
    assert router.active_config() == config_key(FASTEST)
    assert status["switches"] == 0
    paused = condition(status, "Paused")
    assert paused["reason"] == "PausedByAnnotation"
    assert paused["message"] == f"annotation compass.io/paused: holding {FAST_NAME}"
    assert _policy_series(operator, policies.namespace, "held")["compass_policy_paused"] == "1.0"

    policies.annotate("held", {"compass.io/paused": "maybe"})
    wait_for(lambda: router.active_config() == config_key(ACCURATE), 15, "the climb, not paused")
    paused = condition(policies.status("held"), "Paused")
    assert (paused["status"], paused["reason"]) == ("False", "InvalidPauseAnnotation")
    assert "'maybe' is not one of 'true', 'false'" in paused["message"]
    assert policies.wait_events("held", "InvalidPauseAnnotation")
    assert _policy_series(operator, policies.namespace, "held")["compass_policy_paused"] == "0.0"


def test_restart_resumes_the_hysteresis_state_and_never_flips(
    triton: LocalTriton, router: TritonRouter, policies: Policies, operator: Operator
) -> None:
    # Long enough for the restarted process to decide before it runs out (a restart took ~6 s
    # on a busy 2-core machine), so that decision shows the timer it resumed.
    cooldown = 20.0
    spec = policy_spec(
        triton,
        hysteresis={
            "downscaleCooldownSeconds": cooldown,
            "cooldownExponent": 0,
            "slackBufferMs": 20,
        },
        staleAfterSeconds=30,
    )
    policies.create("restart", spec)
    # The first idle decision starts the downscale evidence towards ACCURATE.
    since = wait_for(
        lambda: policies.status("restart").get("policyState", {}).get("downscale_since"),
        15,
        "the downscale evidence to start",
    )
    operator.stop()
    restarted_at = time.time()
    operator.start()
    # The new process's first decision resumes the evidence from the status: the timer still
    # runs from `since`, not from that decision (a fresh start would write its own time).
    resumed = wait_for(
        lambda: _observed_after(policies.status("restart"), restarted_at),
        30,
        "the first decision of the new operator",
    )["policyState"]
    assert (resumed["switches"], resumed["downscale_since"]) == (0, since), (
        "the new process did not resume the downscale timer (or decided only after the cooldown)",
        since,
        resumed,
        operator.tail(),
    )
    # And it switches on that evidence, once the cooldown since `since` has passed.
    state = wait_active(policies, "restart", router, ACCURATE, 30)["policyState"]
    assert state["switches"] == 1
    assert state["last_switch_at"] >= since + cooldown, (since, state)

    # Restarted while serving ACCURATE (not where a fresh policy starts): no flip.
    operator.stop()
    restarted_at = time.time()
    operator.start()
    wait_for(
        lambda: _observed_after(policies.status("restart"), restarted_at),
        30,
        "the first decision of the new operator",
    )
    time.sleep(2.2)  # two more decisions
    status = policies.status("restart")
    assert router.active_config() == config_key(ACCURATE)
    assert status["switches"] == 1
    assert status["active"]["name"] == ACCURATE_NAME
    assert len(policies.wait_events("restart", "ConfigurationSwitched")) == 1


def test_unreachable_triton_is_not_ready_and_switches_nothing(
    triton: LocalTriton, router: TritonRouter, policies: Policies
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    policies.create("unreachable", policy_spec(triton, routing={"grpcEndpoint": dead}))
    ready = wait_for(
        lambda: condition(policies.status("unreachable"), "Ready") or None, 15, "a Ready condition"
    )
    assert ready["status"] == "False"
    assert ready["reason"] == "TritonUnreachable"
    assert dead in ready["message"]
    assert condition(policies.status("unreachable"), "Degraded")["status"] == "True"
    time.sleep(3)  # past the cooldown: nothing may have been switched anywhere
    status = policies.status("unreachable")
    assert status.get("switches", 0) == 0
    assert router.active_config() == config_key(FASTEST)
    [event] = policies.wait_events("unreachable", "TritonUnreachable")  # once, not every retry
    assert dead in event["message"]


def test_spec_that_can_never_work_is_reported_with_the_field_and_the_fix(
    triton: LocalTriton, policies: Policies
) -> None:
    policies.create("impossible", policy_spec(triton, slo={"latencyMs": 10}))
    ready = wait_for(
        lambda: condition(policies.status("impossible"), "Ready") or None, 15, "a Ready condition"
    )
    assert ready["status"] == "False"
    assert ready["reason"] == "InvalidSpec"
    assert ready["message"].startswith("spec.slo.latencyMs: 10 ms is below every configuration")
    assert "raise the SLO above" in ready["message"]
    [event] = policies.wait_events("impossible", "InvalidSpec")
    assert event["type"] == "Warning"
    assert event["message"] == ready["message"]


def test_a_router_of_another_namespace_is_refused_naming_the_field(
    triton: LocalTriton, router: TritonRouter, policies: Policies
) -> None:
    """The operator's settings allow no other namespace: nothing is switched there, and the
    condition and the Event name the field."""
    routing = {"grpcEndpoint": "triton.payments.svc:8001", "routerModel": "router"}
    policies.create("elsewhere", policy_spec(triton, routing=routing))
    ready = wait_for(
        lambda: condition(policies.status("elsewhere"), "Ready") or None, 15, "a Ready condition"
    )
    assert (ready["status"], ready["reason"]) == ("False", "TargetNotAllowed")
    assert ready["message"].startswith("spec.routing.grpcEndpoint: triton.payments.svc is a ")
    assert "allowedTargetNamespaces" in ready["message"]
    [event] = policies.wait_events("elsewhere", "TargetNotAllowed")
    assert (event["type"], event["message"]) == ("Warning", ready["message"])
    assert router.active_config() == config_key(FASTEST)


def test_schema_invalid_policy_is_rejected_by_the_api_server_naming_the_fields(
    triton: LocalTriton, policies: Policies
) -> None:
    spec = policy_spec(triton, slo={"latencyMs": -5}, onMetricsLoss="panic")
    spec["front"][0]["accuracy"] = 1.5
    with pytest.raises(ApiException) as rejected:
        policies.create("invalid", spec)
    assert rejected.value.status == 422
    message = json.loads(rejected.value.body)["message"]
    # (1.20 names a list item's field without its index.)
    for field_path in ("spec.slo.latencyMs", "spec.onMetricsLoss", "spec.front.accuracy"):
        assert field_path in message, message


def test_prometheus_source_reads_the_queue(
    triton: LocalTriton,
    router: TritonRouter,
    policies: Policies,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    require_prometheus()
    with LocalPrometheus(targets=[f"127.0.0.1:{triton.metrics_port}"], interval_s=0.5) as prom:
        prom.start(tmp_path_factory.mktemp("prometheus"))
        metrics = {"type": "prometheus", "url": prom.url}
        policies.create("prom", policy_spec(triton, metrics=metrics, paused=True))
        available = wait_for(
            lambda: (
                condition(policies.status("prom"), "MetricsAvailable").get("status") == "True"
                and policies.status("prom")
            ),
            20,
            "the queue depth through Prometheus",
        )
        assert prom.url in condition(available, "MetricsAvailable")["message"]
        assert available["lastQueueDepth"] == 0
        # (Lost and restored once already if the policy came before Prometheus's first scrape.)
        lost_before = len(policies.events("prom", "MetricsLost"))
        # Prometheus goes away: MetricsLost once, and the policy holds.
    lost = wait_for(
        lambda: (
            condition(policies.status("prom"), "MetricsAvailable").get("status") == "False"
            and policies.status("prom")
        ),
        15,
        "the metrics loss",
    )
    assert condition(lost, "Ready")["reason"] == "MetricsUnavailable"
    assert lost["active"]["name"] == FAST_NAME
    policies.wait_events("prom", "MetricsLost", lost_before + 1)
    time.sleep(2)  # more decisions without metrics: still one Event
    assert len(policies.events("prom", "MetricsLost")) == lost_before + 1


def test_prometheus_unreachable_at_start_is_reported_and_recovers_when_it_appears(
    triton: LocalTriton,
    policies: Policies,
    operator: Operator,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A bad install: the policy's Prometheus is not there yet. The operator keeps running, the
    conditions name the URL and the reason, and the policy recovers once Prometheus is up."""
    require_prometheus()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    policies.create("prom-late", policy_spec(triton, metrics={"type": "prometheus", "url": url}))

    def unavailable() -> dict[str, Any] | None:
        status = policies.status("prom-late")
        metrics = condition(status, "MetricsAvailable")
        return status if metrics.get("status") == "False" else None

    status = wait_for(unavailable, 20, "MetricsAvailable=False for the dead Prometheus")
    metrics, ready = condition(status, "MetricsAvailable"), condition(status, "Ready")
    assert metrics["reason"] == "MetricsUnavailable"
    assert url in metrics["message"]
    assert "refused" in metrics["message"].lower(), metrics["message"]  # the reason, not a guess
    assert ready["status"] == "False"
    assert ready["reason"] == "MetricsUnavailable"
    assert url in ready["message"]
    assert status.get("switches", 0) == 0
    time.sleep(3)  # more failed reads: the operator retries and keeps running
    assert operator.process is not None
    assert operator.process.poll() is None
    assert condition(policies.status("prom-late"), "MetricsAvailable")["status"] == "False"

    prometheus = LocalPrometheus(
        targets=[f"127.0.0.1:{triton.metrics_port}"], interval_s=0.5, port=port
    )
    with prometheus:
        prometheus.start(tmp_path_factory.mktemp("prometheus-late"))
        assert prometheus.url == url

        def recovered() -> dict[str, Any] | None:
            status = policies.status("prom-late")
            ok = condition(status, "MetricsAvailable").get("status") == "True"
            return status if ok and condition(status, "Ready").get("status") == "True" else None

        status = wait_for(recovered, 30, "the policy to recover once Prometheus is up")
    assert url in condition(status, "MetricsAvailable")["message"]
    assert condition(status, "Ready")["reason"] == "Serving"
    assert status["lastQueueDepth"] == 0


def _observed_after(status: dict[str, Any], started_at: float) -> dict[str, Any] | None:
    """The status if an operator started at ``started_at`` has written it (the observation
    time is its own decision's), else None."""
    stamp = status.get("lastObservationTime")
    return status if stamp and datetime.fromisoformat(stamp).timestamp() > started_at else None


@dataclass
class GuardedMetrics:
    """Triton's /metrics page on loopback, answered only to ``Authorization: Bearer <token>``
    (401 otherwise); records the Authorization header of every request."""

    token: str
    seen: list[str | None] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def guarded_metrics() -> Iterator[GuardedMetrics]:
    guarded = GuardedMetrics(token=f"tok-{time.monotonic_ns()}")
    page = "".join(
        f'{name}{{model="router",version="1"}} {value}\n'
        for name, value in (
            ("nv_inference_pending_request_count", 0),
            ("nv_inference_request_success", 5),
            ("nv_inference_request_failure", 0),
        )
    ).encode()

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            header = self.headers.get("Authorization")
            guarded.seen.append(header)
            ok = header == f"Bearer {guarded.token}"
            self.send_response(200 if ok else 401)
            self.end_headers()
            self.wfile.write(page if ok else b"who are you")

    with serve_http(Handler) as address:
        guarded.url = f"http://{address}/metrics"
        yield guarded


def _token_secret(name: str, token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": {"compass.io/metrics-credentials": "true"}},
        "data": {"token": base64.b64encode(f"{token}\n".encode()).decode()},
    }


def test_a_missing_metrics_secret_is_named_and_the_policy_recovers_once_it_exists(
    triton: LocalTriton,
    policies: Policies,
    operator: Operator,
    guarded_metrics: GuardedMetrics,
    namespace: str,
) -> None:
    """The Secret a policy's metrics.authentication names does not exist yet: the conditions
    name it, the key and the fix; once created the queue is read with its token; a rotated
    token (the endpoint answers 401) is read again and the policy recovers. No value of the
    Secret reaches the status, an Event or the operator's log."""
    secret = f"metrics-token-{time.monotonic_ns() % 100000}"
    metrics = {
        "type": "triton",
        "url": guarded_metrics.url,
        "authentication": {"secretRef": {"name": secret}, "bearer": {}},
    }
    policies.create("auth-late", policy_spec(triton, metrics=metrics))

    def metrics_condition(status: str, reason: str) -> Any:
        def found() -> dict[str, Any] | None:
            current = policies.status("auth-late")
            available = condition(current, "MetricsAvailable")
            matches = available.get("status") == status and available.get("reason") == reason
            return current if matches else None

        return found

    status = wait_for(
        metrics_condition("False", "MetricsCredentialsUnavailable"),
        20,
        "MetricsAvailable=False naming the missing Secret",
    )
    message = condition(status, "MetricsAvailable")["message"]
    assert f"Secret {namespace}/{secret} (spec.metrics.authentication.secretRef) not found" in (
        message
    )
    assert "create it in the policy's namespace with the keys token" in message
    assert condition(status, "Ready")["reason"] == "MetricsCredentialsUnavailable"
    assert guarded_metrics.seen == []  # nothing is sent without the credentials

    core: Any = policies.core
    core.create_namespaced_secret(namespace, _token_secret(secret, guarded_metrics.token))
    try:
        status = wait_for(
            metrics_condition("True", "MetricsRead"), 30, "the policy to read the metrics"
        )
        assert condition(status, "Ready")["status"] == "True"
        assert f"Bearer {guarded_metrics.token}" in guarded_metrics.seen

        # Rotation: the endpoint wants a new token, the Secret gets it; the 401 makes the
        # operator read the Secret again (within 5 s, not the minute of its periodic check).
        old = guarded_metrics.token
        guarded_metrics.token = f"{old}-rotated"
        core.replace_namespaced_secret(
            secret, namespace, _token_secret(secret, guarded_metrics.token)
        )
        wait_for(
            lambda: f"Bearer {guarded_metrics.token}" in guarded_metrics.seen or None,
            30,
            "a request with the rotated token",
        )
        status = wait_for(metrics_condition("True", "MetricsRead"), 30, "the policy to recover")

        events = [
            e
            for reason in ("MetricsLost", "MetricsRestored")
            for e in policies.events("auth-late", reason)
        ]
        assert events  # lost for the missing Secret, restored once it exists
        shown = json.dumps(policies.status("auth-late")) + json.dumps(events)
        shown += operator.log.read_text(errors="replace")
        for token in (old, guarded_metrics.token):
            assert token not in shown
            assert base64.b64encode(f"{token}\n".encode()).decode() not in shown
    finally:
        core.delete_namespaced_secret(secret, namespace)
