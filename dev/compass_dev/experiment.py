"""One serving run on a live Triton: seeded open-loop load, a static configuration or Elastico.

What `compass demo` and `bench/serving_triton.py` measure. Runs may be time-scaled (service
times, arrivals, SLO and cooldowns shrunk together, which leaves the queueing unchanged in
scaled time); a `LiveRun` reports at the unscaled time, so it compares with the simulator's
`RunReport` on the same scenario.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from compass.dataplane.fleet import RouterFleet
from compass.dataplane.live import LiveLoop, StepResult
from compass.dataplane.load import RequestRecord, run_load
from compass.dataplane.metrics import QueueDepthSource
from compass.dataplane.triton import TritonRouter
from compass.domain.evaluation import Config
from compass.domain.planner import Plan
from compass.domain.profiles import LatencyProfile
from compass.domain.simulator import Tick
from compass.domain.space import config_key
from compass.domain.strategy import StrategyPolicy

FloatArray = npt.NDArray[np.float64]
# Long enough for Triton's queue gauge to read empty after the previous run.
SETTLE_S = 1.0
OBSERVED_WINDOW_S = 5.0  # unscaled: the arrival rate drawn on the timeline


@dataclass(frozen=True)
class SwitchEvent:
    """A switch the live loop made: when (s from the load's start), to what, and how long the
    switch call took (real seconds: to every pod, for a fleet)."""

    time_s: float
    config: str
    switch_s: float


@dataclass(frozen=True)
class LiveRun:
    """The requests and (for a policy) the decisions of one run, in unscaled seconds and ms."""

    label: str
    slo_ms: float
    sent: int
    records: tuple[RequestRecord, ...]
    ticks: tuple[Tick, ...] = ()
    switch_events: tuple[SwitchEvent, ...] = ()
    reasons: tuple[tuple[float, str], ...] = field(default=())

    @property
    def answered(self) -> tuple[RequestRecord, ...]:
        """The requests that got an answer."""
        return tuple(r for r in self.records if r.error is None)

    @property
    def refused(self) -> int:
        """Requests admission refused as late (misses, not failures)."""
        return sum(r.refused for r in self.records)

    @property
    def failed(self) -> int:
        """Requests that failed or never returned (a refusal is neither)."""
        return self.sent - len(self.answered) - self.refused

    @property
    def arrivals_s(self) -> FloatArray:
        """When each answered request was sent."""
        return np.array([r.sent_s for r in self.answered], dtype=np.float64)

    @property
    def latencies_ms(self) -> FloatArray:
        """Each answered request's latency."""
        return np.array([r.latency_s * 1000 for r in self.answered], dtype=np.float64)

    @property
    def compliance(self) -> float:
        """% of the requests sent that were answered within the SLO (a failure is a miss)."""
        within = int(np.sum(self.latencies_ms <= self.slo_ms))
        return 100.0 * within / max(self.sent, 1)

    @property
    def accuracy(self) -> float:
        """Mean score of the answered requests that returned one."""
        scores = [r.score for r in self.answered if r.score is not None]
        return float(np.mean(scores)) if scores else float("nan")

    @property
    def served_keys(self) -> tuple[str | None, ...]:
        """The configuration key that served each answered request (None: it did not say)."""
        return tuple(config_key(json.loads(r.config)) if r.config else None for r in self.answered)

    def served_accuracy(self, front: Sequence[LatencyProfile]) -> float:
        """Mean profiled accuracy of the ``front`` members that served the answered requests:
        what the simulator and the oracle count, free of the luck of which questions each
        member happened to draw."""
        accuracy_of = {member.key: member.accuracy for member in front}
        served = []
        for key in self.served_keys:
            if key is not None:
                if key not in accuracy_of:
                    raise ValueError(f"served by {key}, which is not on the front given")
                served.append(accuracy_of[key])
        return float(np.mean(served)) if served else float("nan")

    def percentile_ms(self, q: float) -> float:
        """A latency percentile of the answered requests."""
        latencies = self.latencies_ms
        return float(np.percentile(latencies, q)) if len(latencies) else float("nan")

    @property
    def switches(self) -> int:
        """How many switches took effect."""
        return len(self.switch_events)

    def switch_effects_s(self) -> list[float]:
        """Per switch: from the decision to the first reply served by the new configuration."""
        effects = []
        for event in self.switch_events:
            served = [
                r.sent_s + r.latency_s
                for r in self.answered
                if r.config == event.config and r.sent_s + r.latency_s > event.time_s
            ]
            if served:
                effects.append(min(served) - event.time_s)
        return effects


def run_live_loop(
    loop: LiveLoop,
    interval_s: float,
    origin: float,
    stop: threading.Event,
    on_step: Callable[[float, StepResult], None],
) -> None:
    """Step the loop every interval until ``stop``; hand each step to ``on_step(t, result)``."""
    state = loop.initial_state(time.monotonic())
    while not stop.is_set():
        tick = time.monotonic()
        result = loop.step(state, tick)
        state = result.state
        on_step(tick - origin, result)
        stop.wait(max(0.0, interval_s - (time.monotonic() - tick)))


Routing = TritonRouter | RouterFleet


def load_urls(router: Routing) -> list[str]:
    """The gRPC addresses the load goes to: the one server, or every pod of the fleet."""
    if isinstance(router, RouterFleet):
        return [endpoint.grpc_url for endpoint in router.endpoints]
    return [router.url]


def serve(
    router: Routing,
    label: str,
    start: Config | None,
    arrivals_s: Sequence[float],
    payload: Callable[[int], dict[str, Any]],
    slo_ms: float,
    *,
    loop: LiveLoop | None = None,
    interval_s: float = 1.0,
    time_scale: float = 1.0,
    offered_qps: Callable[[float], float] | None = None,
    replicas: Sequence[int] | None = None,
    deadlines: bool = False,
) -> LiveRun:
    """Serve the (scaled) arrivals from ``start`` (None: what the router serves, untouched: the
    operator's, with the tables it sent); with a loop, Elastico switches meanwhile.

    ``arrivals_s``, ``interval_s`` and the loop's policy are in scaled time; ``slo_ms`` and
    ``offered_qps(t)`` unscaled. The run is reported unscaled. With a fleet, request i goes to
    pod ``replicas[i]`` (the scenario's assignment). With ``deadlines`` each request carries
    the SLO as its deadline, for the routers' admission.
    """
    if start is not None:
        router.switch(start)
    time.sleep(SETTLE_S)
    ticks: list[Tick] = []
    switches: list[SwitchEvent] = []
    reasons: list[tuple[float, str]] = []
    counts: list[tuple[float, float]] = []  # (unscaled s, arrivals counter) for the rate
    names = [th.profile.name for th in loop.policy.plan.thresholds] if loop is not None else []

    def on_step(t: float, result: StepResult) -> None:
        at = t / time_scale
        observation = result.observation
        if observation is not None and observation.arrivals_total is not None:
            counts.append((at, observation.arrivals_total))
        window = [c for c in counts if c[0] >= at - OBSERVED_WINDOW_S]
        observed = (
            (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])
            if len(window) > 1 and window[-1][0] > window[0][0]
            else float("nan")
        )
        active = result.state.active
        ticks.append(
            Tick(
                time_s=at,
                offered_qps=offered_qps(at) if offered_qps is not None else float("nan"),
                observed_qps=observed,
                queue_depth=round(observation.queue_depth) if observation is not None else 0,
                active=names.index(active) if active in names else 0,
                switched=result.switch is not None,
            )
        )
        if result.switch is not None:
            switches.append(SwitchEvent(at, result.switch.config, result.switch.seconds))
            reasons.append((at, result.decision.reason))

    stop = threading.Event()
    origin = time.monotonic()
    thread = None
    if loop is not None:
        thread = threading.Thread(
            target=run_live_loop, args=(loop, interval_s, origin, stop, on_step), daemon=True
        )
        thread.start()
    try:
        records = run_load(
            load_urls(router),
            arrivals_s,
            payload,
            model=router.model,
            replicas=replicas,
            deadline_s=slo_ms * time_scale / 1000 if deadlines else None,
        )
    finally:
        stop.set()
        if thread is not None:
            thread.join()
    unscaled = tuple(
        RequestRecord(r.sent_s / time_scale, r.latency_s / time_scale, r.config, r.score, r.error)
        for r in records
    )
    return LiveRun(
        label=label,
        slo_ms=slo_ms,
        sent=len(arrivals_s),
        records=unscaled,
        ticks=tuple(ticks),
        switch_events=tuple(switches),
        reasons=tuple(reasons),
    )


