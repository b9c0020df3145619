"""Latency profiling through the router: each configuration by per-request override, one at a time."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compass.domain.evaluation import Config
from compass.serving.triton import TritonRouter


@dataclass(frozen=True)
class ProfileSettings:
    """How many unmeasured warm-up requests and measured requests per configuration."""

    warmup_runs: int = 3
    measured_runs: int = 50


def profile_configuration(
    router: TritonRouter,
    config: Config,
    settings: ProfileSettings,
    payload: Callable[[int], Mapping[str, Any]],
) -> dict[str, Any]:
    """Latency statistics (ms) of one configuration, requests sent back to back.

    One request at a time: this measures the service time the planner's queueing model needs,
    not the queueing itself.
    """
    for run in range(settings.warmup_runs):
        router.infer(payload(run), config=config)
    latencies = np.array(
        [
            router.infer(payload(settings.warmup_runs + run), config=config).latency_s * 1000.0
            for run in range(settings.measured_runs)
        ]
    )
    return {
        "config": dict(config),
        "latency_mean_ms": float(latencies.mean()),
        "latency_p50_ms": float(np.percentile(latencies, 50)),
        "latency_p95_ms": float(np.percentile(latencies, 95)),
        "latency_p99_ms": float(np.percentile(latencies, 99)),
        "latency_std_ms": float(latencies.std(ddof=1)) if len(latencies) > 1 else 0.0,
        "warmup_runs": settings.warmup_runs,
        "measurement_runs": settings.measured_runs,
    }


def profile_configurations(
    router: TritonRouter,
    configs: Sequence[tuple[Config, float | None]],
    settings: ProfileSettings,
    payload: Callable[[int], Mapping[str, Any]],
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """The profiles document the planner reads: metadata and one entry per configuration."""
    profiles = []
    for done, (config, accuracy) in enumerate(configs, start=1):
        entry = profile_configuration(router, config, settings, payload)
        if accuracy is not None:
            entry["accuracy"] = accuracy
        profiles.append(entry)
        if progress is not None:
            progress(done, len(configs))
    return {
        "metadata": {
            "n_configs": len(profiles),
            "warmup_runs": settings.warmup_runs,
            "measurement_runs": settings.measured_runs,
            "router": f"{router.url}/{router.model}",
        },
        "profiles": profiles,
    }
