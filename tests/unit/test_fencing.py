"""The fence: when an operator with peering may switch routers (compass.controllers.fencing)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from compass.controllers.fencing import CLUSTER_SCOPE, Fence, keepalive_patch

LIFETIME_S = 60.0


def test_closed_until_a_keepalive_is_accepted() -> None:
    fence = Fence(LIFETIME_S, clusterwide=False)
    assert not fence.holds("team-a", 100.0)
    assert fence.renewed_ago("team-a", 100.0) is None


def test_open_for_the_lifetime_less_the_margin_from_the_send() -> None:
    fence = Fence(LIFETIME_S, clusterwide=False)
    fence.renewed("team-a", 100.0)
    closes = 100.0 + LIFETIME_S - fence.margin_s
    assert fence.margin_s == pytest.approx(15.0)
    assert fence.holds("team-a", 100.0)
    assert fence.holds("team-a", closes - 0.001)
    assert not fence.holds("team-a", closes)
    # Closed well before a standby may resume (the keep-alive's send plus the lifetime).
    assert closes < 100.0 + LIFETIME_S
    # Renewed several times within one fence, so one lost keep-alive does not close it.
    assert fence.renew_every_s * 2 < LIFETIME_S - fence.margin_s


def test_per_namespace_unless_cluster_wide() -> None:
    fence = Fence(LIFETIME_S, clusterwide=False)
    fence.renewed("team-a", 100.0)
    assert fence.holds("team-a", 101.0)
    assert not fence.holds("team-b", 101.0)

    wide = Fence(LIFETIME_S, clusterwide=True)
    wide.renewed(CLUSTER_SCOPE, 100.0)
    assert wide.holds("team-a", 101.0)
    assert wide.holds("team-b", 101.0)


def test_a_late_answer_to_an_older_keepalive_does_not_move_it_back() -> None:
    fence = Fence(LIFETIME_S, clusterwide=False)
    fence.renewed("team-a", 130.0)
    fence.renewed("team-a", 100.0)
    assert fence.renewed_ago("team-a", 131.0) == pytest.approx(1.0)


def test_the_keepalive_patch_renews_only_our_own_entry() -> None:
    seen = datetime(2026, 11, 25, 12, 0, 0, 123456, tzinfo=UTC)
    patch = keepalive_patch("alice@host/1764072000/42", -17, seen)
    # The identity is one JSON-pointer step: its slashes escaped (RFC 6901).
    assert patch == [
        {"op": "test", "path": "/status/alice@host~11764072000~142/priority", "value": -17},
        {
            "op": "replace",
            "path": "/status/alice@host~11764072000~142/lastseen",
            "value": "2026-11-25T12:00:00.123456+00:00",
        },
    ]
    assert keepalive_patch("a~b", 1, seen)[0]["path"] == "/status/a~0b/priority"
