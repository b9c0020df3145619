"""One actor per routing target: of the policies naming one Service (or one gRPC endpoint), the
oldest acts (creationTimestamp, then name); the others say which holds it and switch nothing."""

from __future__ import annotations

from typing import Any

from compass.api.paretopolicy_status import ConditionType
from compass.controllers import policy_conditions
from compass.controllers.policy_decisions import Claim, claim_of, claimant, target_key


def _policy(
    name: str, created: str, routing: dict[str, str], namespace: str = "a"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created},
        "spec": {"routing": routing},
    }


def test_policies_on_one_service_share_a_target_and_other_services_do_not() -> None:
    one = target_key("a", {"routing": {"service": "triton"}})
    assert one == target_key("a", {"routing": {"service": "triton", "grpcPort": 9}})
    assert one != target_key("b", {"routing": {"service": "triton"}})
    assert one != target_key("a", {"routing": {"service": "other"}})
    assert target_key("a", {"routing": {"grpcEndpoint": "t.example.com:8001"}}) is not None
    assert target_key("a", {}) is None


def test_the_oldest_policy_acts_and_the_younger_is_told_which() -> None:
    old = claim_of(_policy("zeta", "2026-01-01T00:00:00Z", {"service": "triton"}))
    young = claim_of(_policy("alpha", "2026-01-02T00:00:00Z", {"service": "triton"}))
    assert old is not None
    assert young is not None
    claims = [old, young]
    assert claimant(claims, old) is None  # it acts
    assert claimant(claims, young) == old  # it holds back, naming zeta
    # The same instant: the name decides, the same way for both.
    twin = Claim("2026-01-01T00:00:00Z", "omega")
    assert claimant([old, twin], twin) is None
    assert claimant([old, twin], old) == twin
    # Alone: acts.
    assert claimant([young], young) is None


def test_a_policy_being_deleted_claims_nothing() -> None:
    body = _policy("zeta", "2026-01-01T00:00:00Z", {"service": "triton"})
    body["metadata"]["deletionTimestamp"] = "2026-01-03T00:00:00Z"
    assert claim_of(body) is None


def test_the_younger_policy_is_not_ready_with_target_claimed_naming_the_other() -> None:
    health = policy_conditions.Health(claimed_by="zeta")
    ready = next(
        c
        for c in policy_conditions.health_conditions(health)
        if c.type == ConditionType.READY.value
    )
    assert (ready.status, ready.reason) == ("False", "TargetClaimed")
    assert "zeta" in ready.message
