"""Latency profiling through the router by per-request override, the pods in parallel."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compass.dataplane.load import run_load
from compass.dataplane.podpool import PodPool
from compass.dataplane.triton import TritonRouter
from compass.domain.capacity import (
    MAX_CURVE_POINTS,
    MIN_REQUESTS_PER_RATE,
    CapacityCurve,
    CapacityError,
    CurvePoint,
    climb_ladder,
    measure_point,
    median_point,
)
from compass.domain.evaluation import Config
from compass.domain.profiles import COMPONENT_FIELD, TTFT_FIELDS, clearly_dominated
from compass.domain.space import config_key
from compass_rules.protocol import OVERRIDE_PARAMETER


@dataclass(frozen=True)
class ProfileSettings:
    """Requests per configuration; ``screen_runs`` > 0: a screening pass first (cf. profiles)."""

    warmup_runs: int = 3
    measured_runs: int = 50
    screen_runs: int = 0
    screen_margin: float = 0.25
    # A pod's unmeasured requests first: each instance's first runs cold, and without them the
    # first configuration measured carries them all (rag-sim, 8 instances: p95 ~340 vs ~208 ms).
    pod_warmup_runs: int = 16


def warm_up(
    router: TritonRouter,
    config: Config,
    runs: int,
    payload: Callable[[int], Mapping[str, Any]],
    check: Callable[[], None] = lambda: None,
) -> None:
    """``runs`` unmeasured requests of ``config``, back to back (``check`` before each)."""
    for run in range(runs):
        check()
        router.infer(payload(run), config=config)


def profile_configuration(
    router: TritonRouter,
    config: Config,
    settings: ProfileSettings,
    payload: Callable[[int], Mapping[str, Any]],
    check: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Latency statistics (ms) of one configuration, one request at a time (its service time)."""
    warm_up(router, config, settings.warmup_runs, payload, check)
    latencies = []
    components: list[dict[str, float] | None] = []
    firsts: list[float | None] = []
    for run in range(settings.measured_runs):
        check()
        reply = router.infer(
            payload(settings.warmup_runs + run), config=config, component_times=True
        )
        latencies.append(reply.latency_s * 1000.0)
        components.append(reply.component_ms)
        firsts.append(None if reply.first_response_s is None else reply.first_response_s * 1000)
    entry = _statistics(config, np.array(latencies), settings.warmup_runs)
    entry.update(first_response_statistics(firsts))
    means = mean_component_times(components)
    if means is not None:
        entry[COMPONENT_FIELD] = means
    return entry


def mean_component_times(replies: Sequence[Mapping[str, float] | None]) -> dict[str, float] | None:
    """Each component model's mean time (0 where skipped); None unless every reply timed them."""
    if not replies or any(reply is None for reply in replies):
        return None
    models = sorted({model for reply in replies if reply is not None for model in reply})
    if not models:
        return None
    return {
        model: float(np.mean([(reply or {}).get(model, 0.0) for reply in replies]))
        for model in models
    }


def first_response_statistics(firsts: Sequence[float | None]) -> dict[str, float]:
    """The profile's ``ttft_*_ms`` fields; none unless every reply streamed."""
    if not firsts or any(first is None for first in firsts):
        return {}
    times = np.array(firsts, dtype=np.float64)
    return {
        TTFT_FIELDS["mean"]: float(times.mean()),
        TTFT_FIELDS["p50"]: float(np.percentile(times, 50)),
        TTFT_FIELDS["p95"]: float(np.percentile(times, 95)),
    }


def _statistics(config: Config, latencies: Any, warmup_runs: int) -> dict[str, Any]:
    """A profile entry from measured latencies (ms)."""
    return {
        "config": dict(config),
        "latency_mean_ms": float(latencies.mean()),
        "latency_p50_ms": float(np.percentile(latencies, 50)),
        "latency_p95_ms": float(np.percentile(latencies, 95)),
        "latency_p99_ms": float(np.percentile(latencies, 99)),
        "latency_std_ms": float(latencies.std(ddof=1)) if len(latencies) > 1 else 0.0,
        "warmup_runs": warmup_runs,
        "measurement_runs": len(latencies),
    }


