"""A ParetoPolicy tick's status: a tick whose conditions only change their wording (the
predictive strategy's Ready message quotes a rate that moves with every look) works out no
status between heartbeats, and the heartbeat writes the newest wording."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import kopf
import pytest
from test_policy_scheduler import policy_spec

from compass.controllers import policy_publish
from compass.controllers.policy_compile import compile_policy
from compass.controllers.policy_conditions import Health
from compass.controllers.policy_decisions import NOT_PAUSED, Pause
from compass.controllers.policy_publish import PolicyMemory, publish
from compass.controllers.runtime import Runtime
from compass.domain.policy import Observation

HEARTBEAT_S = 60.0


def test_reworded_conditions_wait_for_the_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = compile_policy(policy_spec("predictive", 120.0, 150.0), 1)
    policy = compiled.policy
    state = policy.initial_state(0.0)
    body: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "generation": 1},
        "status": {},
    }
    written: list[tuple[float, dict[str, Any]]] = []
    worked_out: list[float] = []
    build = policy_publish.build_status

    def write(runtime: Runtime, body: Any, changes: dict[str, Any], *args: Any) -> bool:
        written.append((args[-1], changes))
        return True

    def counted(*args: Any, **kwargs: Any) -> dict[str, Any]:
        worked_out.append(args[2].time)
        return build(*args, **kwargs)

    monkeypatch.setattr(policy_publish, "_write_status", write)
    monkeypatch.setattr(policy_publish, "build_status", counted)
    memory = PolicyMemory(heartbeat_s=HEARTBEAT_S, phase_s=0.0)
    runtime = Runtime()
    logger: Any = kopf.LocalObjectLogger(body=body, settings=kopf.OperatorSettings())
    for second in range(0, 130):
        now = 1_800_000_000.0 + second
        # The decision's wording moves every look; what the conditions say does not.
        decision = f"hold: forecast {second / 100:.2f}/s per pod"
        health = Health(
            metrics_read=True, metrics_source="triton", active=state.active, decision=decision
        )
        observation = Observation(now, 0.0, arrivals_total=1.0)
        previous = memory.status if memory.status is not None else dict(body["status"])
        publish(body, memory, runtime, logger, previous, health,
                 (compiled, state, observation), now, 1)  # fmt: skip
    # The first tick writes the whole status; then one write a heartbeat, none between.
    times = [t - 1_800_000_000.0 for t, _ in written]
    assert times[0] == 0.0
    assert all(b - a >= HEARTBEAT_S - 1 for a, b in pairwise(times))
    assert 2 <= len(times) <= 3
    # Between heartbeats no status is worked out (a tick or two after each write at most).
    assert len(worked_out) <= 3 * len(times)
    # Each heartbeat writes the wording of its own tick, not one merged earlier.
    for when, changes in written[1:]:
        second = int(when - 1_800_000_000.0)
        ready = next(c for c in changes["conditions"] if c["type"] == "Ready")
        assert f"forecast {second / 100:.2f}/s" in ready["message"]


def test_quiet_ticks_gauges_follow_the_queue_and_the_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between heartbeats a tick writes no status, yet its gauges show that tick's queue and
    pause: the gauges a quiet tick reuses are those of the same inputs only."""
    compiled = compile_policy(policy_spec("elastico", 120.0, 150.0), 1)
    state = compiled.policy.initial_state(0.0)
    body: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "generation": 1},
        "status": {},
    }
    monkeypatch.setattr(policy_publish, "_write_status", lambda *args: True)
    memory = PolicyMemory(heartbeat_s=HEARTBEAT_S, phase_s=0.0)
    runtime = Runtime()
    logger: Any = kopf.LocalObjectLogger(body=body, settings=kopf.OperatorSettings())
    labels = {"namespace": "ns", "policy": "p"}
    depths = [0.0, 0.0, 3.0, 3.0, 5.0, 0.0, 0.0]
    for second, depth in enumerate(depths):
        now = 1_800_000_000.0 + second
        paused = second == 5
        health = Health(metrics_read=True, metrics_source="triton", active=state.active,
                        decision="hold", pause=Pause(True, "PausedBySpec") if paused else NOT_PAUSED)  # fmt: skip
        observation = Observation(now, depth, arrivals_total=1.0)
        previous = memory.status if memory.status is not None else dict(body["status"])
        publish(body, memory, runtime, logger, previous, health,
                 (compiled, state, observation), now, 1)  # fmt: skip
        sample = runtime.metrics.registry.get_sample_value
        assert sample("compass_queue_depth", labels) == depth
        assert sample("compass_policy_paused", labels) == float(paused)
