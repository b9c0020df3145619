"""`compass job profile --state NAME`: the profiling Job, run inside its pods.

It measures the latency of the search's feasible configurations through the router, over every
ready pod of the workflow's Service, then (with the measured threshold model) the capacity curve
of each configuration on the front. Each measurement goes into the state ConfigMap as it ends,
so a retried pod resumes without measuring it again; the whole profiling stops past
spec.profiling.maxSeconds, counted from its first pod's start.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from compass.api.compoundworkflow import CompoundWorkflowSpec, Profiling
from compass.commands.job_state import StateStore
from compass.commands.job_triton import triton_pods, triton_tls
from compass.console import describe_work_rate
from compass.controllers.builders import (
    PARTIAL_STARTED_FIELD,
    PROFILE_PARTIAL_KEY,
    PROFILE_PROGRESS_KEY,
    PROFILES_KEY,
    RESULT_KEY,
    SPEC_KEY,
)
from compass.controllers.workflow_plan import ladder_budget_ms
from compass.dataplane.podpool import PodPool, ProfilingTimeLimitError, TimeLimit
from compass.dataplane.profiler import (
    CurveSettings,
    ProfileSettings,
    measure_curve,
    pod_summary,
    profile_configurations,
)
from compass.dataplane.triton import TritonRouter
from compass.domain.capacity import CurvePoint
from compass.domain.planner import ThresholdModel, pareto_front
from compass.domain.profiles import parse_profiles

# The progress's clock for its rates.
monotonic = time.monotonic
# The profiling's clock for its maxSeconds, which counts across its pods' retries.
wall_clock = time.time


class ProfileReporter:
    """The profiling's progress in the state (for the workflow's status) and the Job's log, and
    its measurements so far (for a retried pod to resume from), written as each one ends."""

    def __init__(self, store: StateStore, partial: dict[str, Any], limit: TimeLimit, pods: int):
        self.store = store
        self.partial = partial
        self.limit = limit
        self.pods = pods
        self.lock = threading.Lock()
        self.phase = "latency"
        self.started = monotonic()
        self.done_at_start: int | None = None  # what this pod reused: its rate counts the rest

    def entry(self, key: str, entry: dict[str, Any]) -> None:
        """A configuration's latency measured (written with the progress that follows)."""
        self.partial.setdefault("entries", {})[key] = entry

    def curve(self, key: str, measured: dict[str, Any]) -> None:
        """A capacity curve measured (written with the progress that follows)."""
        self.partial.setdefault("curves", {})[key] = measured

    def progress(self, done: int, total: int, **extra: Any) -> None:
        """done of total in the current phase: to the state and the log."""
        with self.lock:
            if self.done_at_start is None:
                self.done_at_start = done
            unit = "curves" if self.phase == "capacity" else "configs"
            rate = describe_work_rate(
                done - self.done_at_start,
                total - self.done_at_start,
                monotonic() - self.started,
                unit,
            )
            bound = "" if self.limit.max_seconds is None else f" of {self.limit.max_seconds:g}"
            document = {
                "phase": self.phase,
                "done": done,
                "total": total,
                "pods": self.pods,
                "rate": rate,
                "elapsed_s": round(self.limit.elapsed(), 1),
                "max_seconds": self.limit.max_seconds,
                **extra,
            }
            self._write(document)
            print(
                f"profiling: {self.phase} {done}/{total} on {self.pods} pod(s), {rate}, "
                f"{self.limit.elapsed():.0f}{bound} s",
                flush=True,
            )

    def next_phase(self, phase: str) -> None:
        """The capacity curves start: their rate is their own."""
        with self.lock:
            self.phase, self.started, self.done_at_start = phase, monotonic(), None

    def stopped(self, message: str) -> None:
        """The time limit passed: the status says so, the measurements so far are kept."""
        with self.lock:
            self._write({"phase": "stopped", "pods": self.pods, "message": message})

    def _write(self, progress: dict[str, Any]) -> None:
        """The progress and the measurements so far, to the state (the lock held)."""
        partial = json.dumps(self.partial)
        self.store.write({PROFILE_PROGRESS_KEY: json.dumps(progress), PROFILE_PARTIAL_KEY: partial})


def _partial(state: Mapping[str, str]) -> dict[str, Any]:
    """The measurements an earlier pod of this profiling made (none if unreadable)."""
    try:
        partial = json.loads(state.get(PROFILE_PARTIAL_KEY) or "{}")
    except ValueError:
        return {}
    return partial if isinstance(partial, dict) else {}


