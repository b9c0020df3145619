"""A ParetoPolicy's late-binding opt-in: what it must name, and the table it sends the routers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from compass.api.paretopolicy import ParetoPolicySpec
from compass.conversion import binding_rule, binding_table, policy_plan, stage_shares
from compass.domain.binding import GATE_SETTLE_MS, RATE_HEADROOM
from compass.domain.boundpod import ROUTER_POLL_S, RateView
from compass_rules.binding import check_binding

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pareto-policy-gitops.yaml"
STAGES = [
    {"component": "retriever", "parameters": ["retriever_k"], "share": 0.1},
    {"component": "reranker", "parameters": ["reranker_model", "reranker_k"], "share": 0.2},
    {"component": "generator", "parameters": ["generator_model"], "share": 0.7},
]


def example_spec() -> dict[str, Any]:
    """The example ParetoPolicy's spec, as data."""
    for document in yaml.safe_load_all(EXAMPLE.read_text(encoding="utf-8")):
        if document and document.get("kind") == "ParetoPolicy":
            spec: dict[str, Any] = document["spec"]
            return spec
    raise AssertionError(f"no ParetoPolicy in {EXAMPLE}")


def test_per_stage_binding_sends_every_router_a_table_it_accepts() -> None:
    data = example_spec()
    spec = ParetoPolicySpec.model_validate(
        {**data, "binding": {"mode": "per-stage", "stages": STAGES}}
    )
    table = binding_table(spec, policy_plan(spec))
    assert table is not None
    checked = check_binding(json.loads(json.dumps(table)))
    assert checked["components"] == ["retriever", "reranker", "generator"]
    assert len(checked["configs"]) == len(spec.front)
    # Each entry's stages add up to its time at the binding quantile, above its mean.
    plan = policy_plan(spec)
    for (_, _, stage_ms, admit_ms, max_qps), entry, threshold in zip(
        checked["configs"], spec.front, plan.thresholds, strict=True
    ):
        # The slow loop's limit: the planner's, with the headroom the simulator chose.
        assert max_qps == pytest.approx(threshold.stay_max_qps * RATE_HEADROOM)
        assert sum(stage_ms) > sum(admit_ms) > 0
        assert sum(admit_ms) == pytest.approx(
            entry.latency_p50_ms or entry.latency_mean_ms, rel=0.05
        )
    # Per-request binding admits by default: a request late whatever serves it is refused; the
    # lag cap (on by default) replaces the wait rule; the SLO tells each request's arrival.
    assert table["refuse"] is True
    assert (checked["slo_ms"], checked["degrade_after"], checked["lag_share"]) == (
        spec.slo.latency_ms,
        None,
        0.3,
    )
    serving_all = spec.model_copy(
        update={"admission": spec.admission.model_copy(update={"enabled": False})}
    )
    refusing_none = binding_table(serving_all, policy_plan(serving_all))
    assert refusing_none is not None
    assert refusing_none["refuse"] is False
    # Whole-workflow serving: the policy's configuration serves every request, no table.
    whole = ParetoPolicySpec.model_validate({**data, "binding": {"mode": "workflow"}})
    assert binding_table(whole, policy_plan(spec)) is None
    assert not whole.admits


def test_the_default_binds_the_whole_configuration_at_take_up() -> None:
    # No stages declared: one stage of every parameter, calling no named model (the whole
    # pipeline), each entry's whole time in it.
    data = example_spec()
    spec = ParetoPolicySpec.model_validate(data)
    assert spec.binding.mode.per_request
    assert spec.admits
    table = binding_table(spec, policy_plan(spec))
    assert table is not None
    assert table["stages"] == [list(spec.front[0].config)]
    assert table["components"] == [[]]
    # The shipped router takes it as it comes over the wire.
    assert check_binding(json.loads(json.dumps(table)))["stages"] == table["stages"]
    for config, entry in zip(table["configs"], spec.front, strict=True):
        assert json.loads(config["config"]) == entry.config
        (stage_ms,) = config["stage_ms"]
        assert stage_ms >= entry.latency_mean_ms
    # Entries that disagree on their parameters cannot be bound as one stage.
    uneven = [dict(data["front"][0], config={"only": 1}), *data["front"][1:]]
    with pytest.raises(ValidationError, match=r"front\[1\].config: parameters"):
        ParetoPolicySpec.model_validate({**data, "front": uneven})


def test_per_stage_binding_names_what_is_missing() -> None:
    data = example_spec()
    with pytest.raises(ValidationError, match=r"binding.stages: per-stage needs"):
        ParetoPolicySpec.model_validate({**data, "binding": {"mode": "per-stage"}})
    wrong = [dict(STAGES[0], parameters=["top_k"]), *STAGES[1:]]
    with pytest.raises(ValidationError, match=r"binding.stages\[0\].parameters: 'top_k'"):
        ParetoPolicySpec.model_validate({**data, "binding": {"mode": "per-stage", "stages": wrong}})
    uneven = [dict(STAGES[0], share=0.5), *STAGES[1:]]
    with pytest.raises(ValidationError, match=r"share: give every stage a share, adding up to 1"):
        ParetoPolicySpec.model_validate(
            {**data, "binding": {"mode": "per-stage", "stages": uneven}}
        )


