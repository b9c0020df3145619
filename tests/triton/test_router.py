"""The router on a real Triton: inference, per-request override, switching under load."""

from __future__ import annotations

import json
import math
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from ragsim import ACCURATE, COMPONENTS, FASTEST, scores_of

from compass.dataplane.load import RequestRecord, run_load
from compass.dataplane.triton import RoutingError, TritonRouter, parse_routing_key, routing_key
from compass.domain.space import config_key
from compass_dev.local_triton import LocalTriton, assemble_repository


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


def test_a_request_that_asks_gets_each_component_models_time(router: TritonRouter) -> None:
    timed = router.infer({"sample": 0}, config=ACCURATE, component_times=True)
    assert timed.component_ms is not None
    assert set(timed.component_ms) == set(COMPONENTS)
    assert all(ms > 0 for ms in timed.component_ms.values())
    # Parts of the request's own time (which adds the router and the network).
    assert sum(timed.component_ms.values()) <= timed.latency_s * 1000
    assert "compass_component_ms" not in timed.result
    assert "score" in timed.result
    # Not asked: none, and the pipeline's result as it always was.
    plain = router.infer({"sample": 0}, config=ACCURATE)
    assert plain.component_ms is None
    assert "compass_component_ms" not in plain.result


def test_override_outside_the_space_fails_that_request_with_the_reason(
    router: TritonRouter,
) -> None:
    invalid = {**ACCURATE, "retriever_k": 3, "reranker_k": 10}
    with pytest.raises(RoutingError, match="reranker_k must be <= retriever_k"):
        router.infer({"sample": 0}, config=invalid)
    assert router.infer({"sample": 0}).config == config_key(FASTEST)


@dataclass
class _Traffic:
    """Open-loop load in one-second rounds; when each request was sent and answered."""

    # perf_counter times, ordered against the switches' by the test.

    sent_at: list[float] = field(default_factory=list)  # by request number
    replied_at: dict[int, float] = field(default_factory=dict)  # by id() of its record
    records: list[RequestRecord] = field(default_factory=list)  # by request number
    failure: BaseException | None = None
    changed: threading.Condition = field(default_factory=threading.Condition)

    def run_until(self, url: str, done: threading.Event) -> None:
        """Rounds of 40 requests at 40 QPS (run_load, one channel each) until ``done``."""
        arrivals = [i * 0.025 for i in range(40)]
        try:
            while not done.is_set():
                records = run_load(url, arrivals, self._payload, on_reply=self._replied)
                self.records.extend(records)  # keeps them, so their id()s stay unique
        except BaseException as error:  # handed to the test's thread
            with self.changed:
                self.failure = error
                self.changed.notify_all()

    def _payload(self, index: int) -> dict[str, int]:
        with self.changed:
            self.sent_at.append(time.perf_counter())  # run_load sends it right after this
        return {"sample": index % 100}

    def _replied(self, record: RequestRecord) -> None:
        with self.changed:
            self.replied_at[id(record)] = time.perf_counter()
            self.changed.notify_all()

    def wait_for_replies(self, sent_after: float, count: int) -> None:
        """Until ``count`` requests sent after ``sent_after`` have their replies."""
        with self.changed:
            earlier = sum(1 for t in self.sent_at if t <= sent_after)
            # Replies come in any order; this many include ``count`` to later requests.
            self.changed.wait_for(
                lambda: self.failure is not None or len(self.replied_at) >= earlier + count,
                timeout=60,  # bounds a hang only: 40 replies a second arrive
            )
            if self.failure is not None:
                raise self.failure
        assert len(self.replied_at) >= earlier + count, "the router stopped answering"


