"""Profiling over several pods (compass.dataplane.podpool, profiler): each pod measures one
configuration at a time, every configuration is measured once, the profiles merge the same way
whichever pod measured what, a resumed profiling measures nothing twice, and a time bound stops
it with a message saying how far it got.

The pods here are simulated routers (service times fixed per configuration and sample, a short
real sleep so that pods overlap); tests/triton/test_profiler.py profiles over two real servers.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from compass.dataplane.podpool import PodPool, ProfilingTimeLimitError, TimeLimit
from compass.dataplane.profiler import (
    FULL_PASS,
    ProfileSettings,
    mean_component_times,
    profile_configurations,
)
from compass.dataplane.triton import RouterReply, RoutingError, TritonRouter
from compass.domain.evaluation import Config
from compass.domain.space import config_key

CONFIGS: list[tuple[Config, float | None]] = [
    ({"generator": name, "k": k}, 0.9 - 0.01 * i)
    for i, (name, k) in enumerate((n, k) for n in ("big", "mid", "small") for k in (1, 5, 10))
]


class SimulatedPod(TritonRouter):
    """A pod whose service time is fixed by (configuration, sample), so any pod measures the
    same latencies; it records every request and how many configurations it serves at once.
    Its first ``cold`` requests take 0.5 s more, whatever they ask for (instances starting)."""

    def __init__(self, name: str, sleep_s: float = 0.002, cold: int = 0) -> None:
        super().__init__(f"{name}:8001")  # the channel is never used: infer is simulated
        self.sleep_s = sleep_s
        self.cold = cold
        self.requests: Counter[str] = Counter()
        self.serving: set[str] = set()
        self.most_at_once = 0
        self.lock = threading.Lock()

    def infer(
        self,
        request: Mapping[str, Any],
        config: Config | None = None,
        timeout_s: float | None = None,
        deadline_ns: int | None = None,
        **options: Any,
    ) -> RouterReply:
        assert config is not None
        key = config_key(config)
        with self.lock:
            self.serving.add(key)
            self.most_at_once = max(self.most_at_once, len(self.serving))
            self.requests[key] += 1
        time.sleep(self.sleep_s)
        with self.lock:
            self.serving.discard(key)
        sample = int(request["sample"])
        latency = 0.01 * (1 + len(key) % 7) * (1 + (sample * 37 + len(key)) % 11 / 10)
        if self.requests.total() <= self.cold:
            latency += 0.5
        return RouterReply({"score": 1.0}, key, latency)


def _pool(pods: int, **limit: Any) -> tuple[PodPool[Any, Any], list[SimulatedPod]]:
    routers = [SimulatedPod(f"pod-{i}") for i in range(pods)]
    bound = TimeLimit(**limit) if limit else TimeLimit(None, "")
    return PodPool({r.url: r for r in routers}, bound), routers


def _payload(index: int) -> dict[str, Any]:
    return {"sample": index % 20}


def _without_pods(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "pod"} for e in document["profiles"]]


def test_each_pod_measures_one_item_at_a_time_and_every_item_once() -> None:
    """Four pods, 30 items of uneven length: no pod ever holds two at once, all four work at
    once, each item is measured exactly once, and the results come in the items' order."""
    pool, routers = _pool(4)
    running: Counter[str] = Counter()
    most: Counter[str] = Counter()
    measured: Counter[int] = Counter()
    together = [0, 0]
    lock = threading.Lock()

    def measure(router: TritonRouter, item: int) -> int:
        with lock:
            running[router.url] += 1
            most[router.url] = max(most[router.url], running[router.url])
            together[0] += 1
            together[1] = max(together[1], together[0])
            measured[item] += 1
        time.sleep(0.001 * (1 + item % 5))
        with lock:
            running[router.url] -= 1
            together[0] -= 1
        return item * 10

    done: dict[int, tuple[str, int]] = {}
    pool.run(list(range(30)), measure, lambda index, pod, value: done.update({index: (pod, value)}))
    results = [done[index] for index in range(30)]
    assert [value for _, value in results] == [item * 10 for item in range(30)]
    assert measured == Counter(range(30))
    assert set(most.values()) == {1}
    assert together[1] == 4
    assert {pod for pod, _ in results} == {r.url for r in routers}
    assert sum(pool.measured.values()) == 30