def run_profile(state_name: str, namespace: str) -> int:
    """Profile the search's feasible configurations (the module's docstring says how)."""
    store = StateStore(state_name, namespace)
    state = store.read()
    spec = CompoundWorkflowSpec.model_validate_json(state[SPEC_KEY])
    result: dict[str, Any] = json.loads(state[RESULT_KEY])
    configs = [(entry["config"], entry["accuracy"]) for entry in result["feasible"]]
    pods, source = triton_pods(spec, namespace)
    tls = triton_tls(spec, namespace)
    routers = {
        pod.name: TritonRouter(pod.grpc_url, model=spec.triton.router_model, tls=tls)
        for pod in pods
    }
    partial = _partial(state)
    started = float(partial.setdefault(PARTIAL_STARTED_FIELD, wall_clock()))
    limit = TimeLimit(spec.profiling.max_seconds, "spec.profiling.maxSeconds", started, wall_clock)
    pool: PodPool[Any, Any] = PodPool(routers, limit)
    reporter = ProfileReporter(store, partial, limit, len(routers))
    known = dict(partial.get("entries") or {})
    print(
        f"profiling {len(configs)} configurations on {len(routers)} pod(s) ({source}); "
        f"{len(known)} measurements reused",
        flush=True,
    )
    size = spec.evaluation.dataset.size

    def payload(index: int) -> dict[str, Any]:
        return {"sample": index % size}

    try:
        # The status says how far it is from the start (a configuration can take minutes).
        reporter.progress(min(len(known), len(configs)), len(configs))
        document = profile_configurations(
            pool,
            configs,
            ProfileSettings(spec.profiling.warmup_runs, spec.profiling.measured_runs),
            payload,
            reporter.progress,
            known=known,
            measured=reporter.entry,
        )
        if spec.serving.threshold_model is ThresholdModel.MEASURED:
            document = _with_curves(pool, spec, document, payload, reporter)
    except ProfilingTimeLimitError as error:
        reporter.stopped(str(error))
        raise
    finally:
        for router in routers.values():
            router.close()
    document["metadata"]["pods"] = pod_summary(pool)
    done = {"phase": "done", "pods": len(routers), "elapsed_s": round(limit.elapsed(), 1)}
    store.write(
        {
            PROFILES_KEY: json.dumps(document),
            PROFILE_PROGRESS_KEY: json.dumps(done),
            PROFILE_PARTIAL_KEY: None,
        }
    )
    print(f"profiled {len(configs)} configurations in {limit.elapsed():.0f} s")
    return 0


def curve_settings(profiling: Profiling) -> CurveSettings:
    """What the spec's profiling settings ask of each capacity curve."""
    return CurveSettings(
        profiling.curve_requests_per_rate,
        profiling.curve_max_points,
        seconds_per_rate=profiling.curve_min_seconds_per_rate,
        max_seconds_per_rate=profiling.curve_max_seconds_per_rate,
        repeats_per_rate=profiling.curve_repeats_per_rate,
    )


def _with_curves(
    pool: PodPool[Any, Any],
    spec: CompoundWorkflowSpec,
    document: dict[str, Any],
    payload: Callable[[int], dict[str, Any]],
    reporter: ProfileReporter,
) -> dict[str, Any]:
    """The profiles with a capacity curve on every member of the front (the others cannot be
    served by the policy, so their curves would buy nothing): each curve measured on whichever
    pod is free, one curve a pod at a time, and named with that pod (``capacity_pod``; the
    planner's thresholds are per server, so one pod's curve is what it reads)."""
    profiles = parse_profiles(document)
    front = pareto_front(profiles, spec.slo.percentile).members
    on_front = {profile.key for profile in front}
    settings = curve_settings(spec.profiling)
    entries = document["profiles"]
    members = [
        (entry, profile)
        for entry, profile in zip(entries, profiles, strict=True)
        if profile.key in on_front
    ]
    stored: dict[str, Any] = reporter.partial.get("curves") or {}
    missing = []
    for entry, profile in members:
        key = profile.key
        if key in stored:
            entry["capacity"], entry["capacity_pod"] = stored[key]["capacity"], stored[key]["pod"]
        else:
            missing.append((entry, profile))
    reporter.next_phase("capacity")
    done = len(members) - len(missing)
    pool.limit.done, pool.limit.total = done, len(members)
    reporter.progress(done, len(members))

    def measure(router: TritonRouter, member: tuple[dict[str, Any], Any]) -> Any:
        profile = member[1]

        def point(measured: CurvePoint) -> None:
            print(
                f"capacity of {profile.name} on {router.url}: {measured.offered_qps:.3f}/s, "
                f"p95 {measured.latency_at(95):.1f} ms",
                flush=True,
            )

        return measure_curve(
            router,
            profile.config,
            profile.mean_ms,
            spec.serving.router_instances,
            payload,
            settings,
            point,
            idle_p95_ms=profile.latency_at(95.0),
            slo_ms=ladder_budget_ms(spec),
            percentile=spec.slo.percentile,
            check=pool.limit.check,
        )

    def finished(index: int, pod: str, curve: Any) -> None:
        nonlocal done
        entry, profile = missing[index]
        entry["capacity"], entry["capacity_pod"] = curve.to_json(), pod
        reporter.curve(profile.key, {"capacity": entry["capacity"], "pod": pod})
        done += 1
        pool.limit.done = done
        drain = (
            f"drains {curve.saturation_qps:.2f}/s saturated"
            if curve.saturated
            else f"never saturated (served {curve.saturation_qps:.2f}/s, a lower bound)"
        )
        print(f"capacity of {profile.name} on {pod}: {drain}", flush=True)
        reporter.progress(done, len(members), configuration=profile.name)

    pool.run(missing, measure, finished)
    return document