def test_switch_under_concurrent_load_fails_no_request(
    triton: LocalTriton, router: TritonRouter
) -> None:
    """Four switches under open-loop load: no request fails, each is served as switched."""
    # In flight during a switch: served by the old or the new configuration. Sent after a switch
    # returned and answered before the next began: by the new one.
    configs = [FASTEST, ACCURATE, FASTEST, ACCURATE, FASTEST]  # the first serves already
    traffic = _Traffic()
    done = threading.Event()
    load = threading.Thread(target=traffic.run_until, args=(triton.grpc_url, done))
    load.start()
    began: list[float] = []
    returned: list[float] = []
    reports = []
    try:
        traffic.wait_for_replies(sent_after=0.0, count=10)
        for config in configs[1:]:
            began.append(time.perf_counter())
            reports.append(router.switch(config))
            returned.append(time.perf_counter())
            # Requests served in between: each configuration gets traffic before the next.
            traffic.wait_for_replies(sent_after=returned[-1], count=10)
    finally:
        done.set()
        load.join(timeout=120)  # bounds a hang only: a round takes about a second
    assert not load.is_alive()
    assert traffic.failure is None, traffic.failure

    assert [(r.config, r.changed) for r in reports] == [(config_key(c), True) for c in configs[1:]]
    assert len(traffic.records) == len(traffic.sent_at)
    assert [r.error for r in traffic.records if r.error] == []
    requests = [
        (sent, traffic.replied_at[id(record)], record.config)
        for sent, record in zip(traffic.sent_at, traffic.records, strict=True)
    ]
    for k, config in enumerate(configs):
        after = returned[k - 1] if k else 0.0
        before = began[k] if k < len(began) else math.inf
        settled = {c for sent, replied, c in requests if after < sent and replied < before}
        assert settled == {config_key(config)}, f"between switches {k} and {k + 1}: {settled}"
    for k, (start, end) in enumerate(zip(began, returned, strict=True)):
        in_flight = {c for sent, replied, c in requests if sent <= end and replied >= start}
        # A switch takes milliseconds: requests in flight then may be served by either.
        assert in_flight <= {config_key(configs[k]), config_key(configs[k + 1])}, in_flight


def test_switch_is_verified_and_a_refused_switch_keeps_the_old_configuration(
    router: TritonRouter,
) -> None:
    report = router.switch(ACCURATE)
    assert report.config == config_key(ACCURATE) == router.active_config()
    assert router.infer({"sample": 3}).config == config_key(ACCURATE)
    invalid = {**ACCURATE, "retriever_k": 3, "reranker_k": 10}
    router.attempts = 2
    with pytest.raises(RoutingError, match=r"failed after 2 attempts: .*reranker_k must be"):
        router.switch(invalid)
    # Still the last good configuration.
    assert router.active_config() == config_key(ACCURATE)
    assert router.infer({"sample": 3}).config == config_key(ACCURATE)


