"""The router's late binding as a request is served (model-images/router/compass_router/binding.py):
a lazy config that binds what a pipeline reads by compass_rules' decision, the instances' shared
in-flight table and the pending-count poller. (A real tritonserver runs it in
tests/triton/test_router_late_binding.py; the rules themselves: tests/unit/test_rules.py.)"""

from __future__ import annotations

import contextlib
import http.server
import json
import math
import os
import signal
import threading
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compass.domain.binding import (
    QA_REAL_COMPONENTS,
    QA_REAL_STAGE_PARAMS,
    RAG_SIM_COMPONENTS,
    RAG_SIM_SHARES,
    bind_stage,
    router_table,
    stage_plan,
)
from compass.domain.boundpod import ROUTER_POLL_S
from compass.domain.profiles import LatencyProfile, parse_profiles
from compass_dev.router_module import pipeline_module, router_part
from compass_dev.scenarios import QA_REAL_FRONT
from compass_rules.binding import check_binding
from compass_rules.followers import static_schedule

PROFILES = (
    Path(__file__).resolve().parents[2] / "bench/data/compass-paper/planner_latency_profiles.json"
)


@pytest.fixture(scope="module")
def router() -> types.SimpleNamespace:
    """The router's modules beside model.py: its shared table and gate, late binding as a
    request is served, its state files and its poller."""
    return types.SimpleNamespace(
        **{part: router_part(part) for part in ("gate", "binding", "state", "poller")}
    )


@pytest.fixture(scope="module")
def plan() -> Any:
    profiles = parse_profiles(json.loads(PROFILES.read_text(encoding="utf-8")))
    return stage_plan(profiles, quantile=0.95, prior_shares=RAG_SIM_SHARES)


def table(router: types.SimpleNamespace, plan: Any, refuse: bool = False) -> dict[str, Any]:
    """The plan as the control model stores it, checked as the router reads it."""
    sent = json.loads(json.dumps(router_table(plan, RAG_SIM_COMPONENTS, refuse=refuse)))
    checked: dict[str, Any] = check_binding(sent)
    return checked


@pytest.fixture
def inflight(router: types.SimpleNamespace, tmp_path: Path) -> Any:
    return router.gate.Inflight(str(tmp_path / "inflight.bin"))


def rag_sim_pipeline() -> types.ModuleType:
    """rag-sim's pipeline.py as the router runs it."""
    return pipeline_module("rag-sim")


def in_ms(ms: float) -> int:
    return time.time_ns() + round(ms * 1e6)


