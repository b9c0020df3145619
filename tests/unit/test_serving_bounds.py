"""The serving settings' numeric bounds: every number that feeds the policy's arithmetic has both
ends in the schema, and decide() (every strategy) never raises on any spec the schema admits,
whatever valid observations and times it is given."""

from __future__ import annotations

import math
from typing import Any

import annotated_types
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from compass.api.paretopolicy import (
    FrontEntry,
    Hysteresis,
    ParetoPolicySpec,
    ServingSettings,
    SloSpec,
)
from compass.controllers.policy_compile import SpecError, compile_policy
from compass.conversion import policy_plan, runtime_policy
from compass.dataplane.metrics import MAX_COUNTER, MAX_QUEUE_DEPTH, MAX_SAMPLE_AGE_S
from compass.domain.elastico import Elastico, ElasticoSettings, rate_lower_bound, rate_upper_bound
from compass.domain.planner import PlanError, ThresholdModel
from compass.domain.policy import Observation, PolicyState
from compass.domain.strategy import Strategy

# Epoch seconds a policy may start at: from the epoch to a day before the saved state's bound
# (the year 2286), so that its steps stay within it.
MAX_NOW_S = 1e10 - 86_400


def numeric_bounds(model: type[BaseModel], name: str) -> tuple[float | None, float | None]:
    """(lowest, highest) the schema admits for a numeric field; None where open."""
    low = high = None
    for bound in model.model_fields[name].metadata:
        if isinstance(bound, annotated_types.Ge | annotated_types.Gt):
            low = float(bound.ge if isinstance(bound, annotated_types.Ge) else bound.gt)
        if isinstance(bound, annotated_types.Le | annotated_types.Lt):
            high = float(bound.le if isinstance(bound, annotated_types.Le) else bound.lt)
    return low, high


def numeric_fields(model: type[BaseModel], path: str = "") -> list[tuple[type[BaseModel], str]]:
    """Every float or int field of the model and its nested models."""
    found = []
    for name, field in model.model_fields.items():
        annotation = str(field.annotation)
        nested = [
            arg
            for arg in getattr(field.annotation, "__args__", (field.annotation,))
            if isinstance(arg, type) and issubclass(arg, BaseModel)
        ]
        for sub in nested:
            found += numeric_fields(sub, f"{path}{name}.")
        if ("float" in annotation or "int" in annotation) and "bool" not in annotation:
            found.append((model, name))
    return found


SERVING_NUMBERS = numeric_fields(ServingSettings) + numeric_fields(SloSpec)


@pytest.mark.parametrize(
    ("model", "name"), SERVING_NUMBERS, ids=[f"{m.__name__}.{n}" for m, n in SERVING_NUMBERS]
)
def test_every_serving_number_is_bounded_at_both_ends(model: type[BaseModel], name: str) -> None:
    low, high = numeric_bounds(model, name)
    assert low is not None, f"{model.__name__}.{name} has no lower bound"
    assert high is not None, f"{model.__name__}.{name} has no upper bound"
    assert math.isfinite(high)


OPERATOR_CHECKED = [
    *(
        (f"hysteresis.{Hysteresis.model_fields[n].alias}", Hysteresis, n)
        for n in Hysteresis.model_fields
    ),
    *(
        (ServingSettings.model_fields[n].alias or n, ServingSettings, n)
        for n in ("router_instances", "stale_after_seconds", "switch_delay_ms", "interval_seconds")
    ),
]


@pytest.mark.parametrize(
    ("path", "model", "name"), OPERATOR_CHECKED, ids=[p for p, _, _ in OPERATOR_CHECKED]
)
def test_the_operator_refuses_a_number_past_its_bound_naming_the_field(
    path: str, model: type[BaseModel], name: str
) -> None:
    """The same bound where the API server's schema is older or absent (an edit applied
    without validation): InvalidSpec naming the field, never a policy that cannot decide."""
    _, high = numeric_bounds(model, name)
    assert high is not None
    head, _, leaf = path.rpartition(".")
    extra: dict[str, Any] = {leaf: high * 2 + 1}
    if head:
        extra = {head: extra}
    with pytest.raises(SpecError) as refused:
        compile_policy(spec_of(extra), 1)
    assert str(refused.value).startswith(f"spec.{path}: "), str(refused.value)
    assert refused.value.reason == "InvalidSpec"


def test_the_cooldown_exponent_the_schema_refuses_is_capped_not_an_overflow() -> None:
    """A cooldownExponent of 1e308 made every decide() raise OverflowError."""
    with pytest.raises(ValueError, match="cooldownExponent"):
        ParetoPolicySpec.model_validate(spec_of({"hysteresis": {"cooldownExponent": 1e308}}))
    plan = policy_plan(ParetoPolicySpec.model_validate(spec_of({})))
    policy = Elastico(plan, ElasticoSettings(cooldown_exponent=1e308, downscale_cooldown_s=1e-300))
    state = policy.initial_state(0.0)
    decision, _ = policy.decide(Observation(0.0, 0.0), state, 0.0)
    assert decision.target == plan.names[0]
    assert policy.cooldown_s(len(plan.names) - 1) == 600.0


