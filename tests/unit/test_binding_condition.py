"""PerRequestBinding: what the pods' routers report of per-request binding, as a condition."""

from __future__ import annotations

from compass.controllers.policy_conditions import Health, binding_condition, health_conditions
from compass.dataplane.triton import RouterState

GATED = RouterState("{}", "digest", binds=True, gate=(8, 1))


def test_every_pod_behind_its_gate_binds_each_request() -> None:
    condition = binding_condition({"a": GATED, "b": GATED}, "elastico", (8, 1))
    assert condition is not None
    assert (condition.status, condition.reason) == ("True", "BindingPerRequest")
    assert (
        condition.message == "2/2 pods bind each request behind a gate of 8 instances and 1 slot(s)"
    )


def test_a_gate_other_than_the_plans_is_named_with_the_fix() -> None:
    other = RouterState("{}", None, binds=True, gate=(4, 1))
    condition = binding_condition({"a": GATED, "b": other}, "elastico", (8, 1))
    assert condition is not None
    assert condition.status == "True"
    assert "4 instances and 1 slot(s), 8 instances and 1 slot(s)" in condition.message
    assert "set binding.gate to what the routers run" in condition.message


def test_an_ungated_pod_binds_only_what_carries_a_deadline() -> None:
    ungated = RouterState("{}", "digest", binds=True, gate=None)
    condition = binding_condition({"b": ungated, "a": GATED}, "predictive", (8, 1))
    assert condition is not None
    assert (condition.status, condition.reason) == ("False", "RoutersNotGated")
    assert condition.message.startswith("pods b have no gate")
    assert "predictive serves the rest" in condition.message


def test_an_older_router_is_named_before_a_missing_gate() -> None:
    old = RouterState("{}", None, binds=False, gate=None)
    ungated = RouterState("{}", None, binds=True, gate=None)
    reported = {f"old{i:02}": old for i in range(22)} | {"u": ungated}
    condition = binding_condition(reported, "elastico", (8, 1))
    assert condition is not None
    assert (condition.status, condition.reason) == ("False", "RoutersDoNotBind")
    assert condition.message.startswith("pods old00, old01")
    assert "old19 and 2 more run a router that does not bind per request" in condition.message
    assert "elastico serves the whole workflow there" in condition.message


def test_no_report_no_condition_and_the_condition_reaches_the_status() -> None:
    assert binding_condition({}, "elastico", (8, 1)) is None
    condition = binding_condition({"a": GATED}, "elastico", (8, 1))
    types = [c.type for c in health_conditions(Health(binding=condition))]
    assert types[-1] == "PerRequestBinding"
    assert "PerRequestBinding" not in [c.type for c in health_conditions(Health())]


def test_whole_workflow_serving_says_so_whatever_the_pods_report() -> None:
    condition = binding_condition({}, "split", (8, 1), per_request=False)
    assert condition is not None
    assert (condition.status, condition.reason) == ("False", "WholeWorkflow")
    assert condition.message == "binding.mode workflow: split switches the whole workflow"


def test_an_advisory_policy_is_ready_saying_what_it_would_serve() -> None:
    health = Health(active="accurate", advisory_routing="fast", decision="hold: queue 0")
    ready = health_conditions(health)[0]
    assert (ready.status, ready.reason) == ("True", "Advisory")
    assert ready.message == (
        "advisory: would serve accurate, the routers serve fast (untouched); hold: queue 0"
    )


def test_a_router_of_other_slots_than_the_plans_names_both_and_the_fix() -> None:
    four = RouterState("{}", "digest", binds=True, gate=(11, 4))
    condition = binding_condition({"b": four, "a": GATED}, "elastico", (8, 1))
    assert condition is not None
    assert (condition.status, condition.reason) == ("False", "GateSlotsDiffer")
    assert condition.message == (
        "pods b run 4 pipeline slot(s) where the plan binds at 1: run the router with "
        "compass_pipeline_slots 1 and 8 instances, or set binding.gate.slots to what the "
        "routers run"
    )
    # Every router at the plan's slots: binding as planned.
    agreed = binding_condition({"a": four}, "elastico", (11, 4))
    assert agreed is not None
    assert (agreed.status, agreed.reason) == ("True", "BindingPerRequest")
