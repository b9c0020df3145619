"""The live loop (the operator timer's code path) against a real Triton: switch, hold, report."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from ragsim import ACCURATE, FASTEST, TIME_SCALE

from compass.api.paretopolicy import ParetoPolicySpec
from compass.commands.main import main
from compass.conversion import runtime_policy
from compass.dataplane.live import LiveLoop
from compass.dataplane.load import run_load
from compass.dataplane.metrics import PrometheusQueueDepth, TritonQueueDepth
from compass.dataplane.triton import TritonRouter, routing_key
from compass.domain.policy import PolicyState
from compass.domain.space import config_key
from compass_dev.local_triton import LocalTriton, free_port

# rag-sim's 1000 ms SLO at the test time scale.
SLO_MS = 1000 * TIME_SCALE


def _entry(
    data: dict[str, object], config: dict[str, object], accuracy: float
) -> dict[str, object]:
    configs = data["configs"]
    assert isinstance(configs, dict)
    quantiles = np.asarray(configs[json.dumps(config, sort_keys=True)]["latency_quantiles_ms"])
    grid = np.asarray(data["quantile_grid"])
    # The router and BLS add a few ms to every request at this scale: profile what Triton serves.
    overhead_ms = 4.0

    def at(p: float) -> float:
        return float(np.interp(p, grid, quantiles)) * TIME_SCALE + overhead_ms

    return {
        "config": config,
        "accuracy": accuracy,
        "latencyMeanMs": float(quantiles.mean()) * TIME_SCALE + overhead_ms,
        "latencyP50Ms": at(0.5),
        "latencyP95Ms": at(0.95),
        "latencyP99Ms": at(0.99),
    }


@pytest.fixture
def policy(rag_sim_data: dict[str, object]) -> ParetoPolicySpec:
    """rag-sim's fastest and most accurate configurations, SLO 100 ms, 2 s downscale cooldown."""
    return ParetoPolicySpec.model_validate(
        {
            "front": [_entry(rag_sim_data, FASTEST, 0.837), _entry(rag_sim_data, ACCURATE, 0.863)],
            "slo": {"latencyMs": SLO_MS, "percentile": 95},
            "hysteresis": {"downscaleCooldownSeconds": 2, "cooldownExponent": 0},
            "intervalSeconds": 0.2,
        }
    )


def test_loop_starts_from_what_the_router_serves(
    triton: LocalTriton, router: TritonRouter, policy: ParetoPolicySpec
) -> None:
    router.switch(ACCURATE)
    loop = LiveLoop(runtime_policy(policy), TritonQueueDepth(triton.metrics_url), router)
    state = loop.initial_state(time.monotonic())
    assert state.active == runtime_policy(policy).plan.names[1]
    # No load: the first decision keeps the accurate configuration: a restart never flips it.
    result = loop.step(state, time.monotonic())
    assert not result.switched
    assert router.active_config() == config_key(ACCURATE)


def test_the_split_loop_resumes_the_mix_the_routers_serve_and_leaves_it_under_a_burst(
    triton: LocalTriton, router: TritonRouter, policy: ParetoPolicySpec
) -> None:
    """A restarted operator finds the blend and its weight; a queue over the mix's limits moves
    every request to the fastest at once."""
    split = runtime_policy(
        ParetoPolicySpec.model_validate({**policy.model_dump(by_alias=True), "strategy": "split"})
    )
    router.switch(FASTEST, ACCURATE, 0.4)
    loop = LiveLoop(split, TritonQueueDepth(triton.metrics_url), router)
    state = loop.initial_state(time.monotonic())
    names = split.plan.names
    assert (state.active, state.blend, state.weight) == (names[0], names[1], 0.4)
    result = loop.step(state, time.monotonic())
    assert not result.switched
    assert router.active_config() == routing_key(FASTEST, ACCURATE, 0.4)
    # 100 requests in one second: a queue far over the mix's limits.
    burst = threading.Thread(
        target=run_load,
        args=(triton.grpc_url, [i * 0.01 for i in range(100)], lambda i: {"sample": i}),
    )
    burst.start()
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.2)
            result = loop.step(result.state, time.monotonic())
            if result.switched:
                break
    finally:
        burst.join()
    assert result.switched
    assert result.decision.mix.blend is None
    assert router.active_config() == config_key(FASTEST)


