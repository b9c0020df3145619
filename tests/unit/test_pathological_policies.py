"""A thousand pathological ParetoPolicies (issue 62 item 7c): every serving number at an end of
its schema bound, fronts up to the schema's size, all naming one router under several
spellings. One key, one actor; each compiles and decides at
extreme observations without raising; what the operator holds for them stays bounded (the
scale of the real thing: bench/operator_scale.py, docs/operations.md)."""

from __future__ import annotations

import itertools
import json
import tracemalloc
from typing import Any

from test_serving_bounds import numeric_bounds

from compass.api.paretopolicy import MAX_FRONT, Hysteresis, ServingSettings
from compass.controllers.policy_compile import compile_policy
from compass.controllers.policy_decisions import Claim, claim_keys, claim_of, claimant, target_key
from compass.controllers.targets import TargetAccess
from compass.dataplane.metrics import MAX_COUNTER, MAX_QUEUE_DEPTH
from compass.domain.elastico import Observation

POLICIES = 1000
# Those with a front at the schema's limit (the rest: two entries): each is ~100 KiB of JSON.
LARGE = 20
SPELLINGS = ("127.0.0.1:8001", "localhost:8001", "LocalHost:8001")
ACCESS = TargetAccess(allowed_hosts=("127.0.0.1", "localhost"))
# What the operator may hold for all of them, compiled, with their decision states: about
# 35 MiB. A predictive policy at the front's limit drew every member's service times, 128 MiB
# a policy and a GiB for these, past the chart's memory limit; now only the members it deals.
MAX_HELD_MIB = 120


def _ends(model: Any, name: str) -> tuple[float, float]:
    low, high = numeric_bounds(model, name)
    assert low is not None
    assert high is not None
    return (low if low > 0 else 1e-9 if name != "cooldown_exponent" else low), high


def _front(size: int) -> list[dict[str, Any]]:
    return [
        {
            "config": {"k": i},
            "accuracy": (i + 1) / (size + 1),
            "latencyMeanMs": 1 + i,
            "latencyP95Ms": 2 + i,
        }
        for i in range(size)
    ]


def pathological(index: int) -> dict[str, Any]:
    """The index-th spec: each serving number at one end of its bound, by the index's bits."""
    bits = itertools.cycle(int(b) for b in f"{index:016b}")
    hysteresis = {
        (field.alias or name): _ends(Hysteresis, name)[next(bits)]
        for name, field in Hysteresis.model_fields.items()
    }
    serving = {
        (ServingSettings.model_fields[name].alias or name): _ends(ServingSettings, name)[next(bits)]
        for name in ("stale_after_seconds", "switch_delay_ms", "interval_seconds")
    }
    return {
        "front": _front(MAX_FRONT if index < LARGE else 2),
        "slo": {"latencyMs": 1e6 if next(bits) else 20},
        "hysteresis": hysteresis,
        "routerInstances": int(_ends(ServingSettings, "router_instances")[next(bits)]),
        "onMetricsLoss": "fastest" if next(bits) else "hold",
        "strategy": "predictive" if next(bits) else "elastico",
        "routing": {"grpcEndpoint": SPELLINGS[index % len(SPELLINGS)], "routerModel": "router"},
        "binding": {"mode": "workflow"},
        **serving,
    }


def _body(index: int) -> dict[str, Any]:
    created = f"2026-01-01T{index // 3600:02d}:{index // 60 % 60:02d}:{index % 60:02d}Z"
    return {
        "metadata": {"name": f"p{index:04d}", "namespace": f"team-{index % 7}", "uid": str(index)},
        "metadata_created": created,
        "spec": pathological(index),
    }


def test_a_thousand_pathological_policies_on_one_router_have_one_actor() -> None:
    """Every spelling of the one router is one key; of a thousand claims the oldest acts and
    each other policy is told which one does."""
    claims: dict[tuple[str, str, str], list[Claim]] = {}
    bodies = []
    for index in range(POLICIES):
        body = _body(index)
        body["metadata"]["creationTimestamp"] = body.pop("metadata_created")
        key = target_key(body["metadata"]["namespace"], body["spec"], ACCESS)
        assert key is not None
        claim = claim_of(body)
        assert claim is not None
        claims.setdefault(key, []).append(claim)
        bodies.append((key, claim))
    assert len(claims) == 1, f"one router, {len(claims)} keys: {sorted(claims)}"
    actors = []
    for key, mine in bodies:
        keys = claim_keys(key, {}, lambda _namespace, _ip: (), ACCESS)
        holder = claimant([c for each in keys for c in claims.get(each, ())], mine)
        if holder is None:
            actors.append(mine)
        else:
            assert holder.name == "p0000"
    assert [a.name for a in actors] == ["p0000"]


def test_a_thousand_pathological_policies_compile_decide_and_stay_bounded() -> None:
    """Each compiles (the schema admits it, and the SLO some entry); each decides at
    extreme observations and times without raising, its state as small as a status holds; all
    of them together stay within MAX_HELD_MIB (no pathological spec makes the operator hold
    more than its share)."""
    observations = [
        None,
        Observation(0.0, 0.0),
        Observation(1.0, MAX_QUEUE_DEPTH, MAX_COUNTER, MAX_QUEUE_DEPTH, 10_000),
        Observation(2.0, 0.0, 0.0, 0.0, 1),
    ]
    held: list[Any] = []
    tracemalloc.start()
    try:
        for index in range(POLICIES):
            compiled = compile_policy(pathological(index), 1)  # SpecError: a bad corpus
            policy = compiled.policy
            state = policy.initial_state(0.0)
            for step, observation in enumerate(observations * 3):
                now = float(step)
                if observation is not None:
                    observation = Observation(now, *_fields(observation)[1:])
                decision, state = policy.decide(observation, state, now)
                assert 0 <= decision.index < len(policy.plan.names)
            assert len(json.dumps(state.to_dict())) < 4096
            held.append((compiled, state))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MAX_HELD_MIB * 2**20, f"peak {peak / 2**20:.0f} MiB for {len(held)} policies"


def _fields(observation: Observation) -> tuple[Any, ...]:
    return (
        observation.time,
        observation.queue_depth,
        observation.arrivals_total,
        observation.arrival_rate_qps,
        observation.pods,
    )