def _stub_processes(triton: LocalTriton) -> set[int]:
    """PIDs of the server's Python stub processes (a reload would start a new one)."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or int((proc / "stat").read_text().split()[3]) != triton.pid:
                continue
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        if any(arg.endswith(b"/model.py") for arg in argv):
            found.add(int(proc.name))
    return found


def test_a_switch_starts_no_process_and_takes_milliseconds(
    triton: LocalTriton, router: TritonRouter
) -> None:
    """No reload: the same stub processes serve before and after; no-op switches change nothing."""
    before = _stub_processes(triton)
    assert len(before) >= 5  # three components, the router and its control model
    timings = []
    for config in [ACCURATE, FASTEST] * 10:
        report = router.switch(config)
        assert (report.config, report.changed) == (config_key(config), True)
        assert router.infer({"sample": 1}).config == config_key(config)
        timings.append(report.seconds)
    again = router.switch(FASTEST)
    assert (again.config, again.changed) == (config_key(FASTEST), False)
    assert _stub_processes(triton) == before
    # A reload took 150-600 ms here; a control request takes a few. Generous for a busy CI.
    assert sorted(timings)[len(timings) // 2] < 0.1, timings


def test_a_restarted_server_serves_its_default_not_the_last_switch(
    rag_sim_data: dict[str, object], tmp_path: Path
) -> None:
    """The switch state belongs to one server process: a restart starts from the config."""
    repository = assemble_repository(
        "rag-sim",
        tmp_path / "models",
        {
            **{c: {"time_scale": "0"} for c in COMPONENTS},
            "router": {"compass_active_config": json.dumps(FASTEST, sort_keys=True)},
        },
    )
    for run in range(2):
        with LocalTriton(repository=repository).start(tmp_path / f"run{run}") as server:
            client = TritonRouter(server.grpc_url)
            try:
                assert client.active_config() == config_key(FASTEST)
                assert client.infer({"sample": 0}).config == config_key(FASTEST)
                client.switch(ACCURATE)
                assert client.infer({"sample": 0}).config == config_key(ACCURATE)
            finally:
                client.close()


def test_router_response_names_the_configuration_as_canonical_json(router: TritonRouter) -> None:
    reply = router.infer({"sample": 5}, config={**FASTEST, "retriever_k": 20.0})
    assert json.loads(reply.config) == FASTEST
    assert reply.config == config_key(FASTEST)


def test_compass_load_records_every_request_with_its_configuration(
    triton: LocalTriton, router: TritonRouter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from compass.commands.main import main

    output = tmp_path / "records.jsonl"
    started = time.perf_counter()
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
    run_s = time.perf_counter() - started
    assert code == 0
    records = [json.loads(line) for line in output.read_text().splitlines()]
    # The simulator's scenario for the same pattern and seed: the same number of arrivals.
    from compass.domain.arrivals import make_pattern, make_scenario

    expected = make_scenario(make_pattern("spike", 10, 3, seed=4), 4).requests
    assert len(records) == expected
    assert all(r["error"] is None for r in records)
    assert {r["config"] for r in records} == {config_key(FASTEST)}
    # Latencies in seconds, each a part of the command's run (not milliseconds, not garbage).
    assert all(0 < r["latency_s"] <= run_s for r in records), run_s
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


def test_a_blend_serves_its_share_exactly_in_every_twenty_requests(router: TritonRouter) -> None:
    """The split strategy's routing: 30% of the requests to the blend, dealt deterministically."""
    report = router.switch(FASTEST, ACCURATE, 0.3)
    assert report.config == routing_key(FASTEST, ACCURATE, 0.3) == router.active_config()
    served = [router.infer({"sample": s % 50}).config for s in range(40)]
    assert set(served) == {config_key(FASTEST), config_key(ACCURATE)}
    assert served.count(config_key(ACCURATE)) == 12
    for start in range(len(served) - 19):
        assert served[start : start + 20].count(config_key(ACCURATE)) == 6, served
    # The routing key reads back as what was asked.
    assert parse_routing_key(router.active_config()) == (
        config_key(FASTEST),
        config_key(ACCURATE),
        0.3,
    )
    # Weight 0 is the base alone again.
    assert router.switch(FASTEST, ACCURATE, 0.0).config == config_key(FASTEST)
    assert {router.infer({"sample": s}).config for s in range(10)} == {config_key(FASTEST)}


def test_a_weight_off_the_grid_is_taken_down_and_a_bad_one_is_refused(
    router: TritonRouter,
) -> None:
    assert router.switch(FASTEST, ACCURATE, 0.33).config == routing_key(FASTEST, ACCURATE, 0.3)
    reply = router.control({})
    assert (reply["blend"], reply["weight"]) == (config_key(ACCURATE), 0.3)
    router.attempts = 1
    for weight in (1.5, "x"):
        with pytest.raises(RoutingError, match="weight"):
            router.control({"set": FASTEST, "blend": ACCURATE, "weight": weight})
    # Nothing changed.
    assert router.active_config() == routing_key(FASTEST, ACCURATE, 0.3)
    # A blend outside the space is refused like a configuration outside it.
    invalid = {**ACCURATE, "retriever_k": 3, "reranker_k": 10}
    with pytest.raises(RoutingError, match="reranker_k must be"):
        router.switch(FASTEST, invalid, 0.5)
    assert router.active_config() == routing_key(FASTEST, ACCURATE, 0.3)