def spec_of(extra: dict[str, Any]) -> dict[str, Any]:
    """A small valid spec with extra fields."""
    return {
        "front": [
            {"config": {"k": 1}, "accuracy": 0.7, "latencyMeanMs": 20, "latencyP95Ms": 30},
            {"config": {"k": 2}, "accuracy": 0.9, "latencyMeanMs": 60, "latencyP95Ms": 90},
        ],
        "slo": {"latencyMs": 500},
    } | extra


def within(model: type[BaseModel], name: str) -> st.SearchStrategy[float]:
    """A value the schema admits for the field, its ends drawn often."""
    low, high = numeric_bounds(model, name)
    assert low is not None
    assert high is not None
    exclusive_low = any(
        isinstance(b, annotated_types.Gt) for b in model.model_fields[name].metadata
    )
    exclusive_high = any(
        isinstance(b, annotated_types.Lt) for b in model.model_fields[name].metadata
    )
    ends = [
        math.nextafter(low, math.inf) if exclusive_low else low,
        math.nextafter(high, -math.inf) if exclusive_high else high,
    ]
    inside = st.floats(
        low, high, exclude_min=exclusive_low, exclude_max=exclusive_high, allow_nan=False
    )
    return st.one_of(st.sampled_from(ends), inside)


@st.composite
def front_entries(draw: st.DrawFn) -> list[dict[str, Any]]:
    """One to four entries, faster ones first, with latencies anywhere the schema admits."""
    low, high = numeric_bounds(FrontEntry, "latency_mean_ms")
    assert low is not None
    assert high is not None
    count = draw(st.integers(1, 4))
    means = sorted(draw(st.lists(st.floats(low, high), min_size=count, max_size=count)))
    entries = []
    for index, mean in enumerate(means):
        p95 = draw(st.floats(mean, high))
        entries.append(
            {
                "config": {"k": index},
                "accuracy": (index + 1) / (count + 1),
                "latencyMeanMs": mean,
                "latencyP95Ms": p95,
            }
        )
    return entries


@st.composite
def specs(draw: st.DrawFn) -> ParetoPolicySpec:
    """A ParetoPolicy spec the schema admits, every serving number anywhere in its bounds."""
    strategy = draw(st.sampled_from(list(Strategy)))
    hysteresis = {
        field.alias or name: draw(within(Hysteresis, name))
        for name, field in Hysteresis.model_fields.items()
    }
    value = {
        "front": draw(front_entries()),
        "slo": {
            "latencyMs": draw(within(SloSpec, "latency_ms")),
            "percentile": draw(within(SloSpec, "percentile")),
        },
        "hysteresis": hysteresis,
        "thresholdModel": draw(st.sampled_from(list(ThresholdModel))).value,
        "routerInstances": round(draw(within(ServingSettings, "router_instances"))),
        "onMetricsLoss": draw(st.sampled_from(["hold", "fastest"])),
        "staleAfterSeconds": draw(within(ServingSettings, "stale_after_seconds")),
        "switchDelayMs": draw(within(ServingSettings, "switch_delay_ms")),
        "intervalSeconds": draw(within(ServingSettings, "interval_seconds")),
        "strategy": strategy.value,
        "binding": {"mode": "workflow"},
    }
    return ParetoPolicySpec.model_validate(value)


def observation_at(now: float) -> st.SearchStrategy[Observation | None]:
    """Nothing, or an observation at most a day old (or a little ahead) with extreme values."""
    extreme = st.sampled_from([0.0, 1.0, MAX_QUEUE_DEPTH])
    return st.one_of(
        st.none(),
        st.builds(
            Observation,
            time=st.floats(max(0.0, now - MAX_SAMPLE_AGE_S), now + 5),
            queue_depth=st.one_of(extreme, st.floats(0, MAX_QUEUE_DEPTH)),
            arrivals_total=st.one_of(
                st.none(), st.sampled_from([0.0, MAX_COUNTER]), st.floats(0, MAX_COUNTER)
            ),
            arrival_rate_qps=st.one_of(st.none(), extreme, st.floats(0, MAX_QUEUE_DEPTH)),
            pods=st.integers(1, 10_000),
        ),
    )


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(spec=specs(), data=st.data())
def test_decide_never_raises_on_a_spec_the_schema_admits(
    spec: ParetoPolicySpec, data: st.DataObject
) -> None:
    try:
        policy = runtime_policy(spec)
    except PlanError:
        event("the SLO admits no entry")
        return  # the operator reports it as the spec's error
    event(f"{spec.strategy.value} decides")
    now = data.draw(st.sampled_from([0.0, 1.0, 1.8e9, MAX_NOW_S]) | st.floats(0, MAX_NOW_S))
    state: PolicyState = policy.initial_state(now)
    for _ in range(6):
        step = data.draw(
            st.sampled_from([spec.interval_seconds, spec.stale_after_seconds, 0.0, 600.0])
        )
        now += step
        observation = data.draw(observation_at(now))
        decision, state = policy.decide(observation, state, now)
        assert 0 <= decision.index < len(policy.plan.names)
        # The state goes to the status and back: it must read back as it was written.
        assert PolicyState.from_dict(state.to_dict()) == state


def test_rate_bounds_take_a_count_beyond_int64() -> None:
    """Counts made of integer counters (2**64 arrivals in a window, hypothesis's find) are taken
    as floats, not refused by the ufunc."""
    assert rate_lower_bound(2**64, 2.0, 0.8) > 0
    assert rate_upper_bound(2**64, 2.0, 0.8) > rate_lower_bound(2**64, 2.0, 0.8)
