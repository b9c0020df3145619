"""The router on a real Triton: inference, per-request override, switching under load."""

from __future__ import annotations

import itertools
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from ragsim import ACCURATE, FASTEST, scores_of

from compass.dataplane.load import run_load
from compass.dataplane.triton import RoutingError, TritonRouter
from compass.domain.space import config_key
from compass.lab.local_triton import LocalTriton


def test_router_serves_the_active_configuration_and_its_recorded_scores(
    router: TritonRouter, rag_sim_data: dict[str, object]
) -> None:
    expected = scores_of(rag_sim_data, FASTEST)
    replies = [router.infer({"sample": s}) for s in range(20)]
    assert {r.config for r in replies} == {config_key(FASTEST)}
    assert [r.result["score"] for r in replies] == pytest.approx(expected[:20])
    assert router.active_config() == config_key(FASTEST)


def test_per_request_override_serves_that_request_only(
    router: TritonRouter, rag_sim_data: dict[str, object]
) -> None:
    accurate = scores_of(rag_sim_data, ACCURATE)
    overridden = [router.infer({"sample": s}, config=ACCURATE) for s in range(20)]
    assert {r.config for r in overridden} == {config_key(ACCURATE)}
    assert [r.result["score"] for r in overridden] == pytest.approx(accurate[:20])
    # Production traffic never moved.
    assert router.infer({"sample": 0}).config == config_key(FASTEST)
    assert router.active_config() == config_key(FASTEST)


def test_override_outside_the_space_fails_that_request_with_the_reason(
    router: TritonRouter,
) -> None:
    invalid = {**ACCURATE, "retriever_k": 3, "reranker_k": 10}
    with pytest.raises(RoutingError, match="reranker_k must be <= retriever_k"):
        router.infer({"sample": 0}, config=invalid)
    assert router.infer({"sample": 0}).config == config_key(FASTEST)


def test_switch_under_concurrent_load_fails_no_request(
    triton: LocalTriton, router: TritonRouter
) -> None:
    # Open-loop arrivals at ~40 QPS for 4 s while the router switches four times.
    arrivals = [i * 0.025 for i in range(160)]
    reports = []

    def switch_back_and_forth() -> None:
        for config in itertools.islice(itertools.cycle([ACCURATE, FASTEST]), 4):
            time.sleep(0.6)
            reports.append(router.switch(config))

    switcher = threading.Thread(target=switch_back_and_forth)
    switcher.start()
    records = run_load(triton.grpc_url, arrivals, lambda i: {"sample": i % 100})
    switcher.join()
    assert len(records) == len(arrivals)
    assert [r.error for r in records if r.error] == []
    served = {r.config for r in records}
    assert served == {config_key(FASTEST), config_key(ACCURATE)}
    assert [r.config for r in reports] == [config_key(c) for c in (ACCURATE, FASTEST) * 2]
    # The reload alone is well under a second on this CPU.
    assert max(r.seconds for r in reports) < 1.0


def test_switch_is_verified_and_a_refused_switch_keeps_the_old_instance_serving(
    router: TritonRouter,
) -> None:
    report = router.switch(ACCURATE)
    assert report.config == config_key(ACCURATE) == router.active_config()
    assert router.infer({"sample": 3}).config == config_key(ACCURATE)
    invalid = {**ACCURATE, "retriever_k": 3, "reranker_k": 10}
    router.attempts = 2
    with pytest.raises(RoutingError, match=r"failed after 2 attempts: .*reranker_k must be"):
        router.switch(invalid)
    # Still loaded, still the last good configuration.
    assert router.active_config() == config_key(ACCURATE)
    assert router.infer({"sample": 3}).config == config_key(ACCURATE)


def _router_instances(triton: LocalTriton) -> set[int]:
    """PIDs of the router's Python stub processes: a reload starts a new one."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or int((proc / "stat").read_text().split()[3]) != triton.pid:
                continue
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        if any(arg.endswith(b"/router/1/model.py") for arg in argv):
            found.add(int(proc.name))
    return found


def test_switching_to_what_the_router_serves_reloads_nothing(
    triton: LocalTriton, router: TritonRouter
) -> None:
    """No new instance for a switch that changes nothing; a real switch still reloads."""
    router.switch(ACCURATE)
    # The replaced instance's stub takes a moment to exit after a reload.
    deadline = time.monotonic() + 15
    while len(before := _router_instances(triton)) != 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(before) == 1
    again = router.switch(ACCURATE)
    assert (again.config, again.reloaded) == (config_key(ACCURATE), False)
    assert _router_instances(triton) == before
    moved = router.switch(FASTEST)
    assert moved.reloaded
    assert router.infer({"sample": 1}).config == config_key(FASTEST)
    assert _router_instances(triton) - before  # a new instance (the old one may linger)


def test_router_response_names_the_configuration_as_canonical_json(router: TritonRouter) -> None:
    reply = router.infer({"sample": 5}, config={**FASTEST, "retriever_k": 20.0})
    assert json.loads(reply.config) == FASTEST
    assert reply.config == config_key(FASTEST)


def test_compass_load_records_every_request_with_its_configuration(
    triton: LocalTriton, router: TritonRouter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from compass.commands.main import main

    output = tmp_path / "records.jsonl"
    code = main(
        [
            "load",
            "--triton",
            triton.grpc_url,
            "--pattern",
            "spike",
            "--duration",
            "3",
            "--base-qps",
            "10",
            "--seed",
            "4",
            "--slo-ms",
            "500",
            "--output",
            str(output),
        ]
    )
    assert code == 0
    records = [json.loads(line) for line in output.read_text().splitlines()]
    # The simulator's scenario for the same pattern and seed: the same number of arrivals.
    from compass.domain.simulator import make_pattern, make_scenario

    expected = make_scenario(make_pattern("spike", 10, 3, seed=4), 4).requests
    assert len(records) == expected
    assert all(r["error"] is None for r in records)
    assert {r["config"] for r in records} == {config_key(FASTEST)}
    assert all(0 < r["latency_s"] < 5 for r in records)
    out = capsys.readouterr().out
    assert f"requests {expected}, failed 0" in out
    assert "SLO 500 ms" in out


def test_children_forked_while_a_channel_is_busy_do_not_abort(router: TritonRouter) -> None:
    """grpc/grpc#43055: with gRPC's fork support on, ~2% of children forked with preexec_fn
    while RPCs run died with SIGABRT before exec; compass turns the fork support off."""
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            router.infer({"sample": 1})

    workers = [threading.Thread(target=busy) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        codes = [
            subprocess.run(["true"], capture_output=True, preexec_fn=lambda: None).returncode
            for _ in range(200)
        ]
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    assert codes == [0] * 200, f"{sum(1 for c in codes if c)} children died"