# A measurement's pass, in the keys of the entries a resumed profiling reuses.
SCREEN_PASS, FULL_PASS = "screen", "full"


def measurement_key(config: Config, how: str) -> str:
    """What a measured entry is stored under for a resume: its pass and configuration."""
    return f"{how}|{config_key(config)}"


def profile_configurations(
    routers: TritonRouter | PodPool[Any, Any],
    configs: Sequence[tuple[Config, float | None]],
    settings: ProfileSettings,
    payload: Callable[[int], Mapping[str, Any]],
    progress: Callable[[int, int], None] | None = None,
    *,
    known: Mapping[str, Mapping[str, Any]] | None = None,
    measured: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The profiles document the planner reads; ``known`` (a resumed profiling's) entries kept."""
    pool = PodPool({routers.url: routers}) if isinstance(routers, TritonRouter) else routers
    accuracies = [accuracy for _, accuracy in configs]
    screening = settings.screen_runs > 0 and len(configs) > 1
    total = len(configs) * (2 if screening else 1)
    done = 0
    entries: dict[int, dict[str, Any]] = {}
    stored = dict(known or {})
    # The pods that have had their warm-up (ProfileSettings.pod_warmup_runs).
    warmed: set[str] = set()

    def count(passes: int) -> None:
        nonlocal done
        done += passes
        pool.limit.done, pool.limit.total = done, max(done, total)
        if progress is not None:
            progress(done, max(done, total))

    def measure_all(indices: Sequence[int], how: ProfileSettings, kind: str) -> None:
        marks = {"screened": True} if kind == SCREEN_PASS else {}
        keys = {index: measurement_key(configs[index][0], kind) for index in indices}
        reused = [index for index in indices if keys[index] in stored]
        for index in reused:
            entries[index] = dict(stored[keys[index]])
        if reused:
            count(len(reused))
        missing = [index for index in indices if keys[index] not in stored]

        def one(router: TritonRouter, index: int) -> dict[str, Any]:
            config = configs[index][0]
            if router.url not in warmed:
                # Only this pod's own thread reaches its key (a pod measures one at a time).
                warmed.add(router.url)
                warm_up(router, config, settings.pod_warmup_runs, payload, pool.limit.check)
            entry = profile_configuration(router, config, how, payload, pool.limit.check)
            return {**entry, **marks}

        def finished(position: int, pod: str, entry: dict[str, Any]) -> None:
            index = missing[position]
            entry["pod"] = pod
            entries[index] = entry
            if measured is not None:
                measured(keys[index], entry)
            count(1)

        pool.run(missing, one, finished)

    def beaten(by: set[int] | None) -> set[int]:
        means = [(accuracies[i], entries[i]["latency_mean_ms"]) for i in range(len(configs))]
        return clearly_dominated(means, settings.screen_margin, by)

    pool.limit.total = total
    pending = list(range(len(configs)))
    if screening:
        quick = ProfileSettings(warmup_runs=1, measured_runs=settings.screen_runs)
        measure_all(pending, quick, SCREEN_PASS)
        pending = sorted(set(pending) - beaten(None))
        total = len(configs) + len(pending)
    while pending:
        measure_all(pending, settings, FULL_PASS)
        # A screening's verdict stands only while one measured in full still beats it.
        full = {i for i, entry in entries.items() if not entry.get("screened")}
        pending = sorted(
            i for i, entry in entries.items() if entry.get("screened") and i not in beaten(full)
        )
        total += len(pending)
    profiles = []
    for index, accuracy in enumerate(accuracies):
        entry = entries[index]
        if accuracy is not None:
            entry["accuracy"] = accuracy
        profiles.append(entry)
    return {
        "metadata": {
            "n_configs": len(profiles),
            "warmup_runs": settings.warmup_runs,
            "measurement_runs": settings.measured_runs,
            "screen_runs": settings.screen_runs,
            "screened_out": sum(1 for entry in profiles if entry.get("screened")),
            "router": ",".join(f"{r.url}/{r.model}" for r in pool.routers.values()),
            "pods": pod_summary(pool),
        },
        "profiles": profiles,
    }


def pod_summary(pool: PodPool[Any, Any]) -> list[dict[str, Any]]:
    """Each pod of the pool: its address, what it measured, and why it left (if it did)."""
    return [
        {
            "pod": pod,
            "address": router.url,
            "measured": pool.measured.get(pod, 0),
            **({"lost": pool.lost[pod]} if pod in pool.lost else {}),
        }
        for pod, router in sorted(pool.routers.items())
    ]


@dataclass(frozen=True)
class CurveSettings:
    """The cost of one capacity curve (repeats: the run of median p95, against busy moments)."""

    requests_per_rate: int = 300
    max_points: int = MAX_CURVE_POINTS
    seed: int = 0
    seconds_per_rate: float = 10.0
    max_seconds_per_rate: float = 120.0
    repeats_per_rate: int = 1

    def requests_at(self, rate: float) -> int:
        """The requests offered at ``rate``: the bounds in seconds win over the count."""
        wanted = max(self.requests_per_rate, int(rate * self.seconds_per_rate))
        return max(MIN_REQUESTS_PER_RATE, min(wanted, int(rate * self.max_seconds_per_rate)))


def measure_curve(
    router: TritonRouter,
    config: Config,
    mean_ms: float,
    servers: int,
    payload: Callable[[int], Mapping[str, Any]],
    settings: CurveSettings = CurveSettings(),
    progress: Callable[[CurvePoint], None] | None = None,
    *,
    idle_p95_ms: float,
    slo_ms: float | None = None,
    percentile: float = 95.0,
    check: Callable[[], None] = lambda: None,
) -> CapacityCurve:
    """A configuration's latency-throughput curve by override; a failed request fails it."""
    rng = np.random.default_rng(settings.seed)

    def measure(rate: float) -> CurvePoint:
        check()
        requests = settings.requests_at(rate)
        runs = [
            measure_rate(router, config, rate, requests, payload, rng)
            for _ in range(settings.repeats_per_rate)
        ]
        return median_point(runs)

    return climb_ladder(
        mean_ms,
        servers,
        measure,
        settings.max_points,
        progress,
        idle_p95_ms=idle_p95_ms,
        slo_ms=slo_ms,
        percentile=percentile,
    )


def measure_rate(
    router: TritonRouter,
    config: Config,
    rate: float,
    requests: int,
    payload: Callable[[int], Mapping[str, Any]],
    rng: np.random.Generator,
) -> CurvePoint:
    """One curve point at ``rate``; a failed or missing reply raises CapacityError."""
    gaps = rng.exponential(1 / rate, requests)
    arrivals = np.cumsum(gaps) - gaps[0]
    records = run_load(
        router.url,
        arrivals.tolist(),
        lambda index: dict(payload(index)),
        model=router.model,
        parameters={OVERRIDE_PARAMETER: config_key(config)},
    )
    failed = [r.error for r in records if r.error is not None]
    if failed or len(records) < len(arrivals):
        reason = failed[0] if failed else "replies missing"
        raise CapacityError(
            "capacity",
            f"{len(failed) or len(arrivals) - len(records)} request(s) failed at "
            f"{rate:.2f}/s: {reason}",
            "check the server's log; profile with fewer requests per rate",
        )
    sent = np.array([r.sent_s for r in records])
    order = np.argsort(sent)
    finished = sent + np.array([r.latency_s for r in records])
    return measure_point(rate, sent[order], finished[order])