def test_rag_sims_pipeline_sends_each_component_its_stages_parameters_as_it_reads_them(
    router: types.SimpleNamespace, plan: Any, inflight: Any
) -> None:
    pipeline = rag_sim_pipeline()
    checked = table(router, plan)
    sent: list[dict[str, Any]] = []

    def call(model: str, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        sent.append(json.loads(inputs["CONFIG"].reshape(-1)[0].decode()))
        return {"SCORE": np.array([[1.0]])} if "SCORE" in outputs else {"DONE": np.array([True])}

    most_accurate = dict(max(plan.configs, key=lambda c: c.accuracy).config)
    relaxed = router.binding.LazyConfig(checked, in_ms(60_000), inflight)
    pipeline.run({"sample": 1}, relaxed, call)
    assert json.loads(relaxed.key()) == most_accurate
    # The retriever and reranker get their own parameters, the generator the whole
    # configuration (its score), each read when the pipeline got there.
    assert sent == [
        {"retriever_k": most_accurate["retriever_k"]},
        {n: most_accurate[n] for n in ("reranker_k", "reranker_model")},
        most_accurate,
    ]
    fastest = plan.configs[plan.fastest()]
    # One that waited long for an instance: the fastest, however much time it has left.
    waited = router.binding.LazyConfig(checked, in_ms(60_000), inflight, hurried=True)
    pipeline.run({"sample": 3}, waited, call)
    assert json.loads(waited.key()) == dict(fastest.config)
    # With less left than even the fastest needs, the fastest completion (no refusal asked).
    hurried = router.binding.LazyConfig(checked, in_ms(fastest.total_ms / 2), inflight)
    pipeline.run({"sample": 2}, hurried, call)
    assert json.loads(hurried.key()) == dict(fastest.config)


def test_rag_sims_pipeline_binds_each_stage_on_the_stages_still_ahead_of_it(
    router: types.SimpleNamespace, plan: Any, inflight: Any
) -> None:
    pipeline = rag_sim_pipeline()
    checked = table(router, plan)
    reads: list[int] = []

    def call(model: str, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        reads.append(config.next_stage)
        return {"SCORE": np.array([[1.0]])} if "SCORE" in outputs else {"DONE": np.array([True])}

    # Left: a little under the most accurate configuration's whole time, so it does not fit
    # from the first stage, though its reranker and generator alone would.
    best = max(plan.configs, key=lambda c: c.accuracy)
    left = best.total_ms - best.stage_ms[0] / 2
    config = router.binding.LazyConfig(checked, in_ms(left), inflight)
    # As the router runs it: each call puts the request at its component's stage.
    pipeline.run({"sample": 1}, config, router.binding.staged(call, config, inflight))
    # Each component was called with its own stage bound and the later ones not yet.
    assert reads == [1, 2, 3]
    chosen = json.loads(config.key())
    # What the domain binds stage after stage, each at the stage the request has reached (the
    # calls here take no time).
    bound: dict[str, Any] = {}
    for stage, names in enumerate(plan.stages):
        decided = bind_stage(plan, stage, bound, left, [0.0, 0.0, 0.0], at=stage)
        assert decided.config is not None
        bound |= {n: plan.configs[decided.config].config[n] for n in names}
    assert chosen == bound


def test_a_stage_binds_when_first_read_from_the_work_in_flight_at_its_component(
    router: types.SimpleNamespace, plan: Any, inflight: Any
) -> None:
    checked = table(router, plan)
    # Another router instance (its process alive) has a request at the generator, 400 ms of it.
    other = (inflight.slot + 1) % router.gate.INFLIGHT_SLOTS
    router.gate._SLOT.pack_into(
        inflight.table, other * router.gate._SLOT.size, os.getppid(), 2, time.monotonic_ns(), 400.0
    )
    config = router.binding.LazyConfig(checked, in_ms(900), inflight)
    assert config.bound == {}
    assert "generator_model" in config
    assert config.bound == {}
    retriever_k = config["retriever_k"]
    assert set(config.bound) == {"retriever_k"}
    model = config["generator_model"]
    assert set(config.bound) == set(config)
    # What the domain decides with the same 400 ms ahead at the generator, stage by stage.
    first = bind_stage(plan, 0, {}, 900, [0.0, 0.0, 400.0])
    assert first.config is not None
    assert retriever_k == plan.configs[first.config].config["retriever_k"]
    unhurried = bind_stage(plan, 0, {}, 900, [0.0, 0.0, 0.0])
    assert unhurried.config is not None
    assert plan.configs[unhurried.config].accuracy >= plan.configs[first.config].accuracy
    assert model in {c.config["generator_model"] for c in plan.configs}
    # The instances count what they take up: the pod's rate over the last 2 s.
    before = inflight.dispatched()
    assert inflight.dispatched() == pytest.approx(before + 1 / router.gate.RATE_WINDOW_S)
    # At a request's arrival: one that arrived 3 s ago counts the 2 s before it, not what
    # was taken up since (the requests that arrived after it).
    assert inflight.dispatched(time.time_ns() - 3_000_000_000) == pytest.approx(
        1 / router.gate.RATE_WINDOW_S
    )
    # Its own request at a stage is no backlog to itself; gone, the other's is none either.
    inflight.enter(1, 50.0)
    assert inflight.backlog_ms(3)[1] == 0.0
    router.gate._SLOT.pack_into(inflight.table, other * router.gate._SLOT.size, 0, -1, 0, 0.0)
    assert inflight.backlog_ms(3) == [0.0, 0.0, 0.0]


def test_the_backlog_sums_what_the_other_instances_have_left_at_each_stage(
    router: types.SimpleNamespace, inflight: Any
) -> None:
    now = time.monotonic_ns()
    others = [
        (1, now, 300.0),  # just entered stage 1: all 300 ms ahead
        (1, now - 100_000_000, 150.0),  # 100 ms into 150 at stage 1: about 50 left
        (2, now - 500_000_000, 200.0),  # past its prediction: nothing left
        (-1, now, 900.0),  # at no component
        (5, now, 900.0),  # a stage the pipeline does not have
    ]
    for k, (stage, entered, predicted) in enumerate(others):
        slot = (inflight.slot + 1 + k) % router.gate.INFLIGHT_SLOTS
        router.gate._SLOT.pack_into(
            inflight.table, slot * router.gate._SLOT.size, os.getppid(), stage, entered, predicted
        )
    inflight.enter(0, 700.0)
    backlog = inflight.backlog_ms(3)
    assert backlog[0] == 0.0  # its own request is none
    assert 300.0 < backlog[1] <= 350.0
    assert backlog[2] == 0.0
    assert all(type(ms) is float for ms in backlog)


def test_a_late_request_is_refused_at_its_first_stage_where_the_table_refuses(
    router: types.SimpleNamespace, plan: Any, inflight: Any
) -> None:
    config = router.binding.LazyConfig(table(router, plan, refuse=True), in_ms(-10), inflight)
    with pytest.raises(router.state.LateError):
        config["retriever_k"]
    served = router.binding.LazyConfig(table(router, plan, refuse=False), in_ms(-10), inflight)
    assert json.loads(served.key()) == dict(plan.configs[plan.fastest()].config)


def test_a_configuration_over_its_rate_limit_is_not_bound_however_much_time_is_left(
    router: types.SimpleNamespace, plan: Any, inflight: Any
) -> None:
    fastest = plan.fastest()
    # Every configuration but the fastest is allowed up to 1 request/s of the pod.
    limits = [None if i == fastest else 1.0 for i in range(len(plan.configs))]
    limited = check_binding(
        json.loads(json.dumps(router_table(plan, RAG_SIM_COMPONENTS, max_qps=limits)))
    )
    calm = router.binding.LazyConfig(limited, in_ms(60_000), inflight, inflight.dispatched())
    assert json.loads(calm.key()) != dict(plan.configs[fastest].config)
    for _ in range(4):
        inflight.dispatched()
    # Now 6 requests in the last 2 s: 3/s, over every limit but the fastest's.
    busy = router.binding.LazyConfig(limited, in_ms(60_000), inflight, inflight.dispatched())
    assert json.loads(busy.key()) == dict(plan.configs[fastest].config)


METRICS_PAGE = """# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="router_control",version="1"} 9
nv_inference_pending_request_count{model="router",version="1"} 3
nv_inference_pending_request_count{model="router",version="2"} 1
nv_inference_pending_request_count{model="generator",version="1"} 7
nv_inference_count{model="router",version="1"} 120
"""


def test_the_pending_count_is_read_for_the_router_model_only(router: types.SimpleNamespace) -> None:
    assert router.poller.parse_pending(METRICS_PAGE, "router") == 4
    assert router.poller.parse_pending(METRICS_PAGE, "generator") == 7
    # No sample for the model (an older Triton, another server): no count, not zero.
    assert router.poller.parse_pending(METRICS_PAGE, "reranker") is None
    assert router.poller.parse_pending("", "router") is None


class _Metrics(http.server.BaseHTTPRequestHandler):
    """A metrics page whose pending count the test sets, counting its reads."""

    pending = 0
    reads = 0

    def do_GET(self) -> None:  # http.server's name
        _Metrics.reads += 1
        body = (
            f'nv_inference_pending_request_count{{model="router",version="1"}} {self.pending}\n'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_poller_counts_followers_less_the_take_ups_since_and_none_without_a_page(
    router: types.SimpleNamespace, inflight: Any, tmp_path: Path
) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    taken = [0]
    try:
        _Metrics.pending = 5
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        poller = router.poller.PendingPoller(url, "router", 0.02, lambda: taken[0], inflight)
        deadline = time.monotonic() + 5
        while poller.followers() != 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert poller.followers() == 5
        # Two taken up since the last poll: three still wait (until the next poll says so).
        poller.period_s = 3600.0
        time.sleep(0.05)
        assert poller.poll() == 5
        taken[0] = 2
        assert poller.followers() == 3
        taken[0] = 9
        assert poller.followers() == 0
    finally:
        server.shutdown()
        server.server_close()
    # The metrics port absent: no count, so no followers (the router binds as without it).
    board = router.gate.Inflight(str(tmp_path / "absent.bin"))
    absent = router.poller.PendingPoller(url, "router", 0.02, lambda: 0, board)
    assert absent.poll() is None
    assert absent.followers() == 0


def test_an_idle_poller_reads_the_metrics_page_once_a_second_until_requests_come_again(
    router: types.SimpleNamespace, inflight: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(router.poller, "IDLE_AFTER_S", 0.2)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    taken = [0]
    polls = [0]
    try:
        _Metrics.pending = 1
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        poller = router.poller.PendingPoller(url, "router", 0.02, lambda: taken[0], inflight)
        counted = poller.poll

        def poll() -> Any:
            polls[0] += 1
            return counted()

        poller.poll = poll
        time.sleep(0.6)  # busy 0.2 s (about 10 polls), then idle
        polls[0] = 0
        time.sleep(1.5)
        assert polls[0] <= 3, "idle: at most one look a second"
        taken[0] = 1  # requests again: every period
        time.sleep(1.2)
        assert polls[0] >= 10
    finally:
        server.shutdown()
        server.server_close()


def test_a_pod_polls_once_however_many_instances_and_another_takes_over_when_it_dies(
    router: types.SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(router.poller, "LEADER_RETRY_S", 0.1)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    table, lock = str(tmp_path / "inflight.bin"), str(tmp_path / "inflight.bin.poller")
    _Metrics.pending = 4
    leader = os.fork()
    if leader == 0:  # pragma: no cover - the child: the pod's first instance, polling
        try:
            board = router.gate.Inflight(table)
            router.poller.PendingPoller(
                url, "router", 0.02, board.taken, board=board, lock_path=lock
            )
            time.sleep(60)
        finally:
            os._exit(0)
    try:
        time.sleep(0.5)  # the child holds the lock by now
        board = router.gate.Inflight(table)
        others = [
            router.poller.PendingPoller(
                url, "router", 0.02, board.taken, board=board, lock_path=lock
            )
            for _ in range(3)
        ]
        deadline = time.monotonic() + 5
        while others[0].followers() != 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        # Every instance reads the count the child polled; only the child fetches the page.
        assert [p.followers() for p in others] == [4, 4, 4]
        _Metrics.reads = 0
        time.sleep(1.0)
        assert 5 <= _Metrics.reads <= 60, "one poll every 20 ms, not four"
        os.kill(leader, signal.SIGKILL)
        os.waitpid(leader, 0)
        _Metrics.pending = 7
        deadline = time.monotonic() + 5
        while others[1].followers() != 7 and time.monotonic() < deadline:
            time.sleep(0.01)
        # One of the others took the lock over and polls (the count moved to 7).
        assert [p.followers() for p in others] == [7, 7, 7]
        _Metrics.reads = 0
        time.sleep(1.0)
        assert 5 <= _Metrics.reads <= 60
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(leader, signal.SIGKILL)
            os.waitpid(leader, 0)
        server.shutdown()
        server.server_close()


def test_the_simulator_polls_as_often_as_the_router_image_does(
    router: types.SimpleNamespace,
) -> None:
    assert router.poller.DEFAULT_POLL_MS / 1000 == ROUTER_POLL_S


def qa_real_pipeline() -> types.ModuleType:
    """qa-real's pipeline.py as the router runs it (its data beside it; no Triton)."""
    return pipeline_module("qa-real")


def qa_real_table(router: types.SimpleNamespace) -> Any:
    """qa-real's serving front as a two-stage plan, each stage's time its models' together:
    lexical 50 + 50 ms, MiniLM 50 + 600, hybrid (bm25 and dense) 450 + 1500."""
    calls = (
        {"bm25": 50.0, "reader": 50.0},
        {"bm25": 50.0, "reader": 600.0},
        {"bm25": 150.0, "dense": 300.0, "reader": 1500.0},
    )
    profiles = [
        LatencyProfile(config, accuracy, sum(ms.values()), sum(ms.values()), component_ms=ms)
        for config, accuracy, ms in zip(
            (QA_REAL_FRONT[0], QA_REAL_FRONT[1], QA_REAL_FRONT[3]),
            (0.2, 0.5, 0.6),
            calls,
            strict=True,
        )
    ]
    plan = stage_plan(profiles, QA_REAL_STAGE_PARAMS, components=QA_REAL_COMPONENTS)
    sent = json.loads(json.dumps(router_table(plan, QA_REAL_COMPONENTS)))
    return plan, check_binding(sent)


def test_qa_reals_reader_binds_when_its_request_reaches_it_from_the_reading_in_flight(
    router: types.SimpleNamespace, inflight: Any
) -> None:
    plan, checked = qa_real_table(router)
    assert [c.stage_ms for c in plan.configs] == [(50, 50), (50, 600), (450, 1500)]
    pipeline = qa_real_pipeline()
    reading, retrieving = ((inflight.slot + k) % router.gate.INFLIGHT_SLOTS for k in (1, 2))

    def serve(reading_ms: float) -> tuple[dict[str, Any], set[str]]:
        """One request with 1200 ms left: while it retrieves, another instance's request
        starts reading (``reading_ms`` of it) and a third retrieving (1000 ms)."""
        config = router.binding.LazyConfig(checked, in_ms(1200), inflight)
        bound_at_retrieval: set[str] = set()

        def call(model: str, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
            if model == "reader":
                return {k: np.array([b"x"]) for k in ("ANSWER", "PASSAGE")} | {
                    "SCORE": np.array([1.0])
                }
            bound_at_retrieval.update(config.bound)
            for slot, stage, ms in ((reading, 1, reading_ms), (retrieving, 0, 1000.0)):
                router.gate._SLOT.pack_into(
                    inflight.table, slot * router.gate._SLOT.size, os.getppid(), stage,
                    time.monotonic_ns(), ms,
                )  # fmt: skip
            return {"IDS": np.array([b"p1", b"p2"])}

        pipeline.run({"sample": 0}, config, router.binding.staged(call, config, inflight))
        return json.loads(config.key()), bound_at_retrieval

    # At dispatch nothing is in flight: bm25 with MiniLM fits (hybrid, 1950 ms, does not),
    # and only retrieval's parameters bind; the reader waits for its stage.
    chosen, at_retrieval = serve(300.0)
    assert at_retrieval == {"retriever", "top_k", "rerank"}
    # At the reader, 300 ms of reading ahead: MiniLM's 900 ms fits in ~1200. (Counting the
    # retrieval it has done, and the 1000 ms retrieving behind it, would not.)
    assert chosen == QA_REAL_FRONT[1]
    # 800 ms of reading ahead: MiniLM's 1400 ms does not fit; the lexical reader does.
    chosen, _ = serve(800.0)
    assert chosen == QA_REAL_FRONT[0]


def test_a_stage_that_calls_two_models_counts_what_is_left_of_its_time_in_flight(
    router: types.SimpleNamespace, inflight: Any
) -> None:
    plan, checked = qa_real_table(router)
    pipeline = qa_real_pipeline()
    config = router.binding.LazyConfig(checked, in_ms(60_000), inflight)
    stage_of: dict[str, int] = {}
    predicted: dict[str, float] = {}

    def call(model: str, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        _, stage_of[model], _, predicted[model] = router.gate._SLOT.unpack_from(
            inflight.table, inflight.slot * router.gate._SLOT.size
        )
        if model == "reader":
            return {k: np.array([b"x"]) for k in ("ANSWER", "PASSAGE")} | {"SCORE": np.array([1.0])}
        time.sleep(0.05)
        return {"IDS": np.array([b"p1", b"p2"])}

    pipeline.run({"sample": 0}, config, router.binding.staged(call, config, inflight))
    # Idle with a minute left: hybrid. Its retrieval (450 ms) calls bm25 then dense: the
    # dense call has what bm25's 50 ms left of it; the reader its whole time.
    assert json.loads(config.key()) == QA_REAL_FRONT[3]
    retrieval, reading = plan.configs[2].stage_ms
    assert stage_of == {"bm25": 0, "dense": 0, "reader": 1}
    assert predicted["bm25"] == retrieval
    assert retrieval - 1000 < predicted["dense"] <= retrieval - 50
    assert predicted["reader"] == reading


def test_the_instances_keep_static_fastests_schedule_as_the_domain_does(
    router: types.SimpleNamespace, tmp_path: Path
) -> None:
    """Two instances drawing static fastest's starts in turn, on and off the gate, keep the
    schedule compass_rules.followers.static_schedule keeps (Lindley's recursion)."""
    rng = np.random.default_rng(5)
    path = str(tmp_path / "inflight.bin")
    instances = [router.gate.Inflight(path), router.gate.Inflight(path)]
    fastest_ms, servers = 37.5, 2
    base = 1_700_000_000 * 10**9
    arrivals = np.cumsum(rng.exponential(15, 200))  # ms: a queue builds and drains
    free = -math.inf
    for index, arrival in enumerate(arrivals):
        expected, free = static_schedule(arrival / 1000, free, fastest_ms / 1000 / servers)
        schedule = (base + int(arrival * 1e6), fastest_ms * 1e6, servers)
        instance = instances[index % 2]
        if index % 3:
            start = instance.static_start(*schedule)
        else:
            _, start = instance.queue_at_gate(None, schedule)
            instance.leave_gate()
        assert (start - base) / 1e6 == pytest.approx(expected * 1000, abs=1e-3)
    assert free * 1000 > arrivals[-1] + 1  # the schedule was behind at the end


def test_a_table_of_one_stage_without_components_binds_at_take_up_and_holds_stage_0(
    router: types.SimpleNamespace, tmp_path: Path
) -> None:
    """``components: [[]]``: the request binds when its run starts and is at stage 0, with its
    predicted time, in the in-flight table until the run ends, whatever it calls."""
    whole = check_binding(
        {
            "stages": [["a"]],
            "components": [[]],
            "configs": [
                {"config": '{"a": 0}', "accuracy": 0.7, "stage_ms": [100.0]},
                {"config": '{"a": 1}', "accuracy": 0.9, "stage_ms": [400.0]},
            ],
        }
    )
    inflight = router.gate.Inflight(str(tmp_path / "inflight.bin"))

    def slot() -> tuple[int, float]:
        """This instance's stage and predicted ms in the shared table (what others read)."""
        _, stage, _, predicted = router.gate._SLOT.unpack_from(
            inflight.table, inflight.slot * router.gate._SLOT.size
        )
        return stage, predicted

    config = router.binding.LazyConfig(whole, in_ms(1000), inflight)
    run_call = router.binding.staged(lambda model, inputs, outputs: {}, config, inflight)
    with router.binding.whole_stage(config, inflight):
        # Bound before the pipeline read anything: the most accurate that fits.
        assert dict.__getitem__(config, "a") == 1
        run_call("anything", {}, [])
        assert slot() == (0, 400.0)
    assert slot() == (-1, 0.0)
    assert config.key() == '{"a": 1}'
    # A table with components binds nothing until the pipeline reads it.
    staged_table = check_binding(
        {
            **whole,
            "components": ["m"],
            "configs": [
                {"config": '{"a": 0}', "accuracy": 0.7, "stage_ms": [100.0]},
            ],
        }
    )
    lazy = router.binding.LazyConfig(staged_table, in_ms(1000), inflight)
    with router.binding.whole_stage(lazy, inflight):
        assert dict.__getitem__(lazy, "a") is None