def test_loop_degrades_under_a_burst_and_recovers_after_the_cooldown(
    triton: LocalTriton, router: TritonRouter, policy: ParetoPolicySpec
) -> None:
    router.switch(ACCURATE)
    loop = LiveLoop(runtime_policy(policy), TritonQueueDepth(triton.metrics_url), router)
    state = loop.initial_state(time.monotonic())
    results = []
    stop = threading.Event()

    def run_loop() -> None:
        nonlocal state
        while not stop.is_set():
            result = loop.step(state, time.monotonic())
            state = result.state
            results.append((time.monotonic(), result))
            time.sleep(0.2)

    thread = threading.Thread(target=run_loop)
    thread.start()
    try:
        time.sleep(0.5)
        # 100 requests in one second: several times what the accurate configuration can serve.
        records = run_load(triton.grpc_url, [i * 0.01 for i in range(100)], lambda i: {"sample": i})
        deadline = time.monotonic() + 15
        while router.active_config() != config_key(ACCURATE) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join()
    assert not [r for r in records if r.error]
    switches = [r for _, r in results if r.switched]
    assert [s.switch.config for s in switches if s.switch] == [
        config_key(FASTEST),
        config_key(ACCURATE),
    ]
    assert switches[0].observation is not None
    assert switches[0].observation.queue_depth > 0
    # Requests served during the burst moved to the fastest configuration.
    assert config_key(FASTEST) in {r.config for r in records}
    assert router.active_config() == config_key(ACCURATE)


def test_unreachable_triton_holds_the_last_decision_and_says_so(
    triton: LocalTriton, policy: ParetoPolicySpec
) -> None:
    dead = TritonRouter(f"127.0.0.1:{free_port()}", attempts=2, backoff_s=0.01, timeout_s=2)
    loop = LiveLoop(runtime_policy(policy), TritonQueueDepth(triton.metrics_url), dead)
    state = PolicyState(active=runtime_policy(policy).plan.names[1], active_since=0.0)
    # An empty state makes the policy fall back to the fastest: a switch it cannot make.
    result = loop.step(PolicyState(), time.monotonic())
    assert result.decision.switched
    assert not result.switched
    # The state still says what is really active (nothing known), and why it did not move.
    assert result.state.active is None
    assert result.state.switches == 0
    assert "failed" in result.state.last_reason
    assert result.problem is not None
    assert "switch to" in result.problem
    assert "failed" in result.problem
    # With a state, the policy holds and nothing is attempted.
    held = loop.step(state, time.monotonic())
    assert not held.decision.switched
    assert held.state.active == state.active


def test_prometheus_down_means_no_observation_and_the_policy_holds(
    router: TritonRouter, policy: ParetoPolicySpec
) -> None:
    router.switch(ACCURATE)
    source = PrometheusQueueDepth(f"http://127.0.0.1:{free_port()}")
    loop = LiveLoop(runtime_policy(policy), source, router)
    state = loop.initial_state(time.monotonic())
    result = loop.step(state, time.monotonic())
    assert result.observation is None
    assert result.problem is not None
    assert result.problem.startswith("metrics unavailable")
    assert not result.decision.switched
    assert "hold" in result.decision.reason
    assert router.active_config() == config_key(ACCURATE)


def test_compass_serve_runs_the_loop_for_its_duration(
    triton: LocalTriton,
    router: TritonRouter,
    policy: ParetoPolicySpec,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy.model_dump(by_alias=True, mode="json")))
    code = main(
        [
            "serve",
            "--policy",
            str(path),
            "--triton",
            triton.grpc_url,
            "--metrics",
            triton.metrics_url,
            "--duration",
            "1.5",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "compass serve: starting on" in out
    assert "stopped on" in out


@pytest.mark.parametrize(("mode", "served"), [("per-request", ACCURATE), ("workflow", FASTEST)])
def test_compass_serve_gives_the_routers_the_policys_binding_table(
    triton: LocalTriton,
    router: TritonRouter,
    policy: ParetoPolicySpec,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    mode: str,
    served: dict[str, object],
) -> None:
    """Per-request binding (the default): serve's switches carry the binding table, as the
    operator's do, so a request whose deadline leaves ACCURATE time is bound to it while the
    policy routes FASTEST; binding mode workflow sends none, and the routed FASTEST serves it."""
    spec = policy.model_dump(by_alias=True, mode="json")
    # A long cooldown holds the policy on the FASTEST it starts from.
    spec["hysteresis"]["downscaleCooldownSeconds"] = 30
    # No lag cap: at this scale it allows ACCURATE only ~7 ms of delay between take-up and bind,
    # which a busy machine's backend exceeds; the deadline alone is what this test is about.
    spec["binding"] = {"mode": mode, "lagShare": None}
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(spec))
    router.switch(FASTEST)
    arguments = ["--triton", triton.grpc_url, "--metrics", triton.metrics_url]
    assert main(["serve", "--policy", str(path), *arguments, "--duration", "1"]) == 0
    out = capsys.readouterr().out
    assert ("carries the binding table" in out) == (mode == "per-request")
    # The table stays with the routers after serve stops (the fixture's switch takes it back).
    assert router.active_config() == config_key(FASTEST)
    roomy = router.infer({"sample": 0}, deadline_ns=time.time_ns() + 10 * 10**9)
    assert roomy.config == config_key(served)
