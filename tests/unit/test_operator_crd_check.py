"""`compass operator` names the compass.io CRDs it is missing, and the fix (tests/k8s shows it
live: tests/k8s/test_missing_crds.py)."""

from __future__ import annotations

from compass.api.crds import RESOURCES
from compass.controllers.manager import CRD_FIX, CRD_RECHECK_S, missing_crds, missing_crds_message


def test_every_resource_is_required() -> None:
    assert missing_crds(None) == sorted(r.name for r in RESOURCES)
    assert missing_crds(set()) == sorted(r.name for r in RESOURCES)
    assert missing_crds({r.plural for r in RESOURCES}) == []


def test_one_missing_is_named_alone() -> None:
    served = {RESOURCES[0].plural, "unrelated"}
    assert missing_crds(served) == [RESOURCES[1].name]


def test_message_names_the_crds_the_fix_and_the_cadence() -> None:
    message = missing_crds_message(["a.compass.io", "b.compass.io"])
    assert "a.compass.io, b.compass.io are not installed" in message
    assert CRD_FIX in message
    assert "kubectl apply -f crds/" in message
    assert f"re-checking every {CRD_RECHECK_S:g} s" in message
    assert "\n" not in message
