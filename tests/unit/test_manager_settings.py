"""What `compass operator` tells kopf about its own API calls, and how the CRD checks fail.

Peering settings: tests/unit/test_operator_peering.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import urllib3
from pydantic import ValidationError

from compass.controllers import kubeapi, manager, policy_decisions
from compass.controllers.manager import Peering, kopf_settings, startup_missing_crds
from compass.controllers.policy_decisions import decision_due
from compass.controllers.settings import OperatorSettings


@pytest.mark.parametrize("peering", [None, Peering("ops", -42, 15)], ids=["standalone", "peering"])
def test_kopfs_own_calls_get_the_operators_timeouts(peering: Peering | None) -> None:
    settings = kopf_settings(peering)
    connect_s, read_s = kubeapi.REQUEST_TIMEOUT_S
    assert settings.networking.connect_timeout == connect_s
    # kopf's is one bound on the whole request: the connection and the answer.
    assert settings.networking.request_timeout == connect_s + read_s
    # Watches stay open as long as the server keeps them: no client-side bound on them.
    assert settings.watching.client_timeout is None
    assert settings.watching.server_timeout is None


def _unreachable(api: object) -> set[str] | None:
    raise urllib3.exceptions.MaxRetryError(None, "/apis", "refused")


def test_an_unreachable_api_server_leaves_the_crds_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(manager, "served_resources", _unreachable)
    assert startup_missing_crds(object()) == []


def test_a_bug_in_the_crd_check_is_not_taken_for_an_unreachable_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(api: object) -> set[str] | None:
        raise KeyError("resources")

    monkeypatch.setattr(manager, "served_resources", broken)
    with pytest.raises(KeyError):
        startup_missing_crds(object())


class _HtmlPage:
    """What a proxy in front of the API server answers: 200, and an HTML error page."""

    status, data = 200, b"<html><body>502 Bad Gateway</body></html>"


def _not_json(api: object) -> set[str] | None:
    kubeapi.call(lambda **_: _HtmlPage())
    raise AssertionError("kubeapi.call returned a non-JSON answer")


@pytest.mark.parametrize("failure", [_unreachable, _not_json], ids=["unreachable", "not-json"])
def test_the_crd_recheck_goes_on_through_a_failed_check(
    monkeypatch: pytest.MonkeyPatch, failure: Callable[[object], set[str] | None]
) -> None:
    """One failed check is logged and skipped: the loop checks again and finds the CRDs."""
    calls: list[int] = []

    def flaky(api: object) -> set[str] | None:
        calls.append(1)
        if len(calls) == 1:
            return failure(api)
        return set(manager.required_crds())

    monkeypatch.setattr(manager, "served_resources", flaky)
    monkeypatch.setattr(manager, "CRD_RECHECK_S", 0.01)
    stop, found = threading.Event(), threading.Event()
    manager.wait_for_crds(object(), stop, found)
    assert len(calls) == 2
    assert found.is_set()
    assert stop.is_set()


def test_the_policy_tick_follows_its_setting_within_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """COMPASS_POLICY_TICK_SECONDS sets the policy timer's period (the demo's scaled time); a
    period the operator could not keep, or one that would starve a policy, is refused by name."""
    monkeypatch.setenv("COMPASS_POLICY_TICK_SECONDS", "0.1")
    tick = OperatorSettings().policy_tick_seconds
    assert tick == 0.1
    # A decision every 0.1 s is due after 0.05 s, half a tick early, as at the default period.
    monkeypatch.setattr(policy_decisions, "TICK_S", tick)
    assert decision_due(10.0, 10.06, 0.1)
    assert not decision_due(10.0, 10.04, 0.1)
    for bad in ("0.01", "61", "nan"):
        monkeypatch.setenv("COMPASS_POLICY_TICK_SECONDS", bad)
        with pytest.raises(ValidationError, match="policy_tick_seconds"):
            OperatorSettings()