def test_a_pod_that_cannot_be_reached_gives_its_item_back_and_leaves() -> None:
    """pod-1 fails: its item is measured on another pod, the rest go on without it, and the
    pool names it with the reason; with every pod gone, the error says so."""
    pool, _ = _pool(3)

    def measure(router: TritonRouter, item: int) -> int:
        if router.url == "pod-1:8001":
            raise RoutingError("Triton at pod-1:8001: connection refused")
        time.sleep(0.001)
        return item

    done: dict[int, tuple[str, int]] = {}
    pool.run(list(range(12)), measure, lambda index, pod, value: done.update({index: (pod, value)}))
    results = [done[index] for index in range(12)]
    assert [value for _, value in results] == list(range(12))
    assert "pod-1:8001" not in {pod for pod, _ in results}
    assert pool.lost == {"pod-1:8001": "Triton at pod-1:8001: connection refused"}
    assert pool.pods == ["pod-0:8001", "pod-2:8001"]

    def unreachable(router: TritonRouter, item: int) -> int:
        raise RoutingError(f"Triton at {router.url}: connection refused")

    with pytest.raises(RoutingError, match=r"no pod left to measure on: pod-0:8001: Triton"):
        pool.run([1, 2], unreachable, lambda index, pod, value: None)


def test_the_merged_profiles_are_the_same_on_one_pod_and_on_three() -> None:
    """Whichever pod measured a configuration, and in whatever order they ended, the profiles
    are in the configurations' order with the same statistics; each names its pod, and the
    metadata counts each pod's measurements."""
    settings = ProfileSettings(warmup_runs=1, measured_runs=8, pod_warmup_runs=0)
    one_pool, _ = _pool(1)
    three_pool, routers = _pool(3)
    alone = profile_configurations(one_pool, CONFIGS, settings, _payload)
    spread = profile_configurations(three_pool, CONFIGS, settings, _payload)
    assert _without_pods(spread) == _without_pods(alone)
    assert [e["config"] for e in spread["profiles"]] == [c for c, _ in CONFIGS]
    pods = {e["pod"] for e in spread["profiles"]}
    assert len(pods) > 1
    assert pods <= {r.url for r in routers}
    summary = spread["metadata"]["pods"]
    assert [p["pod"] for p in summary] == sorted(r.url for r in routers)
    assert sum(p["measured"] for p in summary) == len(CONFIGS)
    assert max(r.most_at_once for r in routers) == 1
    # Each configuration's requests (warm-up + measured) went to one pod only.
    for config, _ in CONFIGS:
        served = [r.requests[config_key(config)] for r in routers]
        assert sorted(served) == [0, 0, 9]


def test_each_pods_cold_start_is_warmed_off_before_its_first_measurement() -> None:
    """Each pod gets pod_warmup_runs requests before the first configuration it measures, so
    its cold ones land in no profile: the first configuration's mean is its warm one. Without
    them the cold requests past the per-configuration warm-up land in that profile."""
    settings = ProfileSettings(warmup_runs=1, measured_runs=8, pod_warmup_runs=6)
    warm = [SimulatedPod(f"pod-{i}") for i in range(2)]
    reference = profile_configurations(
        PodPool({r.url: r for r in warm}, TimeLimit(None, "")),
        CONFIGS,
        replace(settings, pod_warmup_runs=0),
        _payload,
    )
    for pod_warmup, distorted in ((6, False), (0, True)):
        cold = [SimulatedPod(f"pod-{i}", cold=5) for i in range(2)]
        document = profile_configurations(
            PodPool({r.url: r for r in cold}, TimeLimit(None, "")),
            CONFIGS,
            replace(settings, pod_warmup_runs=pod_warmup),
            _payload,
        )
        means = [e["latency_mean_ms"] for e in document["profiles"]]
        expected = [e["latency_mean_ms"] for e in reference["profiles"]]
        assert (means != pytest.approx(expected)) is distorted
        # The warm-up is one per pod, on the first configuration it measures, and unmeasured.
        extra = sum(r.requests.total() for r in cold) - len(CONFIGS) * 9
        assert extra == 2 * pod_warmup
        assert all(e["measurement_runs"] == 8 for e in document["profiles"])


