"""Latency profiles for the policy, simulator and oracle tests (every tier has tests/ on its path)."""

from __future__ import annotations

from compass.domain.profiles import LatencyProfile


def normal_profile(name: str, accuracy: float, mean: float, spread: float) -> LatencyProfile:
    """A normal-ish profile of configuration {"c": name}: p95 and p99 at 1.645 and 2.326 spreads
    above the mean."""
    return LatencyProfile(
        {"c": name},
        accuracy,
        mean,
        mean + 1.645 * spread,
        p50_ms=mean,
        p99_ms=mean + 2.326 * spread,
        std_ms=spread,
    )