RUNS = ("fastest", "accurate", "policy", "policy+adm")
# The run whose requests carry deadlines and whose routers judge them (admission at dispatch).
ADMITTED_RUN = "policy+adm"
# Late binding (issue 43): every request carries its deadline and every router binds it from
# the table it was given; by default no policy loop (the table's rate limits are its slow loop,
# and a request with a deadline never reads the active configuration).
BINDING_RUN = "binding"
EVERY_RUN = (*RUNS, BINDING_RUN)


def serve_each(
    router: Routing,
    plan: Plan,
    policy: StrategyPolicy,
    queue: QueueDepthSource,
    arrivals_s: Sequence[float],
    payload: Callable[[int], dict[str, Any]],
    slo_ms: float,
    *,
    interval_s: float,
    time_scale: float = 1.0,
    offered_qps: Callable[[float], float] | None = None,
    labels: Collection[str] = RUNS[:3],
    replicas: Sequence[int] | None = None,
    admission: Mapping[str, Any] | None = None,
    admitted_policy: StrategyPolicy | None = None,
    binding: Mapping[str, Any] | None = None,
    bound_policy: StrategyPolicy | None = None,
    client_deadlines: bool = True,
) -> Iterator[tuple[str, LiveRun]]:
    """The arrivals on the fastest, the most accurate, then with the policy, with
    ``admitted_policy`` (default: the policy) and ``admission`` (the routers' table,
    ``policy+adm``), and bound from ``binding`` (the routers' late-binding table, ``binding``;
    with ``bound_policy`` switching beside it, as the operator serves); each run as it ends.
    Without ``client_deadlines`` the admitting and binding runs' requests carry no deadline
    (gated routers give them one)."""
    # The policies start from the fastest eligible member; ``labels`` picks which runs to make.
    first = plan.eligible[0]
    starts = {
        "fastest": 0,
        "accurate": len(plan.thresholds) - 1,
        "policy": first,
        ADMITTED_RUN: first,
        BINDING_RUN: first,
    }
    for label in (label for label in EVERY_RUN if label in labels):
        admitted = label == ADMITTED_RUN
        bound = label == BINDING_RUN
        if admitted and admission is None:
            raise ValueError(f"the {ADMITTED_RUN} run needs the routers' admission table")
        if bound and binding is None:
            raise ValueError(f"the {BINDING_RUN} run needs the routers' late-binding table")
        deciding = {
            "policy": policy,
            ADMITTED_RUN: admitted_policy or policy,
            BINDING_RUN: bound_policy,
        }.get(label)
        loop = None if deciding is None else LiveLoop(deciding, queue, router)
        router.admission = admission if admitted else None
        router.binding = binding if bound else None
        try:
            run = serve(
                router,
                label,
                plan.thresholds[starts[label]].profile.config,
                arrivals_s,
                payload,
                slo_ms,
                loop=loop,
                interval_s=interval_s,
                time_scale=time_scale,
                offered_qps=offered_qps,
                replicas=replicas,
                deadlines=(admitted or bound) and client_deadlines,
            )
        finally:
            router.admission = None
            router.binding = None
        yield label, run
