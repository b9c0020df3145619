"""The operator's one scheduler of ParetoPolicies: every policy decides as it would alone.

Policies of both strategies tick together on the scheduler, their metrics read through a real
HTTP server serving Triton's /metrics text, shared within each tick (SharedReads), their plans
and the predictive strategy's draws shared too; each one's decisions are compared with the same
policy run alone (its own source, nothing shared) on the same queue series.
"""

from __future__ import annotations

import copy
import http.server
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from compass.controllers.policy_compile import compile_policy
from compass.controllers.policy_scheduler import ERROR_DELAY_S, PolicyScheduler
from compass.controllers.policy_status import heartbeat_due, heartbeat_phase
from compass.dataplane.live import LiveLoop
from compass.dataplane.metrics import SharedReads, TritonQueueDepth
from compass.dataplane.triton import SwitchReport, routing_key
from compass.domain.evaluation import Config
from compass.domain.policy import PolicyState
from compass_dev.scenarios import ACCURATE, FASTEST

# Queue depths, one per tick: calm, a spike the fastest member must take, calm again.
QUEUE = [0, 0, 1, 0, 2, 9, 14, 22, 30, 12, 6, 3, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]
ARRIVALS_PER_TICK = [3, 5, 2, 8, 4, 20, 25, 30, 28, 15, 9, 6, 4, 3, 2, 5, 1, 2, 3, 4, 2, 1, 3, 2]


def policy_spec(strategy: str, cooldown_s: float, slo_ms: float) -> dict[str, Any]:
    """A two-member ParetoPolicy spec (the rag-sim front the operator benches use)."""
    return {
        "front": [
            {"config": FASTEST, "accuracy": 0.8318, "latencyMeanMs": 20.5, "latencyP95Ms": 23.0},
            {"config": ACCURATE, "accuracy": 0.8604, "latencyMeanMs": 33.5, "latencyP95Ms": 37.5},
        ],
        "slo": {"latencyMs": slo_ms, "percentile": 95},
        "hysteresis": {
            "upscaleCooldownSeconds": 0,
            "downscaleCooldownSeconds": cooldown_s,
            "cooldownExponent": 0,
            "slackBufferMs": 20,
        },
        "strategy": strategy,
        "routing": {"grpcEndpoint": "triton:8001"},
        "intervalSeconds": 1,
    }


# Twelve policies: both strategies, several cooldowns and SLOs; a few with the same spec (they
# share a plan, and the predictive ones their draws).
SPECS = [
    policy_spec(strategy, cooldown, slo)
    for strategy, cooldown, slo in itertools.product(
        ("elastico", "predictive"), (2.0, 4.0), (150.0, 300.0)
    )
] + [policy_spec("elastico", 2.0, 150.0), policy_spec("predictive", 2.0, 150.0)] * 2


