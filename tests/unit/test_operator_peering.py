"""`compass operator`'s peering options: which priority a process takes and what kopf is told.

Two real processes with peering against a real API server: tests/k8s/test_peering.py.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from compass.commands.main import build_parser
from compass.commands.operator import with_command_line
from compass.console import UsageError
from compass.controllers.manager import (
    Peering,
    automatic_priority,
    kopf_settings,
    peering_of,
)
from compass.controllers.settings import OperatorSettings

STARTED_NS = 1_763_000_000_123_456_000  # on a microsecond


def _settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> OperatorSettings:
    for name in ("COMPASS_PEERING", "COMPASS_PEERING_PRIORITY", "COMPASS_NAMESPACES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return OperatorSettings()


def test_the_earlier_process_has_the_higher_priority() -> None:
    """Oldest acts; a start a microsecond later already ranks lower; any N >= 0 beats both."""
    first = automatic_priority(STARTED_NS)
    later = automatic_priority(STARTED_NS + 1_000)
    assert first > later
    assert first < 0
    assert automatic_priority(STARTED_NS + 999) == first  # same microsecond: kopf would tie


def test_standalone_unless_a_peering_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert peering_of(_settings(monkeypatch), STARTED_NS) is None
    assert peering_of(_settings(monkeypatch, COMPASS_PEERING=""), STARTED_NS) is None
    automatic = peering_of(_settings(monkeypatch, COMPASS_PEERING="ops"), STARTED_NS)
    assert automatic == Peering("ops", automatic_priority(STARTED_NS), 60)
    explicit = _settings(
        monkeypatch,
        COMPASS_PEERING="ops",
        COMPASS_PEERING_PRIORITY="100",
        COMPASS_PEERING_LIFETIME_SECONDS="15",
    )
    assert peering_of(explicit, STARTED_NS) == Peering("ops", 100, 15)


def test_a_lifetime_below_five_seconds_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf renews 5-10 s before the lifetime ends: shorter would make live peers look dead."""
    with pytest.raises(ValidationError, match="peering_lifetime_seconds"):
        _settings(monkeypatch, COMPASS_PEERING_LIFETIME_SECONDS="4")


def test_the_command_line_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(monkeypatch, COMPASS_PEERING="from-env", COMPASS_PEERING_PRIORITY="3")
    parser = build_parser(["operator"])
    named = with_command_line(settings, parser.parse_args(["operator", "--peering", "cli"]))
    assert (named.peering, named.peering_priority) == ("cli", 3)
    ranked = with_command_line(settings, parser.parse_args(["operator", "--priority", "666"]))
    assert (ranked.peering, ranked.peering_priority) == ("from-env", 666)
    alone = with_command_line(settings, parser.parse_args(["operator", "--standalone"]))
    assert alone.peering is None
    with pytest.raises(UsageError, match="--peering: not allowed with argument --standalone"):
        parser.parse_args(["operator", "--standalone", "--peering", "x"])


def test_kopf_is_told_standalone_or_mandatory_peering() -> None:
    """Mandatory: kopf starts paused and stays so until it has seen the peers (or without the
    CRD), so a new replica never acts before it knows whether an older one does."""
    alone = kopf_settings(None)
    assert alone.peering.standalone is True
    peering = kopf_settings(Peering("ops", -42, 15))
    assert peering.peering.standalone is False
    assert peering.peering.mandatory is True
    assert (peering.peering.name, peering.peering.priority, peering.peering.lifetime) == (
        "ops",
        -42,
        15,
    )
    assert alone.posting.loggers is peering.posting.loggers is False
