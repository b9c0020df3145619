"""`compass operator release-finalizers`' pure part: the patch that takes kopf's finalizer off
one object, and the command line's bad input (the real API server's side is the e2e tier's
tests/e2e/test_readme_install_uninstall.py, through the chart's uninstall hook)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from compass.commands.main import main
from compass.controllers.finalizers import KOPF_FINALIZER, build_finalizer_release


class FailedTestOpError(Exception):
    """A ``test`` op did not hold: the API server answers 422 and changes nothing."""


def _with(finalizers: list[str]) -> dict[str, Any]:
    return {"metadata": {"name": "rag", "namespace": "ml", "finalizers": finalizers}}


def _apply(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The two RFC 6902 ops the release uses, on /metadata/finalizers, as the server applies
    them (all or nothing)."""
    after = copy.deepcopy(obj)
    finalizers = after["metadata"].get("finalizers")
    for op in ops:
        if op["op"] == "test":
            assert op["path"] == "/metadata/finalizers"
            if finalizers != op["value"]:
                raise FailedTestOpError(op)
        else:
            assert op["op"] == "remove"
            del finalizers[int(op["path"].rsplit("/", 1)[1])]
    return after


def test_only_kopfs_finalizer_is_taken_off_and_the_others_stay_in_order() -> None:
    obj = _with(["example.com/keep", KOPF_FINALIZER, "example.com/also"])
    ops = build_finalizer_release(obj)
    assert ops is not None
    after = _apply(obj, ops)
    assert after["metadata"]["finalizers"] == ["example.com/keep", "example.com/also"]


def test_a_list_changed_since_it_was_read_fails_the_patch_instead_of_removing_another() -> None:
    ops = build_finalizer_release(_with([KOPF_FINALIZER, "example.com/keep"]))
    assert ops is not None
    changed = _with(["example.com/new", KOPF_FINALIZER, "example.com/keep"])
    with pytest.raises(FailedTestOpError):
        _apply(changed, ops)


@pytest.mark.parametrize("obj", [_with([]), _with(["example.com/keep"]), {"metadata": {}}])
def test_nothing_to_do_without_kopfs_finalizer(obj: dict[str, Any]) -> None:
    assert build_finalizer_release(obj) is None


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--wait-for-pods", "app=x"], "--pods-namespace: missing"),
        (["--timeout", "0"], "--timeout: 0 is not positive"),
    ],
)
def test_bad_input_is_one_line_naming_the_option(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["operator", "release-finalizers", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err
    assert len(err.strip().splitlines()) == 1