def test_a_resumed_profiling_measures_only_what_was_not_finished() -> None:
    """A profiling cut off after some configurations resumes from the entries it recorded:
    those are not requested again, and the profiles equal an uninterrupted profiling's."""
    settings = ProfileSettings(warmup_runs=1, measured_runs=6)
    recorded: dict[str, dict[str, Any]] = {}

    class CutOffError(Exception):
        pass

    def record(key: str, entry: dict[str, Any]) -> None:
        if len(recorded) == 4:
            raise CutOffError
        recorded[key] = dict(entry)

    first, _ = _pool(2)
    with pytest.raises(CutOffError):
        profile_configurations(first, CONFIGS, settings, _payload, measured=record)
    assert len(recorded) == 4
    assert all(key.startswith(f"{FULL_PASS}|") for key in recorded)
    second, routers = _pool(2)
    seen: list[tuple[int, int]] = []
    resumed = profile_configurations(
        second,
        CONFIGS,
        settings,
        _payload,
        lambda done, total: seen.append((done, total)),
        known=recorded,
    )
    requested = {key for r in routers for key in r.requests}
    done_before = {key.split("|", 1)[1] for key in recorded}
    assert requested == {config_key(c) for c, _ in CONFIGS} - done_before
    whole, _ = _pool(2)
    assert _without_pods(resumed) == _without_pods(
        profile_configurations(whole, CONFIGS, settings, _payload)
    )
    # The progress counts the reused ones first, then each one measured.
    assert seen[0] == (4, len(CONFIGS))
    assert seen[-1] == (len(CONFIGS), len(CONFIGS))


def test_screening_resumes_to_the_same_verdicts() -> None:
    """With screening, a resumed profiling replays the recorded passes and reaches the same
    screened-out set as one that was never cut off."""
    settings = ProfileSettings(
        warmup_runs=1, measured_runs=10, screen_runs=3, screen_margin=0.1, pod_warmup_runs=0
    )
    recorded: dict[str, dict[str, Any]] = {}
    whole_pool, _ = _pool(3)
    whole = profile_configurations(
        whole_pool, CONFIGS, settings, _payload, measured=lambda k, e: recorded.update({k: e})
    )
    assert any(key.startswith("screen|") for key in recorded)
    partial = dict(list(recorded.items())[: len(CONFIGS) + 1])  # every screening, one full
    again_pool, routers = _pool(3)
    again = profile_configurations(again_pool, CONFIGS, settings, _payload, known=partial)
    assert _without_pods(again) == _without_pods(whole)
    assert again["metadata"]["screened_out"] == whole["metadata"]["screened_out"]
    full_passes = sum(1 for key in recorded if key.startswith(f"{FULL_PASS}|"))
    per_pass = settings.warmup_runs + settings.measured_runs
    assert sum(sum(r.requests.values()) for r in routers) == per_pass * (full_passes - 1)


def test_past_its_bound_the_profiling_stops_saying_how_far_it_got_and_the_fix() -> None:
    """A bound of 1 s on a clock that passes it after three configurations: the pool hands out
    no more, and the error names the field, the count and what to change."""
    now = [0.0]
    pool, routers = _pool(1, max_seconds=1, field="spec.profiling.maxSeconds", clock=lambda: now[0])

    def passing(done: int, total: int) -> None:
        if done == 3:
            now[0] = 2.0

    settings = ProfileSettings(warmup_runs=1, measured_runs=4)
    with pytest.raises(ProfilingTimeLimitError) as error:
        profile_configurations(pool, CONFIGS, settings, _payload, passing)
    message = str(error.value)
    assert "bound of 1 s (spec.profiling.maxSeconds)" in message
    assert f"with 3 of {len(CONFIGS)} measurements done" in message
    assert "raise spec.profiling.maxSeconds" in message
    assert len(routers[0].requests) == 3


def test_a_measurement_in_flight_stops_at_its_next_request_past_the_bound() -> None:
    """The bound is checked before every request, so a long measurement does not run on past
    it: a clock of 0.1 s a request stops a 50-request measurement after 11 requests."""
    routers: list[SimulatedPod] = []
    pool, routers = _pool(
        1, max_seconds=1, field="--max-seconds", clock=lambda: 0.1 * routers[0].requests.total()
    )
    with pytest.raises(ProfilingTimeLimitError, match=r"with 0 of 9 measurements done"):
        profile_configurations(pool, CONFIGS, ProfileSettings(1, 50), _payload)
    assert routers[0].requests.total() == 11


def test_component_times_are_averaged_only_where_every_reply_timed_them() -> None:
    replies = [{"retriever": 10.0, "generator": 30.0}, {"retriever": 20.0}]
    # A model a reply did not call counts 0 there (a pipeline may skip a stage).
    assert mean_component_times(replies) == {"generator": 15.0, "retriever": 15.0}
    assert mean_component_times([*replies, None]) is None
    assert mean_component_times([]) is None
    assert mean_component_times([{}]) is None