def test_a_stage_of_several_models_reaches_the_routers_as_their_list() -> None:
    # qa-real's retrieval may call bm25, dense and the reranker: one stage, their time together.
    data = example_spec()
    stages = [
        {"components": ["bm25", "dense", "reranker"], "parameters": ["retriever_k"]},
        {"component": "generator", "parameters": ["reranker_model", "generator_model"]},
    ]
    spec = ParetoPolicySpec.model_validate(
        {**data, "binding": {"mode": "per-stage", "stages": stages}}
    )
    table = binding_table(spec, policy_plan(spec))
    assert table is not None
    assert table["components"] == [["bm25", "dense", "reranker"], "generator"]
    checked = check_binding(json.loads(json.dumps(table)))
    assert len(checked["configs"]) == len(spec.front)
    for stage in (dict(stages[0], component="bm25"), {"parameters": ["retriever_k"]}):
        with pytest.raises(ValidationError, match=r"component: give the stage's model as"):
            ParetoPolicySpec.model_validate(
                {**data, "binding": {"mode": "per-stage", "stages": [stage, stages[1]]}}
            )


def test_the_lag_cap_reaches_the_routers_in_place_of_the_wait_rule() -> None:
    data = example_spec()
    binding = {"mode": "per-stage", "stages": STAGES, "lagShare": 0.3, "lagReserve": 2}
    spec = ParetoPolicySpec.model_validate(
        {**data, "binding": binding, "admission": {"degradeAfter": 1}}
    )
    table = binding_table(spec, policy_plan(spec))
    assert table is not None
    checked = check_binding(json.loads(json.dumps(table)))
    # With the cap, degradeAfter 1 is no wait rule (the simulator's best rule).
    assert (checked["lag_share"], checked["lag_reserve"], checked["degrade_after"]) == (
        0.3,
        2,
        None,
    )
    # The cap replaces the wait rule whatever degradeAfter says.
    waiting = ParetoPolicySpec.model_validate(
        {**data, "binding": binding, "admission": {"degradeAfter": 0.25}}
    )
    kept = binding_table(waiting, policy_plan(waiting))
    assert kept is not None
    assert kept["degrade_after"] is None
    # No cap: the wait rule as admission sets it.
    plain = ParetoPolicySpec.model_validate(
        {
            **data,
            "binding": {"mode": "per-stage", "stages": STAGES, "lagShare": None},
            "admission": {"degradeAfter": 1},
        }
    )
    uncapped = binding_table(plain, policy_plan(plain))
    assert uncapped is not None
    assert (uncapped["lag_share"], uncapped["degrade_after"]) == (None, 1)


@pytest.mark.parametrize(
    ("field", "value"),
    [("lagShare", 0), ("lagShare", 1.5), ("lagReserve", -1), ("lagReserve", 1000)],
)
def test_a_bad_lag_cap_is_refused_naming_the_field(field: str, value: float) -> None:
    data = example_spec()
    with pytest.raises(ValidationError, match=rf"binding\.{field}"):
        ParetoPolicySpec.model_validate(
            {**data, "binding": {"mode": "per-stage", "stages": STAGES, field: value}}
        )


def test_the_simulator_binds_on_what_the_routers_of_the_table_see() -> None:
    """binding_rule: the table's own numbers, on the view the routers have (the bench's
    and the cluster demo's prediction): behind a gate with the lag cap, the waiters at the gate
    seen and nothing polled (the routers poll only without a gate); without a gate, the
    poller's count and the arrivals taken up."""
    data = example_spec()
    binding = {"mode": "per-stage", "stages": STAGES, "lagShare": 0.3, "lagReserve": 2}
    spec = ParetoPolicySpec.model_validate(
        {**data, "binding": binding, "admission": {"enabled": True, "degradeAfter": 1}}
    )
    table = binding_table(spec, policy_plan(spec))
    assert table is not None
    gated = binding_rule(spec, table, 8, 1, poll_s=0.1, decision_s=0.002)
    assert (gated.visible_followers, gated.followers_poll_s, gated.rate_view) == (
        7,
        None,
        RateView.GATE_ARRIVALS,
    )
    assert gated.max_qps == tuple(c["max_qps"] for c in table["configs"])
    assert (gated.lag_share, gated.lag_reserve, gated.degrade_after) == (0.3, 2, None)
    assert gated.refuse is True
    assert gated.decision_s == 0.002
    # The routers' settle at a free pipeline, the table's (real time), behind a gate only.
    assert table["settle_ms"] == GATE_SETTLE_MS
    assert check_binding(json.loads(json.dumps(table)))["settle_ms"] == (GATE_SETTLE_MS)
    assert gated.settle_s == GATE_SETTLE_MS / 1000
    assert binding_rule(spec, table, 8, 1, settle_s=0.5).settle_s == 0.5
    assert gated.spare_followers is True
    assert gated.quantile == spec.binding.quantile
    # The stages the routers bind, and the shares the per-stage fit leans to, the spec's own.
    assert [tuple(stage) for stage in gated.stages] == [tuple(s["parameters"]) for s in STAGES]
    assert gated.prior_shares == stage_shares(spec)
    ungated = binding_rule(spec, table, 1, None)
    assert (ungated.visible_followers, ungated.followers_poll_s, ungated.rate_view) == (
        None,
        ROUTER_POLL_S,
        RateView.TAKEN_ARRIVALS,
    )
    assert ungated.settle_s == 0.0
    # Behind a gate without the cap: every follower and every arrival (the gate's own view).
    plain = ParetoPolicySpec.model_validate(
        {
            **data,
            "binding": {"mode": "per-stage", "stages": STAGES, "lagShare": None},
            "admission": {"enabled": False},
        }
    )
    uncapped = binding_table(plain, policy_plan(plain))
    assert uncapped is not None
    open_gate = binding_rule(plain, uncapped, 8, 1)
    assert (open_gate.visible_followers, open_gate.followers_poll_s, open_gate.rate_view) == (
        None,
        None,
        RateView.ARRIVALS,
    )
    # Admission off: the routers refuse nothing, so neither does their simulation.
    assert open_gate.refuse is False
