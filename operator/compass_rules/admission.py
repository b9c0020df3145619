"""Admission at dispatch: a request taken up with its deadline is served as routed, on the
fastest configuration, or refused, by what is left of its deadline (docs/serving.md)."""

from __future__ import annotations

import json
import math
from typing import Any

from compass_rules.routing import config_key

# The start of a router's message for a request it refused as late (retryable: UNAVAILABLE).
LATE_MESSAGE = "compass admission: late"
# The verdicts (compass.domain.admission.AdmissionVerdict has the same values).
SERVE, FASTEST, DROP = "serve", "fastest", "drop"


def dispatch_verdict(
    left_ms: float,
    routed_ms: float,
    fastest_ms: float,
    degrade_below_ms: float,
    refuse: bool,
) -> str:
    """SERVE a request as routed if its own time (``routed_ms``) fits the ``left_ms`` of its
    deadline and at least ``degrade_below_ms`` is left (less: it waited long, a queue stands
    behind it); else FASTEST if the fastest fits; else SERVE if the routed fits; else DROP
    (``refuse``) or the fastest, which holds up the requests behind it the least."""
    fits = routed_ms <= left_ms
    if fits and left_ms >= degrade_below_ms:
        return SERVE
    if fastest_ms <= left_ms:
        return FASTEST
    return SERVE if fits else late_verdict(refuse)


def late_verdict(refuse: bool) -> str:
    """What becomes of a request late whatever serves it: DROP (``refuse``), else FASTEST."""
    return DROP if refuse else FASTEST


def _time_ms(value: object, positive: bool = False) -> bool:
    """Whether ``value`` is a finite time in ms, >= 0 (> 0 with ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and (value > 0 if positive else value >= 0)


def check_admission(table: Any) -> dict[str, Any]:
    """The admission table as a switch sends it, checked: quantiles (ms, >= 0) by key, the
    fastest's key among them, and whether late requests are refused (true when absent)."""
    if not isinstance(table, dict) or not isinstance(table.get("quantiles_ms"), dict):
        raise ValueError("admission: give {'quantiles_ms': {config: ms}, 'fastest': config}")
    quantiles = {}
    for key, ms in table["quantiles_ms"].items():
        if not _time_ms(ms):
            raise ValueError(f"admission: quantile {ms!r} of {key} is not a time in ms >= 0")
        quantiles[config_key(json.loads(key))] = float(ms)
    fastest = config_key(json.loads(table.get("fastest") or "null") or {})
    if fastest not in quantiles:
        raise ValueError("admission: fastest is not one of the quantiles' configurations")
    below = table.get("degrade_below_ms", 0.0)
    if not _time_ms(below):
        raise ValueError(f"admission: degrade_below_ms {below!r} is not a time in ms >= 0")
    refuse = table.get("refuse", True)
    if not isinstance(refuse, bool):
        raise ValueError(f"admission: refuse {refuse!r} is not true or false")
    slo_ms = table.get("slo_ms")
    if slo_ms is not None and not _time_ms(slo_ms, positive=True):
        raise ValueError(f"admission: slo_ms {slo_ms!r} is not a time in ms > 0")
    return {
        "quantiles_ms": quantiles,
        "fastest": fastest,
        "degrade_below_ms": float(below),
        "refuse": refuse,
        "slo_ms": None if slo_ms is None else float(slo_ms),
    }