class MetricsPage:
    """A real HTTP server serving Triton's /metrics text for the current tick."""

    def __init__(self) -> None:
        self.tick = 0
        self.requests = 0
        page = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                page.requests += 1
                body = page.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def text(self) -> str:
        pending = QUEUE[self.tick]
        done = sum(ARRIVALS_PER_TICK[: self.tick])
        return (
            f'nv_inference_pending_request_count{{model="router",version="1"}} {pending}\n'
            f'nv_inference_request_success{{model="router",version="1"}} {done}\n'
            f'nv_inference_request_failure{{model="router",version="1"}} 0\n'
            f'nv_inference_pending_request_count{{model="other",version="1"}} 99\n'
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def page() -> Iterator[MetricsPage]:
    served = MetricsPage()
    yield served
    served.close()


@dataclass
class RecordingRouter:
    """A router that serves whatever it was last switched to (what a Triton router does)."""

    serving: str = field(default_factory=lambda: routing_key(ACCURATE))

    def active_config(self) -> str:
        return self.serving

    def switch(
        self, config: Config, blend: Config | None = None, weight: float = 0.0
    ) -> SwitchReport:
        wanted = routing_key(config, blend, weight)
        changed, self.serving = wanted != self.serving, wanted
        return SwitchReport(wanted, 1, 0.0, changed)


@dataclass
class Run:
    """One policy's loop and the decisions it made."""

    loop: LiveLoop
    state: PolicyState
    decisions: list[tuple[str, str, str]] = field(default_factory=list)

    def step(self, now: float) -> float:
        result = self.loop.step(self.state, now)
        self.state = result.state
        decision = result.decision
        self.decisions.append((decision.action.value, decision.target, decision.reason))
        return 1.0


def run_of(spec: dict[str, Any], url: str, shared: SharedReads | None) -> Run:
    compiled = compile_policy(copy.deepcopy(spec), 1)
    source = TritonQueueDepth(url, "router", shared=shared)
    loop = LiveLoop(compiled.policy, source, RecordingRouter())
    return Run(loop, loop.initial_state(0.0))


START = 1_800_000_000.0


def test_every_policy_decides_on_the_scheduler_as_it_does_alone(page: MetricsPage) -> None:
    alone = []
    for spec in SPECS:
        run = run_of(spec, page.url, shared=None)
        for tick in range(len(QUEUE)):
            page.tick = tick
            run.step(START + tick)
        alone.append(run)
    requests_alone = page.requests

    clock = [0.0]
    scheduler = PolicyScheduler(
        1.0, workers=4, clock=lambda: clock[0], wall=lambda: START + clock[0]
    )
    together = [run_of(spec, page.url, shared=scheduler.reads) for spec in SPECS]
    for index, run in enumerate(together):
        scheduler.add(("ns", f"p{index}", f"uid-{index}"), run.step)
    page.requests = 0
    try:
        for tick in range(len(QUEUE)):
            page.tick, clock[0] = tick, float(tick)
            scheduler.tick_once(wait=True)
    finally:
        scheduler.stop()

    for spec, one, many in zip(SPECS, alone, together, strict=True):
        assert many.decisions == one.decisions, spec["strategy"]
        assert many.state == one.state
    # The spike made them act: the series is one the policies decide differently on.
    actions = {action for run in alone for action, _, _ in run.decisions}
    assert {"faster", "more-accurate", "hold"} <= actions
    assert len({tuple(run.decisions) for run in alone}) > 1
    # One scrape a tick for all of them; alone, one a policy a tick.
    assert page.requests == len(QUEUE)
    assert requests_alone == len(QUEUE) * len(SPECS)
    # Policies with the same front share the predictive strategy's draws and their plan.
    predictive = [r.loop.policy for r in together if type(r.loop.policy).__name__ == "Predictive"]
    assert len({id(p.paths) for p in predictive}) == 1  # type: ignore[attr-defined]


def test_a_policy_runs_once_at_a_time_and_when_its_delay_says(page: MetricsPage) -> None:
    clock = [0.0]
    scheduler = PolicyScheduler(1.0, workers=2, clock=lambda: clock[0], wall=lambda: clock[0])
    seen: dict[str, list[float]] = {"steady": [], "backing-off": [], "broken": []}

    def steady(now: float) -> float:
        seen["steady"].append(now)
        return 1.0

    def backing_off(now: float) -> float:
        seen["backing-off"].append(now)
        return 3.0

    def broken(now: float) -> float:
        seen["broken"].append(now)
        raise RuntimeError("a bug")

    scheduler.add(("ns", "a", "1"), steady)
    scheduler.add(("ns", "b", "2"), backing_off)
    scheduler.add(("ns", "c", "3"), broken)
    try:
        for tick in range(12):
            clock[0] = float(tick)
            scheduler.tick_once(wait=True)
            if tick == 7:
                scheduler.remove(("ns", "a", "1"))
    finally:
        scheduler.stop()
    assert seen["steady"] == [float(t) for t in range(8)]
    assert seen["backing-off"] == [0.0, 3.0, 6.0, 9.0]
    assert seen["broken"] == [0.0, ERROR_DELAY_S, 2 * ERROR_DELAY_S]
    assert scheduler.keys() == {("ns", "b", "2"), ("ns", "c", "3")}


def test_a_removed_daemons_successor_keeps_its_place() -> None:
    scheduler = PolicyScheduler(1.0)

    def first(now: float) -> float:
        return 1.0

    def second(now: float) -> float:
        return 1.0

    scheduler.add(("ns", "a", "1"), first)
    scheduler.add(("ns", "a", "1"), second)  # kopf resumed the daemon before the old one ended
    scheduler.remove(("ns", "a", "1"), first)
    assert scheduler.keys() == {("ns", "a", "1")}
    scheduler.remove(("ns", "a", "1"), second)
    assert len(scheduler) == 0
    scheduler.stop()


def test_routine_status_writes_spread_over_the_heartbeat() -> None:
    heartbeat = 60.0
    phases = [heartbeat_phase(f"uid-{i}") for i in range(1000)]
    writes_per_second = [0] * 600
    longest_gap = 0.0
    for phase in phases:
        last = None
        for second in range(600):
            if heartbeat_due(float(second), last, heartbeat, phase):
                writes_per_second[second] += 1
                gap = second if last is None else second - last
                longest_gap = max(longest_gap, gap)
                last = float(second)
    steady = writes_per_second[120:]
    # 1,000 policies at one write a heartbeat: ~17 a second, never all at once.
    assert sum(steady) / len(steady) == pytest.approx(1000 / heartbeat, rel=0.15)
    assert max(steady) < 60
    # Each policy still writes at least once every one and a half heartbeats.
    assert longest_gap <= 1.5 * heartbeat


def test_a_slow_tick_holds_one_worker_while_the_others_run_the_rest() -> None:
    """A tick waiting on I/O keeps one of the workers; the round's other due ticks all run
    meanwhile on the others, each once, and the slow one's policy is not started again while
    it runs."""
    scheduler = PolicyScheduler(1.0, workers=3)
    release = threading.Event()
    ran: list[str] = []

    def slow(now: float) -> float:
        release.wait(10)
        ran.append("slow")
        return 1.0

    def quick(name: str) -> Callable[[float], float]:
        def tick(now: float) -> float:
            ran.append(name)
            return 1.0

        return tick

    scheduler.add(("ns", "slow", "0"), slow)
    names = [f"p{i}" for i in range(40)]
    for i, name in enumerate(names):
        scheduler.add(("ns", name, str(i + 1)), quick(name))
    try:
        futures = scheduler.tick_once()
        for _ in range(500):  # the quick ticks end on the other workers while "slow" waits
            if len(ran) == len(names):
                break
            time.sleep(0.01)
        assert sorted(ran) == sorted(names)  # every quick tick ran, once, before the slow one
        scheduler.tick_once()  # the slow policy is still running: not started twice
        assert scheduler.stats.skipped_running == 1
        release.set()
        for future in futures:
            future.result(timeout=5)
    finally:
        release.set()
        scheduler.stop()
    assert ran.count("slow") == 1
